#include "watch/hang_monitor.hpp"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <fstream>
#include <future>

#include "diagnosis/nccl_ras.hpp"
#include "diagnosis/stack_capture.hpp"

namespace ddp::launcher {
namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::error_code ignored;
  fs::create_directories(path.parent_path(), ignored);
  std::ofstream(path) << text;
}

// The rank the report's root cause names: the first to blame, else the first that waits.
const RankView& root_rank(const CollectiveDiagnosis& diagnosis,
                          const std::vector<RankView>& views) {
  for (int rank : diagnosis.blamed) {
    auto it =
        std::find_if(views.begin(), views.end(), [&](const RankView& v) { return v.rank == rank; });
    if (it != views.end()) return *it;
  }
  auto waiting = std::find_if(views.begin(), views.end(), [](const RankView& v) {
    return v.pending.has_value() && !v.pending->finished;
  });
  return waiting != views.end() ? *waiting : views.front();
}

}  // namespace

HangAction decide_hang(const CollectiveDiagnosis& diagnosis, const std::vector<RankView>& views,
                       std::optional<std::chrono::milliseconds> stop_after) {
  // Records that only NCCL's profiler plugin wrote (a program without libddp or the probe):
  // its collectives end with NCCL's kernel events, which no GPU of ours has checked yet, so
  // its verdicts warn and never stop a job, unless --hang_stop_timeout asks for stops.
  const bool profiler_only =
      std::any_of(views.begin(), views.end(), [](const RankView& v) { return v.attached; }) &&
      std::all_of(views.begin(), views.end(),
                  [](const RankView& v) { return !v.attached || v.nccl_profiler; });
  if (profiler_only && !stop_after) {
    return {false,
            "ddprun only warns: these records come from its NCCL profiler plugin, whose "
            "verdicts do not stop a job yet; give --hang_stop_timeout to have it stop one"};
  }
  if (diagnosis.desync) {
    return {true,
            "ddprun stops the job now: its ranks called the collective differently, so it "
            "can never finish"};
  }
  for (int rank : diagnosis.blamed) {
    for (const RankView& view : views) {
      if (view.rank == rank && !view.running) {
        return {true, "ddprun stops the job now: " + rank_who(view) +
                          ", which the others wait for, has exited (" + view.exit_text + ")"};
      }
    }
  }
  double limit_s = 0;
  std::string limit_from = "--hang_stop_timeout";
  if (stop_after) {
    limit_s = static_cast<double>(stop_after->count()) / 1000.0;
  } else {
    for (const RankView& view : views) limit_s = std::max(limit_s, view.timeout_s.value_or(0.0));
    limit_from = "the job's own collective timeout";
    if (limit_s == 0) {
      limit_s = std::chrono::duration<double>(kDefaultCollectiveTimeout).count();
      limit_from = "ddprun's default, as no rank said its collective timeout";
    }
  }
  double waited = 0;
  for (const RankView& view : views) {
    if (view.running && view.pending && !view.pending->finished) {
      waited = std::max(waited, view.pending->age_s);
    }
    if (view.running && view.p2p) waited = std::max(waited, view.p2p->age_s);
  }
  if (waited >= limit_s) {
    return {true, "ddprun stops the job now: the ranks have waited " + duration_text(waited) +
                      ", past " + duration_text(limit_s) + " (" + limit_from + ")"};
  }
  return {false,
          "ddprun lets the job run: it stops it if a rank the others wait for exits, or "
          "once they have waited " +
              duration_text(limit_s) + " (" + limit_from +
              "; --hang_stop_timeout sets another), and says this again in a minute "
              "if the hang holds"};
}

std::string hang_report(const CollectiveDiagnosis& diagnosis, const std::string& stacks,
                        const std::string& nccl_ras) {
  std::string text = diagnosis.headline + "\n";
  for (const std::string& line : diagnosis.ranks) text += "  " + line + "\n";
  if (!stacks.empty()) text += stacks;
  if (!nccl_ras.empty()) text += nccl_ras + "\n";
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

namespace {

// The line when a hang reported above is over: the job moves again, unless what ended it was
// a collective that failed (Gloo's timeout, a lost peer), which moved nothing.
std::string hang_ended(const std::vector<RankView>& views) {
  std::string failed;
  for (const RankView& view : views) {
    if (view.failed) failed += (failed.empty() ? "" : ", ") + std::to_string(view.rank);
  }
  if (failed.empty()) {
    return "ddprun: the job moves again: a collective finished since the hang above";
  }
  const bool several = failed.find(',') != std::string::npos;
  return "ddprun: the hang above ended in a failed collective (" +
         std::string(several ? "ranks " : "rank ") + failed + ")";
}

}  // namespace

HangMonitor::HangMonitor(boost::asio::io_context& io, HangMonitorOptions options)
    : options_(std::move(options)), timer_(io) {}

HangMonitor::~HangMonitor() {
  timer_.cancel();
  if (reporter_.joinable()) reporter_.join();
}

std::chrono::milliseconds HangMonitor::tick() const {
  if (options_.hang_timeout.count() == 0) return std::chrono::milliseconds(500);
  return std::clamp(options_.hang_timeout / 4, std::chrono::milliseconds(100),
                    std::chrono::milliseconds(500));
}

void HangMonitor::start() {
  if (options_.hang_timeout.count() > 0 || options_.straggler.window > 0) schedule();
}

void HangMonitor::schedule() {
  timer_.expires_after(tick());
  timer_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    check();
    schedule();
  });
}

