#include "process_worker_group.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>

#include "../diagnosis/python_stacks.hpp"
#include "../diagnosis/tool_run.hpp"
#include "ddp/launcher/output_tee.hpp"
#include "ddp/launcher/process_setup.hpp"
#include "ddp/launcher/worker_env.hpp"
#include "worker_start_error.hpp"

namespace ddp::launcher {
namespace fs = std::filesystem;

namespace {

// PyTorch's Flight Recorder (its NCCL process groups): the last collectives of each rank in a
// ring, dumped to <attempt dir>/nccl_trace_rank_<rank> when a collective times out. Both the
// 2.x names and the newer TORCH_FR_ ones; nothing when the user set any of them.
constexpr const char* kFlightRecorderPrefix = "nccl_trace_rank_";

void add_flight_recorder(std::vector<std::string>& env, const fs::path& attempt_dir) {
  static const char* const kNames[] = {
      "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
      "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE"};
  for (const std::string& entry : env) {
    for (const char* name : kNames) {
      if (entry.starts_with(std::string(name) + "=")) return;
    }
  }
  const std::string prefix = (attempt_dir / kFlightRecorderPrefix).string();
  env.push_back("TORCH_NCCL_TRACE_BUFFER_SIZE=2000");
  env.push_back("TORCH_FR_BUFFER_SIZE=2000");
  env.push_back("TORCH_NCCL_DUMP_ON_TIMEOUT=1");
  env.push_back("TORCH_NCCL_DEBUG_INFO_TEMP_FILE=" + prefix);
  env.push_back("TORCH_FR_DUMP_TEMP_FILE=" + prefix);
}

// How long PyTorch's Flight Recorder analyser may take over the dumps of one round.
constexpr std::chrono::seconds kFlightRecorderTimeout{60};

// What the analyser said, for the console: its output indented, or why there is none.
std::string flight_recorder_verdict(const ToolRun& run, const std::string& command) {
  if (run.spawn_error != 0) {
    return "ddprun: could not run PyTorch's Flight Recorder analyser (" + command +
           "): " + std::strerror(run.spawn_error);
  }
  if (run.output.find("No module named") != std::string::npos && !run.succeeded()) {
    return "ddprun: this PyTorch has no Flight Recorder analyser "
           "(torch.distributed.flight_recorder comes with PyTorch 2.6+); with one, run: " +
           command;
  }
  std::string text = "ddprun: PyTorch's Flight Recorder analyser (" + command + ")";
  if (run.timed_out) {
    text += " took longer than " + std::to_string(kFlightRecorderTimeout.count()) +
            " s and was stopped; what it said:";
  } else if (!run.succeeded()) {
    text += " failed (" +
            (run.exited ? "exit code " + std::to_string(run.exit_code) : std::string("signal")) +
            "); what it said:";
  } else {
    text += " says:";
  }
  std::size_t start = 0;
  while (start < run.output.size()) {
    const std::size_t end = std::min(run.output.find('\n', start), run.output.size());
    text += "\n  " + run.output.substr(start, end - start);
    start = end + 1;
  }
  return text;
}

// The last bytes of a log file (a redirected stderr); "" when it cannot be read.
std::string file_tail(const fs::path& path, std::size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::size_t>(std::max<std::streamoff>(in.tellg(), 0));
  const std::size_t from = size > bytes ? size - bytes : 0;
  in.seekg(static_cast<std::streamoff>(from));
  std::string text(size - from, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  return text;
}

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
    : io_(io), options_(std::move(options)), console_(console), reaper_(reaper) {}

ProcessWorkerGroup::~ProcessWorkerGroup() {
  alive_.reset();
  for (auto& worker : workers_) worker->kill_and_reap();
  for (auto& analyser : analysers_) analyser.join();  // bounded by kFlightRecorderTimeout
}

// Every worker of the round, in local rank order; then checks that each exec worked.
void ProcessWorkerGroup::start(const elastic::RoundInfo& round, ExitHandler on_exit) {
  round_ = round;
  workers_.clear();
  records_.clear();
  dumping_.clear();
  stderr_.clear();
  const int local_world = elastic::worker_ranks(round, 0).local_world_size;
  error_files_.assign(static_cast<std::size_t>(local_world), "");
  const fs::path dir = attempt_dir();
  for (int local_rank = 0; local_rank < local_world; ++local_rank) {
    try {
      start_worker(local_rank, dir / std::to_string(local_rank), on_exit);
    } catch (const std::exception& e) {
      throw start_error(local_rank, 0, e);
    }
  }
  for (auto& worker : workers_) {
    try {
      worker->confirm_started();
    } catch (const std::exception& e) {
      throw start_error(worker->local_rank(), worker->pid(), e);
    }
  }
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

void ProcessWorkerGroup::start_worker(int local_rank, const fs::path& dir, ExitHandler on_exit) {
  const bool fresh = fs::create_directories(dir);
  WorkerIdentity identity{local_rank, round_.restart_count, (dir / "error.json").string(),
                          elastic::worker_ranks(round_, local_rank)};
  // A stale file from an earlier run must not be reported; a directory just made has none.
  if (!fresh) fs::remove(identity.error_file);
  const MasterEndpoint master{round_.master_addr, round_.master_port, options_.agent_store};
  SpawnOptions spawn;
  spawn.program = options_.command.program;
  spawn.argv = worker_argv(options_.command, options_.config, local_rank);
  spawn.env = merge_environment(
      options_.base_env, worker_variables(options_.config, master, identity, options_.base_env));
  // The collective record page libddp writes and the hang monitor reads.
  auto record = std::make_unique<RecordMapping>();
  // Python workers print their stacks on a fatal signal (dump_python_stacks), unless the
  // user chose otherwise.
  if (options_.command.python && !options_.base_env.contains("PYTHONFAULTHANDLER")) {
    spawn.env.push_back("PYTHONFAULTHANDLER=1");
  }
  if (options_.command.python) add_flight_recorder(spawn.env, dir.parent_path());
  std::erase_if(spawn.env, [](const std::string& entry) {  // one of an outer ddprun
    return entry.starts_with(std::string(record::kRecordFdVariable) + "=");
  });
  spawn.env.push_back(record->variable());
  spawn.inherit_fd = record->fd();
  // A Python worker's stderr that would be the console goes through the agent (copied as it
  // comes), so that its stack dump can be read back; a terminal stays the worker's own.
  std::shared_ptr<StderrWatch> err;
  if (options_.command.python && faulthandler_on()) {
    err = std::make_shared<StderrWatch>();
    err->local_rank = local_rank;
    err->rank = identity.ranks.rank;
  }
  const bool capture = err && options_.console_err >= 0 && ::isatty(options_.console_err) == 0;
  WorkerStreams streams = open_worker_streams(options_.config, local_rank, dir,
                                              options_.console_out, options_.console_err, capture);
  spawn.stdout_fd = streams.child_out.valid() ? streams.child_out.get() : -1;
  spawn.stderr_fd = streams.child_err.valid() ? streams.child_err.get() : -1;
  if (err) err->file = streams.err_file;

  auto worker = std::make_shared<Worker>(io_, local_rank);
  worker->start(spawn, [this, on_exit, err](Worker& w) {
    on_exit(w.local_rank(), *w.exit());
    if (!err) return;
    err->exited = true;
    report_finished_dumps();
  });
  workers_.push_back(worker);
  reaper_.watch(worker->pid());
  error_files_[static_cast<std::size_t>(local_rank)] = identity.error_file;
  records_.push_back(std::move(record));
  stderr_.push_back(err);
  tee_output(local_rank, streams, err);
}  // the child's ends of pipes and files close here, in the agent

void ProcessWorkerGroup::tee_output(int local_rank, WorkerStreams& streams,
                                    const std::shared_ptr<StderrWatch>& err) {
  const std::string prefix = "[" + options_.config.role + std::to_string(local_rank) + "]:";
  for (WorkerStreams::Tee& tee : streams.tees) {
    ++pending_tees_;
    ConsoleSink sink;
    if (tee.console_fd >= 0) {
      sink = [this, fd = tee.console_fd](std::string line) {
        console_.write_line(fd, std::move(line));
      };
    }
    TeeMode mode;
    mode.raw = tee.raw;
    std::shared_ptr<StderrWatch> watch;
    if (tee.is_stderr && err) {
      watch = err;
      watch->tail = std::make_shared<StreamTail>();
      watch->stream_open = true;
      mode.tail = watch->tail;
    }
    OutputTee::start(
        io_, std::move(tee.read_end), std::move(tee.file), std::move(sink), prefix,
        [this, watch] { on_tee_done(watch); }, TeeLog{tee.file_path.string(), options_.log_errors},
        std::move(mode));
  }
}

void ProcessWorkerGroup::on_tee_done(const std::shared_ptr<StderrWatch>& err) {
  if (err) {
    err->stream_open = false;
    report_finished_dumps();  // before the drained event: the report precedes the job's end
  }
  if (--pending_tees_ == 0 && options_.on_output_drained) options_.on_output_drained();
}

void ProcessWorkerGroup::signal(int signal) {
  for (auto& worker : workers_) {
    if (!worker->running()) continue;
    // Dumping its stack (dump_python_stacks): a SIGTERM now could end the dump half-written;
    // it ends by itself, and SIGKILL (the kill timer, the group's release) still reaches it.
    if (signal != SIGKILL && dumping_.contains(worker->pid())) continue;
    worker->signal_group(signal);
  }
}

void ProcessWorkerGroup::release() {
  for (auto& worker : workers_) {
    worker->signal_group(SIGKILL);  // stragglers in the groups
    reaper_.forget(worker->pid());
  }
}

void ProcessWorkerGroup::for_each_record(
    const std::function<void(int rank, const record::RecordPage& page)>& fn) const {
  for (std::size_t i = 0; i < workers_.size() && i < records_.size(); ++i) {
    fn(elastic::worker_ranks(round_, workers_[i]->local_rank()).rank, records_[i]->page());
  }
}

bool ProcessWorkerGroup::faulthandler_on() const {
  const auto set = options_.base_env.find("PYTHONFAULTHANDLER");
  return set == options_.base_env.end() || !set->second.empty();  // "": turned off by the user
}

void ProcessWorkerGroup::dump_python_stacks() {
  if (!options_.command.python || !faulthandler_on()) return;
  auto dump = std::make_shared<StackDump>();
  dump->attempt_dir = attempt_dir();
  for (auto& worker : workers_) {
    if (!worker->running()) continue;
    const rlimit no_core{0, 0};  // the stack, not a core file of a large process
    ::prlimit(worker->pid(), RLIMIT_CORE, &no_core, nullptr);
    ::kill(worker->pid(), SIGABRT);  // the process only; it ends once the dump is written
    dumping_.insert(worker->pid());
    const auto lr = static_cast<std::size_t>(worker->local_rank());
    if (lr < stderr_.size() && stderr_[lr]) dump->workers.push_back(stderr_[lr]);
  }
  if (!dump->workers.empty()) dumps_.push_back(std::move(dump));
}

void ProcessWorkerGroup::report_finished_dumps() {
  std::erase_if(dumps_, [this](const std::shared_ptr<StackDump>& dump) {
    for (const auto& worker : dump->workers) {
      if (worker->stream_open || !worker->exited) return false;
    }
    report_dump(*dump);
    return true;
  });
}

// "ddprun: where each Python worker was ..." with the ranks grouped by stack, and one file
// per rank: <attempt dir>/<local rank>/python_stack.txt.
void ProcessWorkerGroup::report_dump(const StackDump& dump) const {
  std::vector<PythonStack> stacks;
  for (const auto& worker : dump.workers) {
    PythonStack stack;
    stack.rank = worker->rank;
    stack.local_rank = worker->local_rank;
    if (worker->tail) {
      stack.dump = last_faulthandler_dump(worker->tail->text());
    } else if (!worker->file.empty()) {
      stack.dump = last_faulthandler_dump(file_tail(worker->file, StreamTail::kDefaultCapacity));
    } else {
      stack.error =
          "its stderr is a terminal, which ddprun leaves to the worker: the stack is "
          "printed above";
    }
    if (stack.dump.empty() && stack.error.empty()) {
      stack.error =
          "no faulthandler dump on its stderr (does the program handle SIGABRT "
          "itself?)";
    }
    if (!stack.dump.empty()) {
      std::ofstream(dump.attempt_dir / std::to_string(stack.local_rank) / "python_stack.txt")
          << stack.dump;
    }
    stacks.push_back(std::move(stack));
  }
  if (!options_.notice) return;
  std::string text = "ddprun: where each Python worker was when it was stopped (faulthandler):\n";
  const std::string grouped = group_python_stacks(stacks);
  std::size_t start = 0;
  while (start < grouped.size()) {
    const std::size_t end = grouped.find('\n', start);
    text += "  " + grouped.substr(start, end - start) + "\n";
    start = end == std::string::npos ? grouped.size() : end + 1;
  }
  text +=
      "  (each rank's stack: " + (dump.attempt_dir / "<local_rank>" / "python_stack.txt").string() +
      ")";
  options_.notice(text);
}

void ProcessWorkerGroup::analyse_flight_recorder() {
  std::error_code ec;
  std::vector<std::string> dumps;
  for (const auto& entry : fs::directory_iterator(attempt_dir(), ec)) {
    if (entry.path().filename().string().starts_with(kFlightRecorderPrefix)) {
      dumps.push_back(entry.path().string());
    }
  }
  if (dumps.empty()) return;
  std::sort(dumps.begin(), dumps.end());
  std::string note =
      "ddprun: PyTorch's Flight Recorder left " + std::to_string(dumps.size()) + " dump(s):";
  for (const auto& dump : dumps) note += " " + dump;
  if (options_.notice) options_.notice(note);
  if (!options_.command.python) return;
  // python -m torch.distributed.flight_recorder.fr_trace <dir> --prefix <prefix> (2.6+)
  const std::vector<std::string> argv = {
      options_.command.program, "-m",       "torch.distributed.flight_recorder.fr_trace",
      attempt_dir().string(),   "--prefix", kFlightRecorderPrefix};
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
      on_tee_done(nullptr);
    });
  });
}

bool ProcessWorkerGroup::request_abort() {
  bool nccl = false;
  for (std::size_t i = 0; i < workers_.size() && i < records_.size(); ++i) {
    if (!workers_[i]->running() || !records_[i]->attached()) continue;
    records_[i]->request_stop();
    const std::uint64_t backend = records_[i]->page().backend.load(std::memory_order_relaxed);
    if (backend == record::pack_name("nccl")) nccl = true;
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

std::vector<StillRunning> ProcessWorkerGroup::still_running() const {
  std::vector<StillRunning> running;
  for (const auto& worker : workers_) {
    if (!worker->running()) continue;
    running.push_back({elastic::worker_ranks(round_, worker->local_rank()).rank,
                       worker->local_rank(), worker->pid()});
  }
  return running;
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
