#include "diagnosis/rank_view_json.hpp"

#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace ddp::launcher {
namespace {

using nlohmann::json;

// To the millisecond: "0.4", not "0.40000000000000002".
double ms(double seconds) { return std::round(seconds * 1000.0) / 1000.0; }

json collective_json(const CollectiveInfo& c) {
  json j = {
      {"seq", c.seq},     {"op", c.op},           {"dtype", c.dtype},     {"count", c.count},
      {"bytes", c.bytes}, {"age_s", ms(c.age_s)}, {"started", c.started}, {"finished", c.finished}};
  if (c.failed) j["failed"] = true;
  if (c.bucket) j["bucket"] = *c.bucket;
  return j;
}

CollectiveInfo collective_of(const json& j) {
  CollectiveInfo c;
  c.seq = j.at("seq").get<std::uint64_t>();
  c.op = j.at("op").get<std::string>();
  c.dtype = j.at("dtype").get<std::string>();
  c.count = j.at("count").get<std::uint64_t>();
  c.bytes = j.at("bytes").get<std::uint64_t>();
  c.age_s = j.at("age_s").get<double>();
  c.started = j.at("started").get<bool>();
  c.finished = j.at("finished").get<bool>();
  c.failed = j.value("failed", false);
  if (j.contains("bucket")) c.bucket = j.at("bucket").get<std::uint64_t>();
  return c;
}

// "101 0.250 0.010,102 ...": a rank's recent steps as one string (step, compute and wait
// seconds to the millisecond), much quicker to read than as JSON arrays (a gatherer reads a
// thousand nodes' at the start of a hang).
std::string steps_text(const std::vector<StepInfo>& steps) {
  std::string text;
  char buffer[32];
  auto put = [&](auto value, auto... format) {
    auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value, format...);
    text.append(buffer, error == std::errc() ? end : buffer);
  };
  for (const StepInfo& s : steps) {
    if (!text.empty()) text += ',';
    put(s.step);
    text += ' ';
    put(ms(s.compute_s), std::chars_format::fixed, 3);
    text += ' ';
    put(ms(s.wait_s), std::chars_format::fixed, 3);
  }
  return text;
}

std::vector<StepInfo> steps_of(const std::string& text) {
  std::vector<StepInfo> steps;
  const char* p = text.data();
  const char* end = p + text.size();
  auto take = [&](auto& value, char after) {
    auto [next, error] = std::from_chars(p, end, value);
    if (error != std::errc() || (next != end && *next != after)) {
      throw std::invalid_argument("not a node's collective views: recent steps \"" + text + "\"");
    }
    p = next == end ? end : next + 1;
  };
  while (p < end) {
    StepInfo s;
    take(s.step, ' ');
    take(s.compute_s, ' ');
    take(s.wait_s, ',');
    steps.push_back(s);
  }
  return steps;
}

// Compact: fields at their default are left out (view_of puts the defaults back), times to
// the millisecond, the recent steps only when with_steps (they are most of a view's bytes).
json view_json(const RankView& v, bool with_steps) {
  json j = {{"rank", v.rank},       {"local_rank", v.local_rank}, {"host", v.host},
            {"pid", v.pid},         {"running", v.running},       {"attached", v.attached},
            {"backend", v.backend}, {"queued", v.queued},         {"finished", v.finished}};
  if (!v.exit_text.empty()) j["exit"] = v.exit_text;
  if (v.python) j["python"] = true;
  if (v.nccl_profiler) j["nccl_profiler"] = true;
  if (v.failed) j["failed"] = true;
  if (v.steps > 0) {
    j["steps"] = v.steps;
    j["compute_s"] = ms(v.compute_s_total);
    j["wait_s"] = ms(v.wait_s_total);
  }
  if (v.since_finished_s) j["since_finished_s"] = ms(*v.since_finished_s);
  if (v.timeout_s) j["timeout_s"] = *v.timeout_s;
  if (v.pending) j["pending"] = collective_json(*v.pending);
  if (v.last) j["last"] = collective_json(*v.last);
  if (with_steps && !v.recent_steps.empty()) j["recent_steps"] = steps_text(v.recent_steps);
  if (v.p2p) {
    j["p2p"] = {{"op", v.p2p->op}, {"bytes", v.p2p->bytes}, {"age_s", ms(v.p2p->age_s)}};
    if (v.p2p->peer) j["p2p"]["peer"] = *v.p2p->peer;
  }
  if (v.unrecorded > 0) j["unrecorded"] = v.unrecorded;
  if (v.lane != 0) j["lane"] = v.lane;
  if (v.context != 0) j["context"] = v.context;
  if (!v.lanes.empty()) {
    json lanes = json::array();
    for (const RankView& l : v.lanes) lanes.push_back(view_json(l, with_steps));
    j["lanes"] = std::move(lanes);
  }
  return j;
}

}  // namespace

