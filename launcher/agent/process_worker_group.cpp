#include "agent/process_worker_group.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>

#include "agent/worker_start_error.hpp"
#include "ddp/common/host_name.hpp"
#include "ddp/common/worker_contract.hpp"
#include "ddp/launcher/output_tee.hpp"
#include "ddp/launcher/process_setup.hpp"
#include "ddp/launcher/signal_names.hpp"
#include "ddp/launcher/worker_env.hpp"
#include "ddp/launcher/write_all.hpp"
#include "diagnosis/flight_recorder.hpp"
#include "diagnosis/python_stacks.hpp"
#include "diagnosis/stack_capture.hpp"
#include "process/nccl_profiler_lookup.hpp"
#include "process/python_isolation.hpp"
#include "process/python_probe.hpp"
#include "process/worker_environment.hpp"
#include "shared/tool_run.hpp"

namespace ddp::launcher {
namespace fs = std::filesystem;

namespace {

// Why a worker could not be started, and what to do about it.
std::string start_failure_text(const LaunchConfig& config, const fs::path& log_root,
                               const std::exception& e) {
  if (is_out_of_descriptors(e)) return out_of_descriptors_message(config, e);
  const std::string what = e.what();
  if (const auto* spawn = dynamic_cast<const SpawnError*>(&e)) {
    if (spawn->error() == EAGAIN || spawn->error() == ENOMEM) {
      return what +
             ": the system is out of processes or memory; raise the limit on processes "
             "(ulimit -u, the container's pids limit) or free memory, or start fewer workers";
    }
    if (what.starts_with("cannot execute")) {
      return what +
             ": check that the program exists, is executable, and is a binary or a "
             "script starting with #!";
    }
    return what;
  }
  if (dynamic_cast<const std::system_error*>(&e) || dynamic_cast<const fs::filesystem_error*>(&e)) {
    return what + ": each worker's logs and error file go under " + log_root.string() +
           "; make it a writable directory with space left, or pass another --log_dir";
  }
  return what;
}

}  // namespace

ProcessWorkerGroup::ProcessWorkerGroup(boost::asio::io_context& io,
                                       ProcessWorkerGroupOptions options, ConsoleWriter& console,
                                       GroupReaper& reaper)
    : io_(io), options_(std::move(options)), console_(console), reaper_(reaper), stacks_(io) {
  if (const std::string flag = python_isolation_flag(options_.command); !flag.empty()) {
    if (options_.notice)
      options_.notice(python_isolation_notice(flag, options_.command, options_.config));
    torchrun_only_ = true;
    options_.python_probe_dir.clear();  // no probe: no stacks, no warm starts
  }
  WarmStarterOptions warm;
  warm.mode = options_.config.warm_start;
  warm.preload = options_.config.warm_preload;
  warm.command = options_.command;
  warm.probe_dir = options_.python_probe_dir;
  warm.env = template_environment(node_environment());
  warm.log_root = options_.log_root;
  warm.group_guard_fd = reaper_.channel();
  warm.alone = options_.config.max_nodes == 1;
  warm.later_rounds = workers_may_start_again(options_.config);
  warm.notice = options_.notice;
  warm_ = std::make_unique<WarmStarter>(io_, std::move(warm));
}

NodeEnvironment ProcessWorkerGroup::node_environment() const {
  NodeEnvironment node;
  node.base_env = options_.base_env;
  node.python = options_.command.python;
  node.python_probe_dir = options_.python_probe_dir;
  node.stack_signal = python_stack_signal();
  node.nccl_profiler = options_.nccl_profiler;
  node.torchrun_only = torchrun_only_;
  return node;
}

ProcessWorkerGroup::~ProcessWorkerGroup() {
  alive_.reset();
  for (auto& worker : workers_) worker->kill_and_reap();
  for (auto& analyser : analysers_) analyser.join();  // bounded by kFlightRecorderTimeout
}

// Every worker of the round, in local rank order; then checks that each exec worked. The
// workers are exec'd at once; forked ones wait for the warm template on the loop.
void ProcessWorkerGroup::start(const elastic::RoundInfo& round, ExitHandler on_exit,
                               StartedHandler on_started) {
  const fs::path previous = workers_.empty() ? fs::path() : attempt_dir();
  const int previous_world = workers_.empty() ? 0 : static_cast<int>(workers_.size());
  round_ = round;
  workers_.clear();
  records_.clear();
  held_signals_.clear();
  on_exit_ = std::move(on_exit);
  on_started_ = std::move(on_started);
  start_signal_ = 0;
  last_signal_ = 0;
  generation_ = 0;
  starting_ = true;
  local_world_ = elastic::worker_ranks(round, 0).local_world_size;
  error_files_.assign(static_cast<std::size_t>(local_world_), "");
  try {
    open_filtered_logs(attempt_dir());
  } catch (const std::exception& e) {  // as a worker that could not be started: a report
    return finish_start(start_error(0, 0, e));
  }
  warm_->begin_round(round.restart_count, previous, previous_world, [this] { start_from(0); });
}

void ProcessWorkerGroup::start_from(int local_rank) {
  for (; local_rank < local_world_ && start_signal_ == 0; ++local_rank) {
    std::shared_ptr<Launch> launch;
    try {
      launch = prepare_worker(local_rank);
      if (warm_->forking()) {  // the rest of the round follows the template's reply
        return warm_->spawn(launch->spawn, [this, launch](std::optional<pid_t> forked) {
          if (forked || start_signal_ == 0) {  // a fork that came is adopted, even now
            try {
              launch_worker(*launch, forked);
            } catch (const std::exception& e) {
              return finish_start(start_error(launch->local_rank, 0, e));
            }
          }
          start_from(launch->local_rank + 1);
        });
      }
      launch_worker(*launch, std::nullopt);
    } catch (const std::exception& e) {
      return finish_start(start_error(local_rank, 0, e));
    }
  }
  finish_start(std::nullopt);
}

void ProcessWorkerGroup::finish_start(std::optional<WorkerStartError> error) {
  if (!error) {
    for (auto& worker : workers_) {
      try {
        worker->confirm_started();
      } catch (const std::exception& e) {
        error = start_error(worker->local_rank(), worker->pid(), e);
        break;
      }
    }
  }
  if (!error && start_signal_ == 0) warm_->end_round(attempt_dir(), local_world_);
  starting_ = false;
  const int started = error ? error->started() : static_cast<int>(workers_.size());
  // A signal that came while the round started reaches the workers forked since.
  for (std::size_t i = signalled_; start_signal_ != 0 && i < workers_.size(); ++i) {
    if (workers_[i]->running()) workers_[i]->signal_group(start_signal_);
  }
  auto done = std::exchange(on_started_, nullptr);
  if (done) done(StartResult{started, std::move(error)});
}

WorkerStartError ProcessWorkerGroup::start_error(int local_rank, pid_t pid,
                                                 const std::exception& e) const {
  WorkerFailure failure;
  failure.time = std::chrono::system_clock::now();
  failure.host = options_.host;
  failure.local_rank = local_rank;
  failure.rank = elastic::worker_ranks(round_, local_rank).rank;
  failure.pid = pid;
  failure.exit_code = 1;
  failure.error_file = "<N/A>";
  failure.error =
      ErrorFileContent{"could not start the worker of local_rank " + std::to_string(local_rank) +
                           " (rank " + std::to_string(failure.rank) + ") on " + options_.host +
                           ": " + start_failure_text(options_.config, options_.log_root, e),
                       ""};
  return WorkerStartError(std::move(failure), static_cast<int>(workers_.size()));
}

std::shared_ptr<ProcessWorkerGroup::Launch> ProcessWorkerGroup::prepare_worker(int local_rank,
                                                                               pid_t replaced) {
  const fs::path dir = attempt_dir() / std::to_string(local_rank);
  const bool fresh = fs::create_directories(dir);
  WorkerIdentity identity{local_rank, round_.restart_count, (dir / "error.json").string(),
                          elastic::worker_ranks(round_, local_rank)};
  // A stale file from an earlier run must not be reported; a directory just made has none.
  // The error file of the worker a replacement takes over from is kept, as error_<pid>.json.
  std::error_code ignored;
  if (replaced != 0) {
    fs::rename(identity.error_file, dir / ("error_" + std::to_string(replaced) + ".json"), ignored);
  } else if (!fresh) {
    fs::remove(identity.error_file);
  }
  const MasterEndpoint master{round_.master_addr, round_.master_port, options_.agent_store};
  SpawnOptions spawn;
  spawn.program = options_.command.program;
  spawn.argv = worker_argv(options_.command, options_.config, local_rank);
  // The collective record page libddp (or the Python probe) writes and the hang monitor
  // reads, and the file the probe writes Python stacks into.
  auto record = std::make_shared<RecordMapping>();
  WorkerOwnVariables own;
  own.record = record->variable();
  own.stack = record->stack_variable();
  own.modules = warm_->modules_variable(dir);
  own.flight_dumps = (dir.parent_path() / kFlightRecorderPrefix).string();
  if (options_.config.restart_policy == RestartPolicy::kInplace) {
    own.inplace_generation =
        std::string(contract::kInplaceGeneration) + "=" + std::to_string(generation_);
  }
  spawn.env = worker_environment(node_environment(), options_.config, master, identity, own);
  if (!torchrun_only_) spawn.inherit_fds = {record->fd()};
  if (options_.command.python && !options_.python_probe_dir.empty()) {
    spawn.inherit_fds.push_back(record->stack_fd());
  }
  auto launch = std::make_shared<Launch>();
  launch->local_rank = local_rank;
  launch->error_file = identity.error_file;
  launch->record = std::move(record);
  // The worker's streams are its own (the console, or the files and tee pipes that
  // --redirects/--tee ask for): ddprun never puts itself between a worker and the console.
  launch->streams = open_worker_streams(options_.config, local_rank, dir, options_.console_out,
                                        options_.console_err, replaced != 0);
  if (static_cast<std::size_t>(local_rank) < options_.cpus_of_local_rank.size()) {
    spawn.cpus = options_.cpus_of_local_rank[static_cast<std::size_t>(local_rank)];
  }
  spawn.stdout_fd = launch->streams.child_out.valid() ? launch->streams.child_out.get() : -1;
  spawn.stderr_fd = launch->streams.child_err.valid() ? launch->streams.child_err.get() : -1;
  // The worker tells the guard its group itself, before its program runs (and so before it
  // can start children of its own): a kill -9 of ddprun just after the spawn leaves none.
  spawn.group_guard_fd = reaper_.channel();
  warm_->note_worker_environment(spawn.env);
  launch->spawn = std::move(spawn);
  return launch;
}

void ProcessWorkerGroup::launch_worker(Launch& launch, std::optional<pid_t> forked) {
  auto worker = std::make_shared<Worker>(io_, launch.local_rank);
  auto report_exit = [on_exit = on_exit_](Worker& w) { on_exit(w.local_rank(), *w.exit()); };
  if (forked) {
    worker->adopt(*forked, report_exit);  // from the warm template: already running
  } else {
    worker->start(launch.spawn, report_exit);
  }
  const auto slot = static_cast<std::size_t>(launch.local_rank);
  if (slot < workers_.size()) {  // a replacement (--restart_policy=inplace)
    workers_[slot] = worker;
    records_[slot] = launch.record;
  } else {
    workers_.push_back(worker);
    records_.push_back(launch.record);
  }
  reaper_.watch(worker->pid());  // again, should the worker's own message have been lost
  error_files_[slot] = launch.error_file;
  tee_output(launch.local_rank, launch.streams);
  launch.streams = WorkerStreams();  // the child's ends of pipes and files close in the agent
}

std::string ProcessWorkerGroup::line_prefix(int local_rank) const {
  const LaunchConfig& config = options_.config;
  if (config.log_line_prefix_template.empty()) {
    return "[" + config.role + std::to_string(local_rank) + "]:";
  }
  return render_prefix_template(
      config.log_line_prefix_template,
      {{"role_name", config.role},
       {"rank", std::to_string(elastic::worker_ranks(round_, local_rank).rank)},
       {"local_rank", std::to_string(local_rank)},
       {"hostname", ddp::host_name()}});
}

void ProcessWorkerGroup::open_filtered_logs(const fs::path& dir) {
  auto open = [&](const std::vector<std::string>& filters, const char* name) {
    if (filters.empty()) return std::shared_ptr<UniqueFd>();
    fs::create_directories(dir);
    const fs::path path = dir / name;
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw std::system_error(errno, std::generic_category(), "open " + path.string());
    }
    return std::make_shared<UniqueFd>(fd);
  };
  filtered_out_ = open(options_.config.duplicate_stdout_filters, "filtered_stdout.log");
  filtered_err_ = open(options_.config.duplicate_stderr_filters, "filtered_stderr.log");
}

