#include "diagnosis/node_progress.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <stdexcept>

namespace ddp::launcher {
namespace {

// To the millisecond, as encode_views writes ages: the gatherer judges decoded views, and the
// progress must say what they say.
double ms(double seconds) { return std::round(seconds * 1000.0) / 1000.0; }

// One communicator's views (every rank's view of it, from one node), as judge_hang's lane
// judgement reads them: only recording ranks count; only running ones wait.
CommunicatorProgress progress_of_lane(std::uint64_t key, const std::vector<RankView>& views) {
  CommunicatorProgress p;
  p.key = key;
  auto wait = [&p](double age) { p.waited_s = std::max(p.waited_s.value_or(ms(age)), ms(age)); };
  for (const RankView& r : views) {
    if (!r.attached) continue;
    if (r.since_finished_s) {
      p.finished_s =
          std::min(p.finished_s.value_or(ms(*r.since_finished_s)), ms(*r.since_finished_s));
    }
    if (!r.running) continue;
    if (r.pending && !r.pending->finished) wait(r.pending->age_s);
    if (r.p2p) wait(r.p2p->age_s);
  }
  return p;
}

void put_ms(std::string& out, const std::optional<double>& seconds) {
  out += seconds ? std::to_string(std::llround(*seconds * 1000.0)) : "-";
}

// A number up to the next separator of text (from pos); moves pos past it.
template <typename T>
T take_number(std::string_view text, std::size_t& pos) {
  T value{};
  const char* begin = text.data() + pos;
  const char* end = text.data() + text.size();
  auto [next, error] = std::from_chars(begin, end, value);
  if (error != std::errc() || next == begin) {
    throw std::invalid_argument("not a node's progress (a number expected at byte " +
                                std::to_string(pos) + "): " + std::string(text));
  }
  pos += static_cast<std::size_t>(next - begin);
  return value;
}

std::optional<double> take_ms(std::string_view text, std::size_t& pos) {
  if (pos < text.size() && text[pos] == '-') {
    ++pos;
    return std::nullopt;
  }
  return static_cast<double>(take_number<long long>(text, pos)) / 1000.0;
}

void expect(std::string_view text, std::size_t& pos, char c) {
  if (pos >= text.size() || text[pos] != c) {
    throw std::invalid_argument(std::string("not a node's progress ('") + c +
                                "' expected at byte " + std::to_string(pos) +
                                "): " + std::string(text));
  }
  ++pos;
}

}  // namespace

NodeProgress progress_of(const std::vector<RankView>& views) {
  NodeProgress progress;
  progress.communicators.push_back(progress_of_lane(0, views));
  for (std::uint64_t key : extra_communicators(views)) {
    progress.communicators.push_back(progress_of_lane(key, communicator_views(views, key)));
  }
  return progress;
}

void age_progress(NodeProgress& progress, double seconds) {
  for (CommunicatorProgress& c : progress.communicators) {
    if (c.finished_s) *c.finished_s += seconds;
    if (c.waited_s) *c.waited_s += seconds;
  }
}

std::string encode_progress(const NodeProgress& progress) {
  std::string out;
  for (const CommunicatorProgress& c : progress.communicators) {
    if (!out.empty()) out += ';';
    out += std::to_string(c.key) + ':';
    put_ms(out, c.finished_s);
    out += ':';
    put_ms(out, c.waited_s);
  }
  return out;
}

NodeProgress decode_progress(std::string_view text) {
  NodeProgress progress;
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (!progress.communicators.empty()) expect(text, pos, ';');
    CommunicatorProgress c;
    c.key = take_number<std::uint64_t>(text, pos);
    expect(text, pos, ':');
    c.finished_s = take_ms(text, pos);
    expect(text, pos, ':');
    c.waited_s = take_ms(text, pos);
    progress.communicators.push_back(c);
  }
  return progress;
}

std::vector<std::uint64_t> hung_communicators(const std::vector<NodeProgress>& nodes,
                                              double hang_timeout_s) {
  struct Judged {
    bool finished_lately = false;  // some rank finished one within the timeout
    bool stuck = false;            // some running rank has waited for the timeout
  };
  std::map<std::uint64_t, Judged> by_key;
  for (const NodeProgress& node : nodes) {
    for (const CommunicatorProgress& c : node.communicators) {
      Judged& j = by_key[c.key];
      if (c.finished_s && *c.finished_s < hang_timeout_s) j.finished_lately = true;
      if (c.waited_s && *c.waited_s >= hang_timeout_s) j.stuck = true;
    }
  }
  std::vector<std::uint64_t> hung;
  for (const auto& [key, j] : by_key) {
    if (j.stuck && !j.finished_lately) hung.push_back(key);
  }
  return hung;
}

}  // namespace ddp::launcher