std::string encode_views(const std::vector<RankView>& views, bool with_steps) {
  json out = json::array();
  for (const RankView& v : views) out.push_back(view_json(v, with_steps));
  return out.dump();
}

namespace {

RankView view_of(const json& j) {
  RankView v;
  v.rank = j.at("rank").get<int>();
  v.local_rank = j.at("local_rank").get<int>();
  v.host = j.at("host").get<std::string>();
  v.pid = j.at("pid").get<pid_t>();
  v.running = j.at("running").get<bool>();
  v.exit_text = j.value("exit", "");
  v.attached = j.at("attached").get<bool>();
  v.python = j.value("python", false);
  v.nccl_profiler = j.value("nccl_profiler", false);
  v.backend = j.at("backend").get<std::string>();
  v.queued = j.at("queued").get<std::uint64_t>();
  v.finished = j.at("finished").get<std::uint64_t>();
  v.failed = j.value("failed", false);
  v.steps = j.value("steps", std::uint64_t{0});
  v.compute_s_total = j.value("compute_s", 0.0);
  v.wait_s_total = j.value("wait_s", 0.0);
  if (j.contains("since_finished_s")) v.since_finished_s = j["since_finished_s"].get<double>();
  if (j.contains("timeout_s")) v.timeout_s = j["timeout_s"].get<double>();
  if (j.contains("pending")) v.pending = collective_of(j["pending"]);
  if (j.contains("last")) v.last = collective_of(j["last"]);
  if (j.contains("recent_steps")) v.recent_steps = steps_of(j["recent_steps"].get<std::string>());
  if (j.contains("p2p")) {
    const json& w = j["p2p"];
    P2pWait wait;
    wait.op = w.at("op").get<std::string>();
    wait.bytes = w.at("bytes").get<std::uint64_t>();
    wait.age_s = w.at("age_s").get<double>();
    if (w.contains("peer")) wait.peer = w["peer"].get<std::uint64_t>();
    v.p2p = wait;
  }
  v.unrecorded = j.value("unrecorded", std::uint64_t{0});
  v.lane = j.value("lane", 0);
  v.context = j.value("context", std::uint64_t{0});
  if (j.contains("lanes")) {
    for (const json& l : j["lanes"]) v.lanes.push_back(view_of(l));
  }
  return v;
}

}  // namespace

std::vector<RankView> decode_views(const std::string& text) {
  try {
    std::vector<RankView> views;
    for (const json& j : json::parse(text)) views.push_back(view_of(j));
    return views;
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("not a node's collective views: ") + e.what());
  }
}

void age_views(std::vector<RankView>& views, double seconds) {
  for (RankView& v : views) age_view(v, seconds);
}

void age_view(RankView& v, double seconds) {
  if (v.since_finished_s) *v.since_finished_s += seconds;
  if (v.pending) v.pending->age_s += seconds;
  if (v.last) v.last->age_s += seconds;
  if (v.p2p) v.p2p->age_s += seconds;
  age_views(v.lanes, seconds);
}

}  // namespace ddp::launcher
