// The NCCL entry points when libddp is built without CUDA.
#include "backends.hpp"

namespace ddp::detail {

bool nccl_usable() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<store::Store>, const LaunchEnv& env,
                                                     const InitOptions&, MismatchCheck) {
  throw Unsupported("rank " + std::to_string(env.rank) +
                    ": the NCCL backend was requested but libddp was built without CUDA/NCCL "
                    "(use DDP_BACKEND=gloo)");
}

}  // namespace ddp::detail