void HangMonitor::check() {
  const int round = options_.round();
  if (round < 0 || round == stopped_round_) return;  // not running, or being stopped
  std::vector<RankView> views = options_.views();
  check_straggler(views);
  if (options_.hang_timeout.count() == 0) return;
  sample_activity(views);
  const double timeout_s = static_cast<double>(options_.hang_timeout.count()) / 1000.0;
  auto diagnosis = options_.judge ? options_.judge(views, timeout_s) : judge_hang(views, timeout_s);
  if (!diagnosis) {
    if (hang_round_ == round) {
      hang_round_ = -1;
      options_.notice(hang_ended(views));
    }
    return;
  }
  if (reporting_) return;
  HangAction action = decide_hang(*diagnosis, views, options_.stop_after);
  const auto now = std::chrono::steady_clock::now();
  if (!action.stop && hang_round_ == round && now - reported_at_ < kHangRepeat) return;
  hang_round_ = round;
  reported_at_ = now;
  if (action.stop) stopped_round_ = round;
  reporting_ = true;
  std::string evidence = activity_lines(*diagnosis, views);
  const bool python = std::any_of(views.begin(), views.end(), [](const RankView& v) {
    return !v.remote && v.running && v.python;
  });
  auto then = [this, round, d = std::move(*diagnosis), views = std::move(views),
               dir = options_.attempt_dir(), action = std::move(action),
               evidence = std::move(evidence)](std::vector<PythonStack> python) mutable {
    if (reporter_.joinable()) reporter_.join();  // the last report's, done
    reporter_ = std::thread([this, round, d = std::move(d), views = std::move(views), dir,
                             action = std::move(action), evidence = std::move(evidence),
                             python = std::move(python)]() mutable {
      report(round, std::move(d), std::move(views), dir, std::move(action), std::move(evidence),
             std::move(python));
    });
  };
  if (python && options_.python_stacks) return options_.python_stacks(std::move(then));
  then({});
}

void HangMonitor::sample_activity(const std::vector<RankView>& views) {
  const auto now = std::chrono::steady_clock::now();
  std::map<pid_t, std::deque<ActivitySample>> kept;
  for (const RankView& view : views) {
    if (view.remote || !view.running || view.pid <= 0) continue;
    auto& samples = kept[view.pid];
    if (auto old = activity_.find(view.pid); old != activity_.end())
      samples = std::move(old->second);
    if (auto activity = read_activity(view.pid)) samples.push_back({now, *activity});
    // The oldest sample kept is the newest one at least hang_timeout old.
    while (samples.size() > 1 && now - samples[1].time >= options_.hang_timeout) {
      samples.pop_front();
    }
  }
  activity_ = std::move(kept);
}

std::string HangMonitor::activity_lines(const CollectiveDiagnosis& diagnosis,
                                        const std::vector<RankView>& views) const {
  std::string lines;
  for (int rank : diagnosis.blamed) {
    for (const RankView& view : views) {
      if (view.rank != rank || view.remote || !view.running) continue;
      const auto samples = activity_.find(view.pid);
      if (samples == activity_.end() || samples->second.size() < 2) continue;
      const ActivitySample& first = samples->second.front();
      const ActivitySample& last = samples->second.back();
      const double window = std::chrono::duration<double>(last.time - first.time).count();
      lines +=
          "  " + rank_who(view) + " " + activity_text(first.activity, last.activity, window) + "\n";
    }
  }
  return lines;
}