void ProcessWorkerGroup::tee_output(int local_rank, WorkerStreams& streams) {
  const std::string prefix = line_prefix(local_rank);
  for (WorkerStreams::Tee& tee : streams.tees) {
    ++pending_tees_;
    ConsoleSink sink;
    if (tee.console_fd >= 0) {
      sink = [this, fd = tee.console_fd](std::string line) {
        console_.write_line(fd, std::move(line));
      };
      // --duplicate_*_filters: the console lines (prefixed) that contain one of the texts
      // also go to the round's filtered file, as torchrun's second tail does.
      const auto& filters = tee.is_stderr ? options_.config.duplicate_stderr_filters
                                          : options_.config.duplicate_stdout_filters;
      std::shared_ptr<UniqueFd> file = tee.is_stderr ? filtered_err_ : filtered_out_;
      if (file && !filters.empty()) {
        const std::string path =
            (attempt_dir() / (tee.is_stderr ? "filtered_stderr.log" : "filtered_stdout.log"))
                .string();
        sink = [this, console = std::move(sink), file, &filters, path,
                skip = prefix.size()](std::string line) {
          const std::string_view text = std::string_view(line).substr(skip);
          const bool matches = std::any_of(
              filters.begin(), filters.end(),
              [&](const std::string& f) { return text.find(f) != std::string_view::npos; });
          if (matches) {
            int error = 0;
            const std::size_t wrote =
                write_all_counted(file->get(), line.data(), line.size(), &error);
            if (wrote < line.size() && options_.log_errors) {
              options_.log_errors->write_failed(path, error, line.size() - wrote);
            }
          }
          console(std::move(line));
        };
      }
    }
    // A console that reads slowly slows the worker, as a direct pipe would: nothing is dropped.
    OutputTee::start(
        io_, std::move(tee.read_end), std::move(tee.file), std::move(sink), prefix,
        [this] { on_tee_done(); }, TeeLog{tee.file_path.string(), options_.log_errors},
        [this](std::function<void()> resume) { return console_.when_room(std::move(resume)); });
  }
}

