#include "ddp/launcher/agent.hpp"

#include <unistd.h>

#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "ddp/common/host_name.hpp"
#include "ddp/launcher/failure_report.hpp"
#include "ddp/launcher/log_dir.hpp"
#include "ddp/launcher/output_tee.hpp"
#include "ddp/launcher/signal_names.hpp"
#include "ddp/launcher/worker_env.hpp"
#include "console_writer.hpp"
#include "group_reaper.hpp"
#include "worker.hpp"
#include "worker_streams.hpp"

namespace ddp::launcher {
namespace fs = std::filesystem;

namespace {

// Once the job has ended, how long teed output may take to reach end-of-file (a worker's
// descendant that left its process group can hold a pipe open) before ddprun exits anyway.
constexpr auto kOutputDrainTimeout = std::chrono::seconds(5);

// As torchrun's failure report: socket.getfqdn().
std::string this_host() { return fully_qualified_host_name(); }

bool writes_logs(const StdSpec& spec) {
  if (spec.all) return *spec.all != Std::kNone;
  for (const auto& [rank, std] : spec.per_rank) {
    if (std != Std::kNone) return true;
  }
  return false;
}

fs::path make_temp_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/ddprun_XXXXXX";
  if (!::mkdtemp(pattern.data())) {
    throw std::system_error(errno, std::generic_category(), "mkdtemp " + pattern);
  }
  return pattern;
}

}  // namespace

class Agent::Impl {
 public:
  Impl(boost::asio::io_context& io, LaunchConfig config, WorkerCommand command,
       AgentOptions options)
      : io_(io),
        config_(std::move(config)),
        command_(std::move(command)),
        options_(std::move(options)),
        console_(options_.console_err),
        signals_(io),
        kill_timer_(io),
        drain_timer_(io),
        host_(this_host()) {}

  ~Impl() {
    for (auto& worker : workers_) worker->kill_and_reap();
    remove_temp_dir();
  }

  int run() {
    reaper_.emplace();  // before any handler or socket of ours exists to be inherited
    for (int signal : config_.signals_to_handle) signals_.add(signal);
    wait_for_signal();
    master_ = options_.master_host(io_, config_);
    endpoint_ = master_->endpoint();
    prepare_log_root();
    if (needs_omp_default(config_, options_.base_env)) {
      options_.base_env["OMP_NUM_THREADS"] = "1";
      notice(omp_notice());
    }
    start_attempt();
    io_.run();
    console_.flush();  // the report is queued last; waits for the console to take it all
    remove_temp_dir();
    return exit_code_.value_or(1);
  }

 private:
  enum class State {
    kRunning,       // the group runs; a failure stops it
    kStopping,      // a worker failed; the others are being stopped
    kShuttingDown,  // the agent got a signal; no restart
    kDone,          // the outcome is known; draining output
  };

  // Step 1: where logs and error files go. torchrun uses a temp dir when --log_dir is unset;
  // we remove ours at exit unless it holds logs the user asked for.
  void prepare_log_root() {
    fs::path base;
    if (config_.log_dir) {
      base = *config_.log_dir;
    } else {
      base = make_temp_dir();
      if (writes_logs(config_.redirects) || writes_logs(config_.tee)) {
        notice("ddprun: worker logs in " + base.string());
      } else {
        temp_dir_ = base;
      }
    }
    log_root_ = make_run_log_dir(base, config_.rdzv_id);  // TORCHELASTIC_ERROR_FILE is absolute
  }

  void remove_temp_dir() {
    if (temp_dir_.empty()) return;
    std::error_code ignored;
    fs::remove_all(temp_dir_, ignored);
    temp_dir_.clear();
  }

  // Step 2: start every worker of attempt_, in local rank order.
  void start_attempt() {
    workers_.clear();
    exits_seen_ = 0;
    const fs::path dir = log_root_ / ("attempt_" + std::to_string(attempt_));
    for (int local_rank = 0; local_rank < config_.nproc_per_node; ++local_rank) {
      start_worker(local_rank, dir / std::to_string(local_rank));
    }
    for (auto& worker : workers_) worker->confirm_started();
  }

