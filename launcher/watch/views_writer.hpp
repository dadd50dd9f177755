#pragma once
// A node's side of sharing its ranks' collective records (collective_exchange.hpp): writes its
// views and their progress (node_progress.hpp) under the round's keys, in one request, when
// they changed in more than their ages (the readers age what they have), with its ranks' step
// history every kStepsEvery while their steps move. The progress says which write last
// changed the views in more than their step history, and how many ranks they hold
// (collective_keys.hpp): a reader that holds those views needs no other. Call from one thread.
// Internal to the launcher.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/elastic/rendezvous.hpp"
#include "ddp/store/client.hpp"
#include "diagnosis/rank_view.hpp"

namespace ddp::launcher {

// A node's ranks' recent steps (for stragglers across nodes) are shared this often; stragglers
// are named at most once a minute anyway.
inline constexpr std::chrono::seconds kStepsEvery{10};

class ViewsWriter {
 public:
  // Writes local (this node's views now) when they changed or their steps are due; says
  // whether it wrote. A new round starts the count again. Throws StoreError.
  bool write(store::Client& client, const elastic::RoundInfo& round,
             const std::vector<RankView>& local);

  // The sequence number last written in the round of the last write (0: none yet).
  std::uint64_t seq() const { return seq_; }

 private:
  int round_ = -1;
  std::uint64_t seq_ = 0;          // the sequence number last written in round_
  std::uint64_t content_seq_ = 0;  // the last that changed content_
  std::string content_;            // what was written, ages and steps aside
  std::string steps_;              // which steps the last step history written held
  std::chrono::steady_clock::time_point steps_sent_at_;
};

}  // namespace ddp::launcher