void ProcessWorkerGroup::on_tee_done() {
  if (--pending_tees_ == 0 && options_.on_output_drained) options_.on_output_drained();
}

void ProcessWorkerGroup::signal(int signal) {
  last_signal_ = signal;
  if (starting_) {  // no more workers start; a wait for the template ends now
    if (start_signal_ == 0) {
      warm_->cancel("ddprun got " + signal_name(signal) + " while the workers started");
    }
    start_signal_ = signal;
    signalled_ = workers_.size();  // those after it get it when they come (finish_start)
  }
  for (auto& worker : workers_) {
    if (!worker->running()) continue;
    // Writing its stacks: a SIGTERM now could cut the dump short; it follows once the dump
    // ended (bounded by PythonStackCapture::kTimeout). SIGKILL is never held back.
    if (signal != SIGKILL && stacks_.dumping(worker->pid())) {
      held_signals_[worker->pid()] = signal;
      continue;
    }
    worker->signal_group(signal);
  }
}

void ProcessWorkerGroup::release() {
  for (auto& worker : workers_) {
    // Stragglers in the groups; --restart_policy=none waits for them (AdoptedProcesses).
    if (!options_.keep_leftovers) worker->signal_group(SIGKILL);
    reaper_.forget(worker->pid());
  }
}

