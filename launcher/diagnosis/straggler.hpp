#pragma once
// Stragglers: a rank whose gradients are ready later than the median rank's, step after step.
// From the Reducer steps in the ranks' records (compute time of a step: from the previous
// step's finalize() to its last bucket ready; every rank starts a step at about the same
// moment, when the last all-reduce of the one before ends). Pure logic. Internal to the
// launcher.

#include <optional>
#include <string>
#include <vector>

#include "diagnosis/rank_view.hpp"

namespace ddp::launcher {

struct StragglerOptions {
  int window = 20;             // --straggler_window: the last N steps every rank finished
  double threshold_s = 0.005;  // --straggler_threshold: lateness that counts (at least
                               // 20 % of the median's compute time too)
};

struct Straggler {
  int rank = -1;
  std::string who;     // "rank 3 (host node-a, pid 4242)"
  int late_steps = 0;  // of the window
  int window = 0;
  double late_by_s = 0;         // mean over its late steps
  double compute_s = 0;         // its mean compute time over the window
  double median_s = 0;          // the median rank's mean compute time over the window
  std::uint64_t last_step = 0;  // the newest step of the window

  // "rank 3 (host h, pid 4242) is a straggler: its gradients were ready 20.3 ms after the
  //  median rank's in 18 of the last 20 steps (compute 25.1 ms a step against 4.8 ms), as of
  //  step 37"
  std::string text() const;
};

// The rank late in most of the last window steps, if any (needs window steps from every
// recording rank, and at least 3 ranks... or 2, where the slower of two is late against
// the faster).
std::optional<Straggler> find_straggler(const std::vector<RankView>& ranks,
                                        const StragglerOptions& options);

// The end-of-job summary: per rank, compute and wait time in Reducer steps. Empty when no
// rank recorded a step.
std::string step_summary(std::vector<RankView> ranks);

}  // namespace ddp::launcher
