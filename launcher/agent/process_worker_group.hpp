#pragma once
// The real WorkerGroup: one process per local rank (its own process group, guarded by the
// GroupReaper), with torchrun's environment for the round, its streams redirected or teed as
// --redirects/--tee say, and its logs under <log_root>/attempt_<restart count>/<local rank>/.
// Internal to the launcher; runs on the agent's loop.

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/worker_group.hpp"
#include "agent/worker_start_error.hpp"
#include "ddp/launcher/launch_config.hpp"
#include "ddp/launcher/log_file_errors.hpp"
#include "ddp/launcher/master_endpoint.hpp"
#include "ddp/launcher/worker_command.hpp"
#include "output/console_writer.hpp"
#include "process/group_reaper.hpp"
#include "process/record_mapping.hpp"
#include "process/warm_starter.hpp"
#include "process/worker_environment.hpp"
#include "process/worker_streams.hpp"
#include "watch/python_stack_capture.hpp"

namespace ddp::launcher {

struct ProcessWorkerGroupOptions {
  LaunchConfig config;
  WorkerCommand command;
  std::map<std::string, std::string> base_env;  // the workers' environment before the contract
  std::filesystem::path log_root;               // <log_dir>/<run_id>, absolute
  std::string host;                             // this node's name in reports
  bool agent_store = false;                 // TORCHELASTIC_USE_AGENT_STORE: the round's master is a
                                            // store some agent serves
  int console_out = -1;                     // teed stdout lines go here (and workers inherit it)
  int console_err = -1;                     // teed stderr lines go here (and workers inherit it)
  std::function<void()> on_output_drained;  // teed output of every round reached EOF
  std::function<void(const std::string&)> notice;  // the Python stacks report (may be empty)
  // Where ddprun's Python probe is (its sitecustomize.py): put first on Python workers'
  // PYTHONPATH. Empty: no probe (--skip_python_probe, DDPRUN_PYTHON_PROBE=0, or not installed).
  std::filesystem::path python_probe_dir;
  // ddprun's NCCL profiler plugin (libddprun-nccl-profiler.so), named in every worker's
  // NCCL_PROFILER_PLUGIN unless the worker's environment names one. Empty: none
  // (DDPRUN_NCCL_PROFILER=0, the user's own NCCL_PROFILER_PLUGIN, or not installed).
  std::filesystem::path nccl_profiler;
  std::shared_ptr<LogFileErrors> log_errors;  // failed log writes, said once per file
  // --numa_binding: the CPUs of each local rank (numa_binding.hpp); empty: no binding.
  std::vector<std::vector<int>> cpus_of_local_rank;
  // --restart_policy=none: release() leaves what is still in a worker's process group
  // running (the agent's AdoptedProcesses waits for it) instead of killing it.
  bool keep_leftovers = false;
};

class ProcessWorkerGroup : public WorkerGroup {
 public:
  // console and reaper must outlive the group.
  ProcessWorkerGroup(boost::asio::io_context& io, ProcessWorkerGroupOptions options,
                     ConsoleWriter& console, GroupReaper& reaper);
  ~ProcessWorkerGroup() override;  // kills (SIGKILL, whole groups) and reaps what still runs

  void start(const elastic::RoundInfo& round, ExitHandler on_exit,
             StartedHandler on_started) override;
  void signal(int signal) override;
  void release() override;
  void replace(int local_rank, int generation, StartedHandler on_started) override;
  bool kill_worker(int local_rank) override;
  WorkerFailure failure_of(int local_rank) override;
  std::vector<WorkerFailure> other_failures(int except) override;
  std::vector<StillRunning> still_running() const override;
  bool output_pending() const override { return pending_tees_ > 0; }
  std::vector<RankView> rank_views() const override;
  void dump_python_stacks() override;
  // Takes the live stacks of the workers that run the Python probe (PythonStackCapture) and
  // calls done with them on the loop; false (done never called) when no worker runs it.
  bool capture_python_stacks(PythonStackCapture::Done done);
  void analyse_flight_recorder() override;
  bool request_abort() override;
  std::chrono::milliseconds analysis_time_left() const override;