void ProcessWorkerGroup::for_each_record(
    const std::function<void(int rank, const record::RecordPage& page)>& fn) const {
  for (std::size_t i = 0; i < workers_.size() && i < records_.size(); ++i) {
    fn(elastic::worker_ranks(round_, workers_[i]->local_rank()).rank, records_[i]->page());
  }
}

// Only workers whose probe asked for a stack signal are signalled; the stop's SIGTERM waits
// for their dumps (signal()), so that their own SIGTERM handlers then run as under torchrun.
bool ProcessWorkerGroup::capture_python_stacks(PythonStackCapture::Done done) {
  std::vector<PythonStackCapture::Target> targets;
  for (std::size_t i = 0; i < workers_.size() && i < records_.size(); ++i) {
    const std::shared_ptr<Worker>& worker = workers_[i];
    if (!worker->running() || records_[i]->stack_signal() == 0) continue;
    targets.push_back({elastic::worker_ranks(round_, worker->local_rank()).rank,
                       worker->local_rank(), worker->pid(), records_[i],
                       [worker] { return worker->running(); }});
  }
  if (targets.empty()) return false;
  stacks_.capture(std::move(targets),
                  [this, done = std::move(done), alive = std::weak_ptr<bool>(alive_)](auto stacks) {
                    if (alive.expired()) return;
                    // The signals held back while the dumps were written (signal()) go out now.
                    for (const auto& [pid, signal] : held_signals_) {
                      for (auto& worker : workers_) {
                        if (worker->pid() == pid && worker->running()) worker->signal_group(signal);
                      }
                    }
                    held_signals_.clear();
                    done(std::move(stacks));
                  });
  return true;
}

