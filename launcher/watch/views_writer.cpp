#include "watch/views_writer.hpp"

#include "diagnosis/node_progress.hpp"
#include "diagnosis/rank_view_json.hpp"
#include "watch/collective_keys.hpp"

namespace ddp::launcher {
namespace {

// What a node's views say, ages aside: while only their ages change, nothing is written (the
// others age what they have).
void zero_ages(std::vector<RankView>& views) {
  for (RankView& v : views) {
    if (v.since_finished_s) v.since_finished_s = 0.0;
    if (v.pending) v.pending->age_s = 0;
    if (v.last) v.last->age_s = 0;
    if (v.p2p) v.p2p->age_s = 0;
    zero_ages(v.lanes);
  }
}

std::string content_of(std::vector<RankView> views) {
  zero_ages(views);
  return encode_views(views, false);
}

// The newest step of each rank's history (and of its other communicators'): a history that
// did not move (a hang, a job without Reducer steps) is not sent again.
void add_steps_mark(const std::vector<RankView>& views, std::string& mark) {
  for (const RankView& v : views) {
    mark += std::to_string(v.rank) + ':' +
            (v.recent_steps.empty() ? "-" : std::to_string(v.recent_steps.back().step)) + ' ';
    add_steps_mark(v.lanes, mark);
  }
}

}  // namespace

bool ViewsWriter::write(store::Client& client, const elastic::RoundInfo& round,
                        const std::vector<RankView>& local) {
  if (round_ != round.round) {  // a new round: everything counts from the start
    round_ = round.round;
    seq_ = 0;
    content_seq_ = 0;
    content_.clear();
    steps_.clear();
  }
  const auto now = std::chrono::steady_clock::now();
  std::string steps;
  add_steps_mark(local, steps);
  const bool steps_due = seq_ == 0 || (now - steps_sent_at_ >= kStepsEvery && steps != steps_);
  std::string content = content_of(local);
  if (!steps_due && content == content_) return false;
  if (content != content_) content_seq_ = seq_ + 1;
  const std::string seq = std::to_string(seq_ + 1);
  // The views first, then the progress that tells the gatherer to read them (one request;
  // 1.x: two SETs in this order): a progress it reads always has its views in the store.
  client.multi_set(
      {views_key(round.round, round.group_rank), progress_key(round.round, round.group_rank)},
      {seq + "\n" + encode_views(local, steps_due), seq + " " + std::to_string(content_seq_) + " " +
                                                        std::to_string(local.size()) + " " +
                                                        encode_progress(progress_of(local))});
  ++seq_;
  content_ = std::move(content);
  if (steps_due) {
    steps_sent_at_ = now;
    steps_ = std::move(steps);
  }
  return true;
}

}  // namespace ddp::launcher
