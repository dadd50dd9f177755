// The CUDA trainer's entry points in a build without nvcc.
#include <stdexcept>

#include "cuda_trainer.hpp"

namespace fmnist {

bool cuda_trainer_usable(int, std::string& why) {
  why =
      "this build has no CUDA trainer (it needs the CUDA toolkit with NCCL and nvcc at configure "
      "time, e.g. -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc, and DDP_WITH_CUDA not OFF)";
  return false;
}

int run_cuda_job(const TrainConfig&, ddp::Context&, Dataset) {
  throw std::logic_error("run_cuda_job in a build without the CUDA trainer");
}

}  // namespace fmnist