  void start_worker(int local_rank, const fs::path& dir) {
    fs::create_directories(dir);
    WorkerIdentity identity{local_rank, attempt_, (dir / "error.json").string()};
    fs::remove(identity.error_file);  // a stale file from an earlier run must not be reported
    SpawnOptions spawn;
    spawn.program = command_.program;
    spawn.argv = worker_argv(command_, config_, local_rank);
    spawn.env = merge_environment(
        options_.base_env, worker_variables(config_, endpoint_, identity, options_.base_env));
    WorkerStreams streams =
        open_worker_streams(config_, local_rank, dir, options_.console_out, options_.console_err);
    spawn.stdout_fd = streams.child_out.valid() ? streams.child_out.get() : -1;
    spawn.stderr_fd = streams.child_err.valid() ? streams.child_err.get() : -1;

    auto worker = std::make_shared<Worker>(io_, local_rank);
    const int attempt = attempt_;
    worker->start(spawn, [this, attempt](Worker& w) {
      if (attempt == attempt_) on_worker_exit(w);
    });
    workers_.push_back(worker);
    reaper_->watch(worker->pid());
    error_files_.resize(config_.nproc_per_node);
    error_files_[local_rank] = identity.error_file;

    const std::string prefix = "[" + config_.role + std::to_string(local_rank) + "]:";
    for (WorkerStreams::Tee& tee : streams.tees) {
      ++pending_tees_;
      ConsoleSink sink;
      if (tee.console_fd >= 0) {
        sink = [this, fd = tee.console_fd](std::string line) {
          console_.write_line(fd, std::move(line));
        };
      }
      OutputTee::start(io_, std::move(tee.read_end), std::move(tee.file), std::move(sink),
                       prefix, [this] { on_tee_done(); }, TeeLog{tee.file_path.string(), log_errors_});
    }
  }  // the child's ends of pipes and files close here, in the agent

  // Step 3: a worker exited (an event from its pidfd).
  void on_worker_exit(Worker& worker) {
    ++exits_seen_;
    if (state_ == State::kRunning && worker.exit()->failed()) on_first_failure(worker);
    if (exits_seen_ == workers_.size()) on_group_exited();
  }

  // The root cause. Workers that have already failed too (reaped or not, their exit event
  // may still be queued) are "other failures"; the rest are stopped and not reported (their
  // exit is our doing).
  void on_first_failure(Worker& failed) {
    root_cause_ = failure_of(failed);
    other_failures_.clear();
    for (auto& worker : workers_) {
      if (worker.get() == &failed) continue;
      if (worker->poll_exit() && worker->exit()->failed()) {
        other_failures_.push_back(failure_of(*worker));
      }
    }
    state_ = State::kStopping;
    stop_group(SIGTERM);
  }

  // Signals every running worker's group, and SIGKILLs what is left after the timeout.
  void stop_group(int signal) {
    for (auto& worker : workers_) {
      if (worker->running()) worker->signal_group(signal);
    }
    kill_timer_.expires_after(config_.shutdown_timeout);
    kill_timer_.async_wait([this, attempt = attempt_, signal](boost::system::error_code ec) {
      // A completion queued just before a cancel still arrives: only this attempt's workers.
      if (!ec && attempt == attempt_ && state_ != State::kRunning) {
        if (auto left = still_running(); !left.empty()) {
          notice(kill_notice(config_.shutdown_timeout, signal, left));
        }
        kill_running(SIGKILL);
      }
    });
  }

  std::vector<StillRunning> still_running() const {
    std::vector<StillRunning> running;
    for (const auto& w : workers_) {
      if (w->running()) {
        running.push_back({config_.node_rank * config_.nproc_per_node + w->local_rank(),
                           w->local_rank(), w->pid()});
      }
    }
    return running;
  }

  void kill_running(int signal) {
    for (auto& worker : workers_) {
      if (worker->running()) worker->signal_group(signal);
    }
  }

  // Step 4: the whole group has exited. Decide: done, restart, or fail.
  void on_group_exited() {
    kill_timer_.cancel();
    for (auto& worker : workers_) {
      worker->signal_group(SIGKILL);  // stragglers in the groups
      reaper_->forget(worker->pid());
    }
    if (state_ == State::kShuttingDown) return finish(128 + shutdown_signal_);
    if (!root_cause_) return finish(0);
    if (attempt_ < config_.max_restarts) {
      notice("ddprun: worker group failed (rank " + std::to_string(root_cause_->rank) + ": " +
             root_cause_->describe_exit() + "); restarting it (restart " +
             std::to_string(attempt_ + 1) + " of at most " +
             std::to_string(config_.max_restarts) + ")");
      ++attempt_;
      root_cause_.reset();
      state_ = State::kRunning;
      return start_attempt();
    }
    report_ = format_failure_report(config_.entrypoint, *root_cause_, other_failures_);
    bool wrote_error_file = root_cause_->error.has_value();
    for (const auto& other : other_failures_) wrote_error_file |= other.error.has_value();
    if (wrote_error_file) temp_dir_.clear();  // keep the error files the report points to
    finish(root_cause_->status());
  }

