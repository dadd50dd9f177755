#include "ddp/launcher/launch_config.hpp"

namespace ddp::launcher {

bool selects_stdout(Std std) { return std == Std::kOut || std == Std::kAll; }
bool selects_stderr(Std std) { return std == Std::kErr || std == Std::kAll; }

Std StdSpec::for_rank(int local_rank) const {
  if (all) return *all;
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? Std::kNone : it->second;
}

}  // namespace ddp::launcher