void HangMonitor::report(int round, CollectiveDiagnosis diagnosis, std::vector<RankView> views,
                         const fs::path& dir, HangAction action, std::string evidence,
                         std::vector<PythonStack> python_stacks) {
  std::vector<RankStack> targets;  // native stacks of the ranks without the Python probe
  for (const RankView& view : views) {
    if (!view.remote && view.running && view.pid > 0 && !view.python) {
      targets.push_back({view.rank, view.pid, "", ""});
    }
  }
  // NCCL's own view, asked while the stacks are taken.
  const bool nccl = std::any_of(views.begin(), views.end(),
                                [](const RankView& v) { return !v.remote && v.backend == "nccl"; });
  std::future<std::string> ras;
  if (nccl || !options_.ras_address.empty()) {
    const std::string address =
        options_.ras_address.empty() ? kNcclRasDefaultAddress : options_.ras_address;
    ras = std::async(std::launch::async, [address] {
      const NcclRasStatus status = query_nccl_ras(address);
      if (!status.answered) {
        return "NCCL's RAS service at " + address + " did not answer: " + status.error +
               " (NCCL 2.24+ runs it unless NCCL_RAS_ENABLE=0)";
      }
      std::string report = status.report;
      while (!report.empty() && report.back() == '\n') report.pop_back();
      return "NCCL's RAS service (" + address + ") says:\n" + indent_lines(report);
    });
  }
  const std::vector<RankStack> stacks =
      targets.empty() ? std::vector<RankStack>{} : capture_stacks(std::move(targets));
  std::string nccl_ras = ras.valid() ? ras.get() : "";
  while (!nccl_ras.empty() && nccl_ras.back() == '\n') nccl_ras.pop_back();
  for (const RankStack& stack : stacks) {
    auto view = std::find_if(views.begin(), views.end(),
                             [&](const RankView& v) { return v.rank == stack.rank; });
    write_text(dir / std::to_string(view->local_rank) / "stack.txt",
               stack.error.empty() ? stack.stack : stack.error + "\n");
  }
  for (const PythonStack& stack : python_stacks) {
    if (!stack.dump.empty()) {
      write_text(dir / std::to_string(stack.local_rank) / "python_stack.txt", stack.dump);
    }
  }
  std::string where;
  if (!evidence.empty()) where += "what each rank to blame did meanwhile:\n" + evidence;
  if (!python_stacks.empty()) {
    where += "where each Python worker is (ddprun's Python probe):\n" +
             indent_lines(group_python_stacks(python_stacks));
  }
  if (!stacks.empty())
    where += "where each worker was (eu-stack):\n" + indent_lines(group_stacks(stacks));
  const std::string text = hang_report(diagnosis, where, nccl_ras) + "\n" + action.text;
  write_text(dir / "hang.txt", text + "\n");
  if (!action.stop) {
    boost::asio::post(timer_.get_executor(), [this, text] {
      reporting_ = false;
      options_.notice("ddprun: warning: " + text);
    });
    return;
  }

  const RankView& root = root_rank(diagnosis, views);
  WorkerFailure failure;
  failure.time = std::chrono::system_clock::now();
  failure.host = root.host;
  failure.rank = root.rank;
  failure.local_rank = root.local_rank;
  failure.pid = root.pid;
  failure.exit_code = 1;
  failure.hung = true;
  failure.blamed = std::find(diagnosis.blamed.begin(), diagnosis.blamed.end(), root.rank) !=
                   diagnosis.blamed.end();
  failure.error_file = (dir / "hang.txt").string();
  failure.error = ErrorFileContent{diagnosis.headline, text};
  options_.on_hung(round, std::move(failure));
  boost::asio::post(timer_.get_executor(), [this] { reporting_ = false; });
}

void HangMonitor::check_straggler(const std::vector<RankView>& views) {
  if (options_.straggler.window <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (straggler_said_ && now - *straggler_said_ < kStragglerQuiet) return;
  if (auto straggler = find_straggler(views, options_.straggler)) {
    straggler_said_ = now;
    options_.notice("ddprun: " + straggler->text());
  }
}

std::string HangMonitor::step_summary_now() const { return step_summary(options_.views()); }

std::string HangMonitor::view_now() const {
  std::vector<RankView> views = options_.views();
  if (std::none_of(views.begin(), views.end(), [](const RankView& v) { return v.attached; })) {
    return "";
  }
  const CollectiveDiagnosis diagnosis = diagnose(views);
  std::string text = "collectives now (kill -USR1): " + diagnosis.headline;
  for (const std::string& line : diagnosis.ranks) text += "\n  " + line;
  for (const auto& [name, other] : diagnose_lanes(views)) {
    text += "\n" + name + ": " + other.headline;
    for (const std::string& line : other.ranks) text += "\n  " + line;
  }
  return text;
}

std::string HangMonitor::summary_now() const {
  std::vector<RankView> views = options_.views();
  if (std::none_of(views.begin(), views.end(), [](const RankView& v) { return v.attached; })) {
    return "";
  }
  return diagnose(std::move(views)).headline;
}

}  // namespace ddp::launcher
