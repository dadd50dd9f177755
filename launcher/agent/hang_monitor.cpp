#include "hang_monitor.hpp"

#include <algorithm>
#include <fstream>
#include <future>

#include "../diagnosis/nccl_ras.hpp"
#include "../diagnosis/stack_capture.hpp"

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

std::string indented(const std::string& lines) {
  std::string text;
  std::size_t start = 0;
  while (start < lines.size()) {
    const std::size_t end = lines.find('\n', start);
    text += "  " + lines.substr(start, end - start) + "\n";
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return text;
}

}  // namespace

std::string hang_report(const CollectiveDiagnosis& diagnosis, const std::string& stacks,
                        const std::string& nccl_ras) {
  std::string text = diagnosis.headline + "\n";
  for (const std::string& line : diagnosis.ranks) text += "  " + line + "\n";
  if (!stacks.empty()) text += "where each worker was (eu-stack):\n" + indented(stacks);
  if (!nccl_ras.empty()) text += nccl_ras + "\n";
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

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
  if (round < 0 || round == reported_round_) return;  // not running, or reported already
  std::vector<RankView> views = options_.views();
  check_straggler(views);
  if (options_.hang_timeout.count() == 0) return;
  const double timeout_s = static_cast<double>(options_.hang_timeout.count()) / 1000.0;
  auto diagnosis = judge_hang(views, timeout_s);
  if (!diagnosis) return;
  reported_round_ = round;
  if (reporter_.joinable()) reporter_.join();  // an earlier round's, long done
  reporter_ = std::thread(
      [this, round, d = std::move(*diagnosis), views = std::move(views),
       dir = options_.attempt_dir()] { report(round, std::move(d), std::move(views), dir); });
}

void HangMonitor::report(int round, CollectiveDiagnosis diagnosis, std::vector<RankView> views,
                         const fs::path& dir) {
  std::vector<RankStack> targets;
  for (const RankView& view : views) {
    if (!view.remote && view.running && view.pid > 0) {
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
      return "NCCL's RAS service (" + address + ") says:\n" + indented(report);
    });
  }
  const std::vector<RankStack> stacks = capture_stacks(std::move(targets));
  std::string nccl_ras = ras.valid() ? ras.get() : "";
  while (!nccl_ras.empty() && nccl_ras.back() == '\n') nccl_ras.pop_back();
  for (const RankStack& stack : stacks) {
    auto view = std::find_if(views.begin(), views.end(),
                             [&](const RankView& v) { return v.rank == stack.rank; });
    write_text(dir / std::to_string(view->local_rank) / "stack.txt",
               stack.error.empty() ? stack.stack : stack.error + "\n");
  }
  const std::string text = hang_report(diagnosis, group_stacks(stacks), nccl_ras);
  write_text(dir / "hang.txt", text + "\n");

  const RankView& root = root_rank(diagnosis, views);
  WorkerFailure failure;
  failure.time = std::chrono::system_clock::now();
  failure.host = root.host;
  failure.rank = root.rank;
  failure.local_rank = root.local_rank;
  failure.pid = root.pid;
  failure.exit_code = 1;
  failure.hung = true;
  failure.error_file = (dir / "hang.txt").string();
  failure.error = ErrorFileContent{diagnosis.headline, text};
  options_.post(event::Hung{round, std::move(failure)});
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
  const CollectiveDiagnosis diagnosis = diagnose(std::move(views));
  std::string text = "collectives now (kill -USR1): " + diagnosis.headline;
  for (const std::string& line : diagnosis.ranks) text += "\n  " + line;
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
