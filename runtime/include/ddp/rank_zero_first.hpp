#pragma once
// Small helpers from the PyTorch playbook: rank 0 first (downloads, caches), per-rank seeds.

#include <cstdint>
#include <functional>

namespace ddp {

class Context;

// Rank 0 runs fn while the others wait (up to context.timeout(): a longer block fails them
// with CommError saying so); then the others run it (rank 0 does not wait for them). If fn throws
// on rank 0, it rethrows there and every other rank throws CommError instead of running fn.
// Collective: every rank must call it.
void rank_zero_first(Context& context, const std::function<void()>& fn);

// A seed for this rank derived from one base seed: different on every rank, reproducible
// run to run (for data augmentation, dropout; parameters come from rank 0 anyway).
std::uint64_t rank_seed(std::uint64_t base_seed, int rank);

}  // namespace ddp