void ProcessWorkerGroup::dump_python_stacks() {
  ++pending_tees_;  // the report is output the job's end waits for
  const bool taking = capture_python_stacks([this, dir = attempt_dir()](auto stacks) {
    report_stacks(stacks, dir);
    on_tee_done();
  });
  if (!taking) --pending_tees_;
}

// "ddprun: where each Python worker was ..." with the ranks grouped by stack, and one file
// per rank: <attempt dir>/<local rank>/python_stack.txt.
void ProcessWorkerGroup::report_stacks(const std::vector<PythonStack>& stacks,
                                       const fs::path& dir) {
  for (const PythonStack& stack : stacks) {
    if (stack.dump.empty()) continue;
    std::ofstream(dir / std::to_string(stack.local_rank) / "python_stack.txt") << stack.dump;
  }
  if (!options_.notice || stacks.empty()) return;
  std::string text = "ddprun: where each Python worker was when it was stopped:\n";
  text += indent_lines(group_python_stacks(stacks));
  if (options_.config.log_dir) {  // else the files go with ddprun's temporary log folder
    text += "  (each rank's stack: " + (dir / "<local_rank>" / "python_stack.txt").string() + ")";
  } else {
    text.pop_back();  // notice() ends the line
  }
  options_.notice(text);
}

void ProcessWorkerGroup::analyse_flight_recorder() {
  const std::vector<std::string> dumps = flight_recorder_dumps(attempt_dir());
  if (dumps.empty()) return;
  std::string note =
      "ddprun: PyTorch's Flight Recorder left " + std::to_string(dumps.size()) + " dump(s):";
  for (const auto& dump : dumps) note += " " + dump;
  if (options_.notice) options_.notice(note);
  if (!options_.command.python) return;
  const std::vector<std::string> argv =
      flight_recorder_analyser(options_.command.program, attempt_dir());
  std::string command;
  for (const auto& arg : argv) command += (command.empty() ? "" : " ") + arg;
  ++pending_tees_;  // its verdict is output the job's end waits for
  ++pending_analyses_;
  analysis_deadline_ = std::chrono::steady_clock::now() + kFlightRecorderTimeout;
  analysers_.emplace_back([this, argv, command, alive = std::weak_ptr<bool>(alive_)] {
    const ToolRun run = run_tool(argv, kFlightRecorderTimeout, 64 * 1024);
    boost::asio::post(io_, [this, run, command, alive] {
      if (alive.expired()) return;  // the group is gone
      if (options_.notice) options_.notice(flight_recorder_verdict(run, command));
      --pending_analyses_;
      on_tee_done();
    });
  });
}

bool ProcessWorkerGroup::request_abort() {
  bool nccl = false;
  for (std::size_t i = 0; i < workers_.size() && i < records_.size(); ++i) {
    if (!workers_[i]->running() || !records_[i]->attached()) continue;
    records_[i]->request_stop();
    // Any communicator of the worker: its lanes name their backends.
    const record::RecordPage& page = records_[i]->page();
    for (std::uint32_t lane = 0; lane < record::kCommunicatorLanes; ++lane) {
      const std::uint64_t backend =
          record::lane_of(page, lane).backend->load(std::memory_order_relaxed);
      if (backend == record::pack_name("nccl")) nccl = true;
    }
  }
  return nccl;
}

std::chrono::milliseconds ProcessWorkerGroup::analysis_time_left() const {
  if (pending_analyses_ == 0) return {};
  const auto left = analysis_deadline_ - std::chrono::steady_clock::now();
  // (and a second for the verdict to reach the loop after the analyser was stopped)
  return std::chrono::duration_cast<std::chrono::milliseconds>(left) + std::chrono::seconds(1);
}

fs::path ProcessWorkerGroup::attempt_dir() const {
  return options_.log_root / ("attempt_" + std::to_string(round_.restart_count));
}

std::vector<RankView> ProcessWorkerGroup::rank_views() const {
  const std::uint64_t now = monotonic_now_ns();
  std::vector<RankView> views;
  for (std::size_t i = 0; i < workers_.size() && i < records_.size(); ++i) {
    const Worker& worker = *workers_[i];
    RankView view;
    view.local_rank = worker.local_rank();
    view.rank = elastic::worker_ranks(round_, view.local_rank).rank;
    view.host = options_.host;
    view.pid = worker.pid();
    view.running = worker.running();
    if (worker.exit()) {
      WorkerFailure exit;
      exit.exit_code = worker.exit()->exit_code;
      exit.signal = worker.exit()->signal;
      view.exit_text = exit.describe_exit();
    }
    read_record(records_[i]->page(), now, view);
    views.push_back(std::move(view));
  }
  return views;
}