  void wait_for_signal() {
    signals_.async_wait([this](boost::system::error_code ec, int signal) {
      if (ec) return;
      on_signal(signal);
      wait_for_signal();
    });
  }

  // A handled signal: forward it to every worker group, SIGKILL after the timeout; a second
  // one kills at once. Once the outcome is known, it ends the wait for the last output.
  void on_signal(int signal) {
    if (state_ == State::kDone) return stop();
    if (state_ == State::kShuttingDown) {
      notice("ddprun: " + signal_name(signal) + " again: killing the workers now");
      return kill_running(SIGKILL);
    }
    notice("ddprun: got " + signal_name(signal) + ": forwarding it to the workers");
    state_ = State::kShuttingDown;
    shutdown_signal_ = signal;
    stop_group(signal);
  }

  void finish(int exit_code) {
    exit_code_ = exit_code;
    state_ = State::kDone;
    if (pending_tees_ == 0) return stop();
    drain_timer_.expires_after(kOutputDrainTimeout);
    drain_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec) stop();
    });
  }

  void on_tee_done() {
    if (--pending_tees_ == 0 && state_ == State::kDone) stop();
  }

  // The end: the report queued after all output, then the loop stops (also ending whatever
  // else runs on it, such as a store server); run() then flushes the console.
  void stop() {
    drain_timer_.cancel();
    if (auto incomplete = log_errors_->take_incomplete_files_notice(); !incomplete.empty()) notice(incomplete);
    if (!report_.empty()) console_.write_notice(options_.console_err, std::move(report_));
    report_.clear();
    io_.stop();
  }

  WorkerFailure failure_of(const Worker& worker) const {
    WorkerFailure failure;
    failure.time = worker.exit()->time;
    failure.host = host_;
    failure.local_rank = worker.local_rank();
    failure.rank = config_.node_rank * config_.nproc_per_node + worker.local_rank();
    failure.pid = worker.pid();
    failure.exit_code = worker.exit()->exit_code;
    failure.signal = worker.exit()->signal;
    failure.error_file = error_files_[static_cast<std::size_t>(worker.local_rank())];
    failure.error = read_error_file(failure.error_file);
    return failure;
  }

  void notice(const std::string& line) { console_.write_notice(options_.console_err, line + "\n"); }

  boost::asio::io_context& io_;
  LaunchConfig config_;
  WorkerCommand command_;
  AgentOptions options_;
  ConsoleWriter console_;  // every console write of the agent; never blocks the loop
  std::optional<GroupReaper> reaper_;  // kills the groups if this process dies first
  std::unique_ptr<MasterHost> master_;
  MasterEndpoint endpoint_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer kill_timer_;
  boost::asio::steady_timer drain_timer_;
  std::string host_;
  fs::path log_root_;  // <log_dir>/<run_id>_<random>/ (make_run_log_dir)
  fs::path temp_dir_;  // a temp dir of ours to remove at exit; empty when none

  State state_ = State::kRunning;
  int attempt_ = 0;  // also TORCHELASTIC_RESTART_COUNT
  std::vector<std::shared_ptr<Worker>> workers_;
  std::vector<std::string> error_files_;  // by local rank, this attempt
  std::size_t exits_seen_ = 0;
  std::optional<WorkerFailure> root_cause_;
  std::vector<WorkerFailure> other_failures_;
  int shutdown_signal_ = 0;
  int pending_tees_ = 0;
  std::shared_ptr<LogFileErrors> log_errors_ =
      std::make_shared<LogFileErrors>([this](std::string line) { notice(line); });
  std::string report_;
  std::optional<int> exit_code_;
};

Agent::Agent(LaunchConfig config, WorkerCommand command, AgentOptions options)
    : io_(std::make_unique<boost::asio::io_context>(1)),
      impl_(std::make_unique<Impl>(*io_, std::move(config), std::move(command),
                                   std::move(options))) {}

Agent::~Agent() = default;

boost::asio::io_context& Agent::io_context() { return *io_; }

int Agent::run() { return impl_->run(); }

}  // namespace ddp::launcher
