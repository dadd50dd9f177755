#pragma once
// Watches the round's collective records on the agent's loop and says when the job hangs
// (--hang_timeout). Diagnose early, act late: at the timeout it prints the verdict as a
// warning, with where each worker is (the Python probe's stacks, eu-stack for the others) and
// what each rank to blame did meanwhile (its CPU time and I/O), and again at most once a
// minute while the hang holds. It stops the job (on_hung naming the rank to blame,
// after the report is written into the attempt's log directory) only when the hang is
// certain (a rank the others wait for exited; the ranks called the collective differently),
// or once the ranks have waited past the job's own collective timeout (--hang_stop_timeout
// overrides it). Also the view behind kill -USR1. Internal to the launcher.

#include <sys/types.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "ddp/launcher/failure_report.hpp"
#include "diagnosis/collective_diagnosis.hpp"
#include "diagnosis/process_activity.hpp"
#include "diagnosis/straggler.hpp"
#include "watch/python_stack_capture.hpp"

namespace ddp::launcher {

// A straggler is named at most this often.
inline constexpr std::chrono::seconds kStragglerQuiet{60};
// A hang that holds is reported again at most this often.
inline constexpr std::chrono::seconds kHangRepeat{60};
// When no rank says how long it waits for a collective (an older libddp): libddp's and
// PyTorch's NCCL default.
inline constexpr std::chrono::minutes kDefaultCollectiveTimeout{10};

// What ddprun does about a hang now, and the sentence that says so.
struct HangAction {
  bool stop = false;
  std::string text;
};

// Stop now when the hang is certain (a desync; a rank to blame exited) or the ranks have
// waited past stop_after (nullopt: the largest collective timeout a rank reported, else
// kDefaultCollectiveTimeout); otherwise let the job run. Records written only by the NCCL
// profiler plugin never stop a job without stop_after (--hang_stop_timeout): they warn.
HangAction decide_hang(const CollectiveDiagnosis& diagnosis, const std::vector<RankView>& views,
                       std::optional<std::chrono::milliseconds> stop_after);

struct HangMonitorOptions {
  std::chrono::milliseconds hang_timeout{0};     // 0: no hang detection
  std::function<std::vector<RankView>()> views;  // the round's ranks now
  std::function<int()> round;  // the running round's number; -1 while no round runs
  std::function<std::filesystem::path()> attempt_dir;  // where the round's logs go
  // The job hung in `round`: the rank to blame (hung = true, the report in error).
  std::function<void(int round, WorkerFailure root_cause)> on_hung;
  std::function<void(const std::string&)> notice;  // one line for the console
  StragglerOptions straggler;                      // window 0: no straggler lines
  // NCCL's RAS service, asked for its status when the job hung: the workers' NCCL_RAS_ADDR
  // (then always asked); empty: localhost:28028, asked when a rank uses NCCL.
  std::string ras_address;
  // Takes the live Python stacks of this node's workers that run the probe (empty: none).
  std::function<void(PythonStackCapture::Done)> python_stacks;
  // --hang_stop_timeout; nullopt: the job's own collective timeout (decide_hang).
  std::optional<std::chrono::milliseconds> stop_after;
  // Whether the job hangs, given the views and the timeout in seconds; empty: judge_hang (one
  // node; several: CollectiveExchange::judge, the gatherer's verdict).
  std::function<std::optional<CollectiveDiagnosis>(const std::vector<RankView>&, double)> judge;
};

class HangMonitor {
 public:
  HangMonitor(boost::asio::io_context& io, HangMonitorOptions options);
  ~HangMonitor();  // waits for a stack capture under way (bounded by kStackTimeout)
  HangMonitor(const HangMonitor&) = delete;
  HangMonitor& operator=(const HangMonitor&) = delete;

  // Starts checking, every tick, for as long as the monitor lives.
  void start();

  // The job's collectives now, for kill -USR1: a headline and one line per rank. Empty when
  // no worker records its collectives.
  std::string view_now() const;

  // One line on where the collectives are, for a failure's report; empty when not recorded.
  std::string summary_now() const;

  // Per rank, compute and wait time in Reducer steps, for the end of the job; empty when no
  // rank recorded a step.
  std::string step_summary_now() const;

  // How often the records are read: a quarter of the hang timeout, between 0.1 s and 0.5 s.
  std::chrono::milliseconds tick() const;

 private:
  void schedule();
  void check();
  void check_straggler(const std::vector<RankView>& views);
  // Keeps each local running rank's CPU and I/O counters over the last hang_timeout.
  void sample_activity(const std::vector<RankView>& views);
  // "rank 1 (pid 42) used 0.0 s of CPU and did no I/O in 300 s: blocked, not busy", per rank
  // to blame on this node.
  std::string activity_lines(const CollectiveDiagnosis& diagnosis,
                             const std::vector<RankView>& views) const;
  // Off the loop (its own thread): native stacks, the report files in dir, then the event
  // (action.stop) or the warning.
  void report(int round, CollectiveDiagnosis diagnosis, std::vector<RankView> views,
              const std::filesystem::path& dir, HangAction action, std::string evidence,
              std::vector<PythonStack> python_stacks);

  struct ActivitySample {
    std::chrono::steady_clock::time_point time;
    ProcessActivity activity;
  };

  HangMonitorOptions options_;
  boost::asio::steady_timer timer_;
  int stopped_round_ = -1;  // a stop was asked for this round: nothing more to judge
  int hang_round_ = -1;     // the round whose hang was last reported while it holds
  std::chrono::steady_clock::time_point reported_at_;
  bool reporting_ = false;  // a report is being made (stacks being taken)
  std::map<pid_t, std::deque<ActivitySample>> activity_;  // oldest first
  // The last straggler line: said again at most once a minute.
  std::optional<std::chrono::steady_clock::time_point> straggler_said_;
  std::thread reporter_;
};

// The report of a hang as printed: the verdict, each rank's collective, the sections on where
// the workers are (formatted, each with its heading), and what NCCL's RAS service said
// (empty: not asked).
std::string hang_report(const CollectiveDiagnosis& diagnosis, const std::string& stacks,
                        const std::string& nccl_ras = "");

}  // namespace ddp::launcher
