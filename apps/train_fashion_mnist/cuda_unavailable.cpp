// The CUDA trainer's entry points in a build without nvcc.
#include <stdexcept>

#include "cuda_trainer.hpp"

namespace fmnist {

bool cuda_trainer_usable(int, std::string& why) {
  why =
      "this build has no CUDA trainer (configure with the CUDA toolkit's nvcc: "
      "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)";
  return false;
}

int run_cuda_job(const TrainConfig&, ddp::Context&, Dataset) {
  throw std::logic_error("run_cuda_job in a build without the CUDA trainer");
}

}  // namespace fmnist
