#pragma once
// Watches the round's collective records on the agent's loop and says when the job hangs
// (--hang_timeout): then it gathers where each worker was (eu-stack, off the loop), writes the
// report into the attempt's log directory, and hands the agent an event::Hung naming the rank
// to blame. Also the view behind kill -USR1. Internal to the launcher.

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "../diagnosis/collective_diagnosis.hpp"
#include "../diagnosis/straggler.hpp"
#include "agent_event.hpp"

namespace ddp::launcher {

// A straggler is named at most this often.
inline constexpr std::chrono::seconds kStragglerQuiet{60};

struct HangMonitorOptions {
  std::chrono::milliseconds hang_timeout{0};     // 0: no hang detection
  std::function<std::vector<RankView>()> views;  // the round's ranks now
  std::function<int()> round;  // the running round's number; -1 while no round runs
  std::function<std::filesystem::path()> attempt_dir;  // where the round's logs go
  std::function<void(AgentEvent)> post;                // queues an event for the machine
  std::function<void(const std::string&)> notice;      // one line for the console
  StragglerOptions straggler;                          // window 0: no straggler lines
  // NCCL's RAS service, asked for its status when the job hung: the workers' NCCL_RAS_ADDR
  // (then always asked); empty: localhost:28028, asked when a rank uses NCCL.
  std::string ras_address;
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
  // Off the loop (its own thread): stacks, the report files in dir, then the event.
  void report(int round, CollectiveDiagnosis diagnosis, std::vector<RankView> views,
              const std::filesystem::path& dir);

  HangMonitorOptions options_;
  boost::asio::steady_timer timer_;
  int reported_round_ = -1;  // a hang is reported once per round
  // The last straggler line: said again at most once a minute.
  std::optional<std::chrono::steady_clock::time_point> straggler_said_;
  std::thread reporter_;
};

// The report of a hang as printed: the verdict, each rank's collective, grouped stacks, and
// what NCCL's RAS service said (empty: not asked).
std::string hang_report(const CollectiveDiagnosis& diagnosis, const std::string& stacks,
                        const std::string& nccl_ras = "");

}  // namespace ddp::launcher
