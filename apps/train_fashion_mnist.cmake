# train_fashion_mnist: Fashion-MNIST data-parallel training (libddp + OpenBLAS + zlib).
# The trainer's parts are a library so that tests/train can test them one by one.
find_package(ZLIB REQUIRED)
find_library(OPENBLAS_LIBRARY openblas REQUIRED)
add_library(fmnist_trainer STATIC
  train_fashion_mnist/blas_kernels.cpp
  train_fashion_mnist/checkpoint.cpp
  train_fashion_mnist/error_file.cpp
  train_fashion_mnist/fashion_mnist.cpp
  train_fashion_mnist/mlp.cpp
  train_fashion_mnist/progress.cpp
  train_fashion_mnist/sgd.cpp
  train_fashion_mnist/trainer.cpp)
# The CUDA trainer (--device cuda): cuBLAS and our kernels, built when nvcc is found.
if(DDP_HAVE_CUDA_KERNELS)
  target_sources(fmnist_trainer PRIVATE
    train_fashion_mnist/cuda_kernels.cu
    train_fashion_mnist/cuda_mlp.cpp
    train_fashion_mnist/cuda_sgd.cpp
    train_fashion_mnist/cuda_support.cpp
    train_fashion_mnist/cuda_trainer.cpp)
  target_link_libraries(fmnist_trainer PUBLIC CUDA::cudart CUDA::cublas)
  target_compile_definitions(fmnist_trainer PUBLIC FMNIST_HAVE_CUDA=1)
else()
  target_sources(fmnist_trainer PRIVATE train_fashion_mnist/cuda_unavailable.cpp)
endif()
target_include_directories(fmnist_trainer PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/train_fashion_mnist ${ZLIB_INCLUDE_DIRS})
target_link_libraries(fmnist_trainer PUBLIC ddp::runtime ${ZLIB_LIBRARIES} ${OPENBLAS_LIBRARY}
                      PRIVATE nlohmann_json::nlohmann_json)
ddp_strict(fmnist_trainer)
# The matrix products are BLAS's; the element-wise loops (ReLU, SGD) should vectorise.
target_compile_options(fmnist_trainer PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O3>)

add_executable(train_fashion_mnist train_fashion_mnist/main.cpp)
target_link_libraries(train_fashion_mnist PRIVATE fmnist_trainer CLI11::CLI11)
ddp_strict(train_fashion_mnist)
