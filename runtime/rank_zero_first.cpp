#include "ddp/rank_zero_first.hpp"

#include "ddp/context.hpp"

namespace ddp {

void rank_zero_first(Context& context, const std::function<void()>& fn) {
  // Rank 0 broadcasts whether fn succeeded: a failure there stops the others instead of
  // leaving them at a barrier until it times out.
  std::int32_t ok = 1;
  if (context.rank() == 0) {
    try {
      fn();
    } catch (...) {
      ok = 0;
      context.broadcast(std::span<std::int32_t>(&ok, 1), 0);
      throw;
    }
    context.broadcast(std::span<std::int32_t>(&ok, 1), 0);
    return;
  }
  try {
    context.broadcast(std::span<std::int32_t>(&ok, 1), 0);
  } catch (const CollectiveMismatch&) {
    throw;
  } catch (const CommError& e) {
    throw CommError("rank " + std::to_string(context.rank()) +
                    ": rank_zero_first: waiting (up to " +
                    std::to_string(context.timeout().count()) +
                    " ms, InitOptions::timeout) for rank 0 to finish its block: " + e.what());
  }
  if (ok == 0) {
    throw CommError("rank " + std::to_string(context.rank()) +
                    ": rank_zero_first: the block failed on rank 0, so it was not run here");
  }
  fn();
}

std::uint64_t rank_seed(std::uint64_t base_seed, int rank) {
  std::uint64_t z = base_seed + 0x9e3779b97f4a7c15ull * (static_cast<std::uint64_t>(rank) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace ddp