  // Calls fn with each worker's rank and record page (for the timeline).
  void for_each_record(
      const std::function<void(int rank, const record::RecordPage& page)>& fn) const;
  // The pid of the worker of local_rank in the round last started (0: none).
  pid_t pid_of(int local_rank) const;
  // Whether pid is a child of ddprun's that this group started: a worker of the round last
  // started, or the warm template.
  bool owns(pid_t pid) const;
  // The round the workers were last started for.
  const elastic::RoundInfo& round() const { return round_; }
  // The round's attempt directory: <log_root>/attempt_<restart count>/.
  std::filesystem::path attempt_dir() const;

 private:
  // A worker about to start: how, and what the agent keeps of it.
  struct Launch {
    int local_rank = 0;
    SpawnOptions spawn;
    WorkerStreams streams;  // the child's ends close once it started
    std::shared_ptr<RecordMapping> record;
    std::string error_file;
  };
  // Starts the round's workers from local_rank on: at once when exec'd, one after the other
  // as the template answers when forked; then finish_start.
  void start_from(int local_rank);
  // replaced: the pid of the worker a replacement takes over from (0: none): its logs are
  // appended to, and its error file kept as error_<pid>.json.
  std::shared_ptr<Launch> prepare_worker(int local_rank, pid_t replaced = 0);
  // Starts it (exec), or adopts the pid the template forked.
  void launch_worker(Launch& launch, std::optional<pid_t> forked);
  // Checks that each exec worked; then on_started_.
  void finish_start(std::optional<WorkerStartError> error);
  // The error start throws when local_rank could not be started (pid: its process, when
  // only its exec failed), naming the cause and what to do.
  WorkerStartError start_error(int local_rank, pid_t pid, const std::exception& e) const;
  void tee_output(int local_rank, WorkerStreams& streams);
  // The prefix of local_rank's teed console lines: torchrun's "[<role><local_rank>]:", or
  // --log_line_prefix_template rendered.
  std::string line_prefix(int local_rank) const;
  // --duplicate_*_filters: attempt_<n>/filtered_stdout.log and filtered_stderr.log, made
  // afresh for each round.
  void open_filtered_logs(const std::filesystem::path& dir);
  void on_tee_done();
  // What every worker's environment, and the template's, is built from
  // (process/worker_environment.hpp).
  NodeEnvironment node_environment() const;
  // The stacks taken at a stop: one line per group of ranks, and a file per rank.
  void report_stacks(const std::vector<PythonStack>& stacks, const std::filesystem::path& dir);

  boost::asio::io_context& io_;
  ProcessWorkerGroupOptions options_;
  ConsoleWriter& console_;
  GroupReaper& reaper_;
  elastic::RoundInfo round_;
  int local_world_ = 0;
  ExitHandler on_exit_;                           // this round's
  StartedHandler on_started_;                     // while the round starts
  bool starting_ = false;                         // the round's workers are being started
  int start_signal_ = 0;                          // a signal that came meanwhile: no more start
  std::size_t signalled_ = 0;                     // the workers it was sent to (the first ones)
  std::vector<std::shared_ptr<Worker>> workers_;  // by local rank, this round
  std::vector<std::string> error_files_;          // by local rank, this round
  std::vector<std::shared_ptr<RecordMapping>> records_;  // by local rank, this round
  PythonStackCapture stacks_;
  std::shared_ptr<UniqueFd> filtered_out_;  // --duplicate_stdout_filters' file, this round
  std::shared_ptr<UniqueFd> filtered_err_;  // --duplicate_stderr_filters' file, this round
  // Signals held back from workers writing their stacks (a SIGTERM could cut a dump short),
  // sent once their dumps end.
  std::map<pid_t, int> held_signals_;
  int pending_tees_ = 0;  // and Flight Recorder analyses and stack reports not printed yet
  int pending_analyses_ = 0;
  std::chrono::steady_clock::time_point analysis_deadline_;     // of the last one started
  std::vector<std::thread> analysers_;                          // joined by the destructor
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // for what they post back
  std::unique_ptr<WarmStarter> warm_;  // --warm_start: forks Python workers when it may
  bool torchrun_only_ = false;         // the workers' Python never loads the probe: nothing of ours
  int generation_ = 0;                 // --restart_policy=inplace: the workers started now join
  int last_signal_ = 0;                // the last signal sent to the group (0: none)
};

}  // namespace ddp::launcher
