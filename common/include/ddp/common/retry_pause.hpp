#pragma once
// Retries against a busy store, shared by the rendezvous's connect and the collective exchange
// (a private, header-only include; not installed): a pause drawn with jitter, so that a thousand
// agents that failed together do not come back together, and how long a store that answers,
// only late, goes unmentioned.

#include <chrono>
#include <random>

namespace ddp {

// A store that answers late (a timeout, not a refusal) is busy: retries against it go
// unmentioned until they have failed this long.
inline constexpr std::chrono::seconds kBusyGrace{5};

// A pause drawn uniformly between half and one and a half of `pause`.
inline std::chrono::milliseconds jittered(std::chrono::milliseconds pause) {
  thread_local std::minstd_rand random{std::random_device{}()};
  std::uniform_int_distribution<long> draw(pause.count() / 2, pause.count() * 3 / 2);
  return std::chrono::milliseconds(draw(random));
}

}  // namespace ddp
