#pragma once
// The gatherer's verdict as the agents share it in the round's workers' store
// (collective_exchange.hpp): JSON with who wrote it, whether the job hangs, and then its
// headline, whether a desync, the collective and the ranks to blame as ranges. Internal to the
// launcher.

#include <cstddef>
#include <optional>
#include <string>

#include "diagnosis/collective_diagnosis.hpp"

namespace ddp::launcher {

// A verdict names at most this many ranges of ranks to blame (a line, not the world).
inline constexpr std::size_t kVerdictRanges = 256;

struct SharedVerdict {
  int by = 0;                                    // the group rank of the gatherer that wrote it
  std::optional<CollectiveDiagnosis> diagnosis;  // nullopt: no hang; no rank lines
};

std::string encode_verdict(const SharedVerdict& verdict);
// Throws std::invalid_argument naming what is wrong when text is not a verdict.
SharedVerdict decode_verdict(const std::string& text);

}  // namespace ddp::launcher