bool ProcessWorkerGroup::owns(pid_t pid) const {
  for (const auto& worker : workers_) {
    if (worker->pid() == pid) return true;
  }
  return warm_ && warm_->template_pid() == pid;
}

pid_t ProcessWorkerGroup::pid_of(int local_rank) const {
  for (const auto& worker : workers_) {
    if (worker->local_rank() == local_rank) return worker->pid();
  }
  return 0;
}

std::vector<StillRunning> ProcessWorkerGroup::still_running() const {
  std::vector<StillRunning> running;
  for (const auto& worker : workers_) {
    if (!worker->running()) continue;
    running.push_back({elastic::worker_ranks(round_, worker->local_rank()).rank,
                       worker->local_rank(), worker->pid()});
  }
  return running;
}

void ProcessWorkerGroup::replace(int local_rank, int generation, StartedHandler on_started) {
  const auto slot = static_cast<std::size_t>(local_rank);
  if (starting_ || slot >= workers_.size() || workers_[slot]->running()) {
    return on_started(StartResult{});
  }
  // What the failed worker left in its process group goes with it; its pid is reaped.
  workers_[slot]->signal_group(SIGKILL);
  reaper_.forget(workers_[slot]->pid());
  generation_ = generation;
  const int signal_before = last_signal_;
  std::shared_ptr<Launch> launch;
  try {
    launch = prepare_worker(local_rank, workers_[slot]->pid());
  } catch (const std::exception& e) {
    return on_started(StartResult{0, start_error(local_rank, 0, e)});
  }
  auto launched = [this, launch, on_started, signal_before](std::optional<pid_t> forked) {
    try {
      launch_worker(*launch, forked);
    } catch (const std::exception& e) {
      return on_started(StartResult{0, start_error(launch->local_rank, 0, e)});
    }
    Worker& worker = *workers_[static_cast<std::size_t>(launch->local_rank)];
    try {
      worker.confirm_started();
    } catch (const std::exception& e) {  // it runs (its exec failed): its exit is reported too
      return on_started(StartResult{1, start_error(launch->local_rank, worker.pid(), e)});
    }
    if (last_signal_ != signal_before && worker.running()) worker.signal_group(last_signal_);
    on_started(StartResult{1, std::nullopt});
  };
  warm_->spawn_replacement(launch->spawn, [this, launched = std::move(launched), local_rank](
                                              std::optional<pid_t> forked, const std::string& why) {
    if (!forked && warm_->enabled() && options_.notice) {
      options_.notice("ddprun: warm start: the replacement of local rank " +
                      std::to_string(local_rank) + " starts cold: " + why);
    }
    launched(forked);
  });
}

bool ProcessWorkerGroup::kill_worker(int local_rank) {
  const auto slot = static_cast<std::size_t>(local_rank);
  if (slot >= workers_.size() || !workers_[slot]->running()) return false;
  workers_[slot]->signal_group(SIGKILL);
  return true;
}

WorkerFailure ProcessWorkerGroup::failure_of(int local_rank) {
  const Worker& worker = *workers_.at(static_cast<std::size_t>(local_rank));
  WorkerFailure failure;
  failure.host = options_.host;
  failure.local_rank = local_rank;
  failure.rank = elastic::worker_ranks(round_, local_rank).rank;
  failure.pid = worker.pid();
  if (worker.exit()) {
    failure.time = worker.exit()->time;
    failure.exit_code = worker.exit()->exit_code;
    failure.signal = worker.exit()->signal;
  }
  failure.error_file = error_files_.at(static_cast<std::size_t>(local_rank));
  failure.error = read_error_file(failure.error_file);
  return failure;
}

std::vector<WorkerFailure> ProcessWorkerGroup::other_failures(int except) {
  std::vector<WorkerFailure> failures;
  for (auto& worker : workers_) {
    if (worker->local_rank() == except) continue;
    if (worker->poll_exit() && worker->exit()->failed()) {
      failures.push_back(failure_of(worker->local_rank()));
    }
  }
  return failures;
}

}  // namespace ddp::launcher
