#pragma once
// libddp: the umbrella header for worker programs.
//
//   ddp::Context ctx = ddp::init();          // rank, world, store, communicator
//   ctx.allreduce(std::span<float>(v), ddp::ReduceOp::Sum);
//
// See docs/runtime.md for a complete training loop with ddp::Reducer.

#include "ddp/communicator.hpp"
#include "ddp/context.hpp"
#include "ddp/distributed_sampler.hpp"
#include "ddp/half.hpp"
#include "ddp/inplace.hpp"
#include "ddp/launch_env.hpp"
#include "ddp/logger.hpp"
#include "ddp/rank_zero_first.hpp"
#include "ddp/reducer.hpp"
#include "ddp/types.hpp"
#include "ddp/work.hpp"
