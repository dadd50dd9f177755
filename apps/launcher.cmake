# ddprun and its sample workers
add_executable(ddprun ddprun.cpp)
target_link_libraries(ddprun PRIVATE ddp::launcher)
# The NCCL profiler plugin ddprun hands its workers is built with it (build/lib), and so is the
# Python probe's native wrapper where Python's headers are (build/share/ddprun/python).
add_dependencies(ddprun ddprun_nccl_profiler)
if(TARGET ddprun_around)
  add_dependencies(ddprun ddprun_around)
endif()
# Start-up time: the dynamic loader's symbol look-ups and relocations in libstdc++ are a few
# milliseconds of every launch on a small machine (docs/benchmarks.md, Launch time). ddprun
# loads no C++ library at run time (device_count.cpp dlopens C libraries only), so linking the
# GCC runtime in is safe. Not under the sanitizers, whose runtimes expect the shared one.
if(NOT DDP_SANITIZE)
  target_link_options(ddprun PRIVATE "$<$<LINK_LANGUAGE:CXX>:-static-libstdc++;-static-libgcc>")
endif()
# The relative relocations of a position-independent ddprun (tens of thousands, most of them
# OpenSSL's tables) in the compact DT_RELR form: the loader applies them faster (glibc 2.36+;
# cmake/DdpSysroot.cmake turns it off for the packages, which target glibc 2.31).
include(CheckLinkerFlag)
check_linker_flag(CXX "LINKER:-z,pack-relative-relocs" DDP_LINKER_PACKS_RELATIVE_RELOCS)
if(DDP_LINKER_PACKS_RELATIVE_RELOCS)
  target_link_options(ddprun PRIVATE "LINKER:-z,pack-relative-relocs")
endif()
ddp_strict(ddprun)

# A worker for tests and the demo: dumps its environment, prints, fails, waits for signals.
add_executable(ddp-sample-worker ddp_sample_worker.cpp)
target_link_libraries(ddp-sample-worker PRIVATE ddp::store nlohmann_json::nlohmann_json)
ddp_strict(ddp-sample-worker)
