# Detects the CUDA toolkit and NCCL. CUDA is optional: with DDP_WITH_CUDA=AUTO the build
# uses it when both are found and works without them otherwise.
#   DDP_HAVE_CUDA          the CUDA runtime and NCCL are linked (the NCCL backend)
#   DDP_HAVE_CUDA_KERNELS  nvcc was found too: CUDA is an enabled language, and libddp's
#                          16-bit compression kernels and the CUDA trainer are built
# nvcc sits in the toolkit's bin/, usually not on PATH: we look there ourselves.
set(DDP_HAVE_CUDA OFF)
set(DDP_HAVE_CUDA_KERNELS OFF)
if(NOT DDP_WITH_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(DDP_HAVE_CUDA ON)
    add_library(ddp_nccl INTERFACE)
    target_include_directories(ddp_nccl SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(ddp_nccl INTERFACE ${NCCL_LIBRARY} CUDA::cudart)
    message(STATUS "ddp: CUDA ${CUDAToolkit_VERSION} and NCCL found: NCCL backend enabled")
  elseif(DDP_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DDP_WITH_CUDA=ON but the CUDA toolkit or NCCL was not found")
  else()
    message(STATUS "ddp: CUDA or NCCL not found: building without the NCCL backend")
  endif()
endif()

if(DDP_HAVE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND CUDAToolkit_NVCC_EXECUTABLE
     AND EXISTS "${CUDAToolkit_NVCC_EXECUTABLE}")
    set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Machine code for the GPUs clusters have: A100 (sm_80), A10/A40/RTX 30 (sm_86), L4/L40/
    # RTX 40 (sm_89), H100/H200 (sm_90), plus compute_90 PTX that newer GPUs (Blackwell)
    # compile when the program loads. PTX runs only on GPUs at least as new as its
    # architecture, so without sm_80..sm_89 code the kernels would not load before Hopper.
    # A cache variable: -DCMAKE_CUDA_ARCHITECTURES=90 (one GPU, a shorter build) or `native`
    # overrides it. docs/install.md has what the default costs in build time.
    set(CMAKE_CUDA_ARCHITECTURES "80-real;86-real;89-real;90-real;90-virtual"
        CACHE STRING "CUDA architectures to build the kernels for (docs/install.md)")
    # The shared CUDA runtime, as CUDA::cudart (NCCL's link) is: with CMake's default (the
    # static one) for targets with .cu files, a program would carry two CUDA runtimes.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(DDP_HAVE_CUDA_KERNELS ON)
    message(STATUS "ddp: nvcc ${CMAKE_CUDA_COMPILER_VERSION} found: CUDA kernels enabled "
                   "(architectures ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(DDP_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DDP_WITH_CUDA=ON but no CUDA compiler (nvcc) was found: set "
                        "CMAKE_CUDA_COMPILER=/path/to/nvcc")
  else()
    message(STATUS "ddp: no nvcc: the NCCL backend is built without its CUDA kernels "
                   "(no 16-bit compression on NCCL, no CUDA trainer)")
  endif()
endif()
