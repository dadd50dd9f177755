#pragma once
// Where agents share their ranks' collective records in the round's workers' store
// (collective_exchange.hpp). Internal to the launcher.

#include <string>

namespace ddp::launcher {

// A node's views of a round: "<seq>\n<encode_views>", seq counting its writes from 1.
inline std::string views_key(int round, int group_rank) {
  return "ddprun/collectives/" + std::to_string(round) + "/" + std::to_string(group_rank);
}

// A node's progress (node_progress.hpp), written with its views: "<seq> <content seq> <ranks>
// <encode_progress>", the content seq being the last write that changed the views in more
// than their step history (views_writer.hpp), ranks how many views they hold.
inline std::string progress_key(int round, int group_rank) {
  return views_key(round, group_rank) + "/progress";
}

// The gatherer's verdict of a round (JSON); it counts its writes under verdict_count_key.
inline std::string verdict_key(int round) {
  return "ddprun/collectives/" + std::to_string(round) + "/verdict";
}
inline std::string verdict_count_key(int round) { return verdict_key(round) + "/seq"; }

}  // namespace ddp::launcher
