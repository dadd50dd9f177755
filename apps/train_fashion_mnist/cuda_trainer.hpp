#pragma once
// The training loop on a GPU: the same job as the CPU loop (data order, initial weights,
// checkpoints, output), with weights, gradients and the data set in device memory, the
// gradients living in the Reducer's device buckets, and no host synchronisation inside a
// step (the loss is read back every few dozen steps, for the progress line).

#include <string>

#include "ddp/context.hpp"
#include "fashion_mnist.hpp"
#include "trainer.hpp"

namespace fmnist {

// True when this build has the CUDA trainer and this node has a CUDA device for each of its
// `ranks_on_node` ranks (one GPU cannot hold two ranks of one NCCL communicator); otherwise
// `why` says what is missing.
bool cuda_trainer_usable(int ranks_on_node, std::string& why);

// Runs the job on the current CUDA device with a ctx whose backend is NCCL. Returns the exit
// code. A failure while training is printed and written to the error file, then ctx is
// aborted before any device memory is freed, and 1 is returned; a failure while setting up
// throws (as the CPU loop does).
int run_cuda_job(const TrainConfig& config, ddp::Context& ctx, Dataset data);

}  // namespace fmnist
