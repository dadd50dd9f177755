#include "ddp/launcher/agent.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <system_error>
#include <thread>

#include "agent/agent_machine.hpp"
#include "agent/asio_timers.hpp"
#include "agent/process_worker_group.hpp"
#include "ddp/common/host_name.hpp"
#include "ddp/launcher/device_count.hpp"
#include "ddp/launcher/log_dir.hpp"
#include "ddp/launcher/log_file_errors.hpp"
#include "ddp/launcher/torchelastic_events.hpp"
#include "ddp/launcher/worker_env.hpp"
#include "diagnosis/collective_diagnosis.hpp"
#include "diagnosis/stack_capture.hpp"
#include "diagnosis/trace_events.hpp"
#include "host/rendezvous_host.hpp"
#include "output/console_writer.hpp"
#include "output/outer_error_file.hpp"
#include "process/adopted_processes.hpp"
#include "process/group_reaper.hpp"
#include "process/nccl_profiler_lookup.hpp"
#include "process/numa_binding.hpp"
#include "process/python_probe.hpp"
#include "watch/collective_exchange.hpp"
#include "watch/hang_monitor.hpp"
#include "watch/inplace_generations.hpp"
#include "watch/trace_share.hpp"

namespace ddp::launcher {
namespace fs = std::filesystem;

namespace {

// As torchrun's failure report: socket.getfqdn().
std::string this_host() { return fully_qualified_host_name(); }

// Unique per agent process: "<host>_<pid>_<random>".
std::string make_node_id(const std::string& host) {
  std::random_device random;
  return host + "_" + std::to_string(::getpid()) + "_" + std::to_string(random() % 100000);
}

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

// The real agent: the state machine (agent/agent_machine.hpp) wired to real processes,
// timers, signals, the console and a rendezvous (in-process for one node, a store engine for
// several), all on one Boost.Asio loop.
class Agent::Impl {
 public:
  Impl(boost::asio::io_context& io, LaunchConfig config, WorkerCommand command,
       AgentOptions options)
      : io_(io),
        config_(std::move(config)),
        command_(std::move(command)),
        options_(std::move(options)),
        signals_(io),
        timers_(io),
        host_(this_host()) {}

  ~Impl() {
    if (trace_thread_.joinable()) trace_thread_.join();  // bounded by its store timeouts
    generations_.reset();  // interrupts its waits on the workers' store, joins its threads
    hang_monitor_.reset();
    machine_.reset();
    workers_.reset();  // kills and reaps what still runs
    rendezvous_.reset();
    remove_temp_dir();
  }

  int run() {
    if (!check_binding()) return 1;
    reaper_.emplace();  // before any handler or socket of ours exists to be inherited
    if (config_.restart_policy == RestartPolicy::kNone) {
      adopted_.emplace(io_, *reaper_, [this](pid_t pid) {
        return pid == reaper_->pid() || (workers_ && workers_->owns(pid));
      });
      adopted_->start();
    }
    for (int signal : config_.signals_to_handle) signals_.add(signal);
    if (!handles(SIGUSR1)) signals_.add(SIGUSR1);  // prints the collectives; not forwarded
    wait_for_signal();
    elastic::NodeInfo self{make_node_id(host_),    host_,        config_.local_addr,
                           config_.nproc_per_node, config_.role, std::nullopt};
    RendezvousHostOptions rdzv_options{options_.master_host,
                                       [this](const std::string& line) { notice(line); }};
    rendezvous_ = std::make_unique<RendezvousHost>(io_, config_, self, std::move(rdzv_options));
    prepare_log_root();
    if (needs_omp_default(config_, options_.base_env)) {
      options_.base_env["OMP_NUM_THREADS"] = "1";
      notice(omp_notice());
    }
    if (config_.trace_file) {
      trace_.emplace(monotonic_now_ns(), host_ + " (pid " + std::to_string(::getpid()) + ")");
    }
    start_machine(self.node_id);
    if (trace_) collect_trace();
    io_.run();
    console_.flush();  // the report is queued last; waits for the console to take it all
    remove_temp_dir();
    return exit_code_.value_or(1);
  }

 private:
  // --virtual_local_rank and --numa_binding need a GPU for each worker: said before anything
  // starts, with the CPUs each local rank gets. False: the job cannot run as asked.
  bool check_binding() {
    if (std::string error = virtual_local_rank_error(config_, options_.base_env); !error.empty()) {
      notice("ddprun: " + error);
      return false;
    }
    if (config_.numa_binding.empty()) return true;
    std::vector<int> allowed;
    cpu_set_t set;
    if (::sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &set)) allowed.push_back(cpu);
      }
    }
    try {
      for (const NumaChoice& choice : numa_binding_plan(
               config_.numa_binding, config_.nproc_per_node, gpu_pci_bus_ids(), allowed)) {
        notice("ddprun: --numa_binding=" + config_.numa_binding + ": " + choice.description);
        cpus_of_local_rank_.push_back(choice.cpus);
      }
    } catch (const std::exception& e) {
      notice("ddprun: --numa_binding=" + config_.numa_binding + ": " + e.what() +
             "; run without --numa_binding");
      return false;
    }
    return true;
  }

  // Where logs and error files go. torchrun uses a temp dir when --log_dir is unset; we
  // remove ours at exit unless it holds logs the user asked for.
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

  void start_machine(const std::string& node_id) {
    ProcessWorkerGroupOptions group;
    group.config = config_;
    group.command = command_;
    group.base_env = options_.base_env;
    group.log_root = log_root_;
    group.host = host_;
    group.agent_store = rendezvous_->workers_use_agent_store();
    group.console_out = options_.console_out;
    group.console_err = options_.console_err;
    group.on_output_drained = [this] { post(event::OutputDrained{}); };
    group.notice = [this](const std::string& text) { notice(text); };
    group.log_errors = log_errors_;
    group.cpus_of_local_rank = cpus_of_local_rank_;
    NcclProfilerPlugin nccl_profiler = find_nccl_profiler(options_.base_env);
    if (!nccl_profiler.notice.empty()) notice(nccl_profiler.notice);
    group.nccl_profiler = std::move(nccl_profiler.path);
    if (command_.python) {
      PythonProbeDir probe = find_python_probe(config_.python_probe, options_.base_env);
      if (!probe.notice.empty()) notice(probe.notice);
      group.python_probe_dir = std::move(probe.dir);
    }
    group.keep_leftovers = adopted_.has_value();
    workers_ = std::make_unique<ProcessWorkerGroup>(io_, std::move(group), console_, *reaper_);

    AgentMachineConfig machine;
    machine.job_name = config_.entrypoint;
    machine.node_id = node_id;
    machine.max_restarts = config_.max_restarts;
    machine.workers_run_on = config_.restart_policy == RestartPolicy::kNone;
    machine.replace_in_place = config_.restart_policy == RestartPolicy::kInplace;
    machine.shutdown_timeout = config_.shutdown_timeout;
    AgentMachineContext context;
    context.rendezvous = rendezvous_.get();
    context.workers = workers_.get();
    context.timers = &timers_;
    context.post = [this](AgentEvent event) { post(std::move(event)); };
    context.notice = [this](const std::string& line) { notice(line); };
    if (rendezvous_->serves_worker_stores()) {
      context.open_worker_store = [this] { return rendezvous_->open_worker_store(); };
    }
    context.on_done = [this](AgentOutcome outcome) { stop(std::move(outcome)); };
    if (machine.replace_in_place) {
      generations_ = std::make_unique<InplaceGenerations>();
      context.begin_generation = [this](const elastic::RoundInfo& round, int rank,
                                        std::function<void(int, std::string)> done) {
        generations_->begin(round, rank, std::move(done));
      };
      context.watch_generation = [this](const elastic::RoundInfo& round, int generation,
                                        std::chrono::milliseconds limit,
                                        std::function<void(std::string)> done) {
        generations_->watch(round, generation, limit, std::move(done));
      };
    }
    context.collectives = [this] { return hang_monitor_->summary_now(); };
    if (config_.event_log_handler == "console") events_job_ = event_job();
    if (trace_ || events_job_) {
      context.milestone = [this](const std::string& what, const std::string& detail) {
        if (trace_) trace_milestone(what, detail);
        if (events_job_) event_milestone(what);
      };
    }

    HangMonitorOptions hang;
    hang.hang_timeout = config_.hang_timeout;
    hang.views = [this] { return rank_views(); };
    hang.round = [this] {
      return machine_->state() == AgentMachine::State::kRunning ? machine_->round() : -1;
    };
    hang.attempt_dir = [this] { return workers_->attempt_dir(); };
    hang.on_hung = [post = context.post](int round, WorkerFailure root_cause) {
      post(event::Hung{round, std::move(root_cause)});
    };
    hang.notice = [this](const std::string& line) { notice(line); };
    hang.straggler.window = config_.straggler_window;
    hang.straggler.threshold_s = config_.straggler_threshold_s;
    if (auto ras = options_.base_env.find("NCCL_RAS_ADDR"); ras != options_.base_env.end()) {
      hang.ras_address = ras->second;
    }
    hang.python_stacks = [this](PythonStackCapture::Done done) {
      if (!workers_->capture_python_stacks(done)) done({});
    };
    hang.stop_after = config_.hang_stop_timeout;
    hang.judge = [this](const std::vector<RankView>& views, double timeout_s) {
      return exchange_.judge(views, timeout_s);
    };
    hang_monitor_ = std::make_unique<HangMonitor>(io_, std::move(hang));

    machine_ = std::make_unique<AgentMachine>(std::move(machine), std::move(context));
    machine_->start();
    hang_monitor_->start();
  }

  // Queues event for the state machine on the loop, from any thread: every event reaches
  // handle() this way, never from inside another handler.
  void post(AgentEvent event) {
    boost::asio::post(io_, [this, event = std::move(event)] {
      if (machine_) machine_->handle(event);
    });
  }

  void wait_for_signal() {
    signals_.async_wait([this](boost::system::error_code ec, int signal) {
      if (ec) return;
      if (signal == SIGUSR1 && !handles(SIGUSR1)) {
        print_collectives();
        return wait_for_signal();
      }
      if (adopted_waiting_) {  // a signal ends the wait for what the workers left
        adopted_waiting_ = false;
        adopted_.reset();  // SIGKILLs and reaps them
        return stop(std::move(*adopted_outcome_));
      }
      if (lingering_) {
        // A second signal: end as soon as the engine has (its last calls go to the store
        // this loop serves: stopping the loop now would leave them waiting); a third: now.
        if (hurried_) return io_.stop();
        hurried_ = true;
        rendezvous_->hurry();
        return wait_for_signal();
      }
      if (machine_) machine_->handle(event::Signal{signal});
      wait_for_signal();
    });
  }

  // The end: the report queued after all output, then the loop stops (also ending whatever
  // else runs on it, such as a store server); run() then flushes the console.
  void stop(AgentOutcome outcome) {
    if (trace_ && !trace_written_) return write_trace(std::move(outcome));  // then back here
    if (adopted_ && !adopted_outcome_) return wait_for_adopted(std::move(outcome));
    if (events_job_) final_events(outcome);
    exit_code_ = exit_status(outcome);
    if (auto steps = hang_monitor_->step_summary_now(); !steps.empty()) notice("ddprun: " + steps);
    if (auto incomplete = log_errors_->take_incomplete_files_notice(); !incomplete.empty()) {
      notice(incomplete);
    }
    if (outcome.keep_logs) temp_dir_.clear();  // keep the error files the report points to
    write_outer_error_file(outcome);
    // After a success or a failure every node reports, the others are reading how the round
    // ended from the store this agent may serve: keep it up until they are gone (bounded).
    // After a signal they go on without this node.
    const bool others_read_the_end = outcome.exit_code == 0 || !outcome.report.empty();
    if (!outcome.report.empty()) {
      console_.write_notice(options_.console_err, std::move(outcome.report));
    }
    // Its connection to the store this agent may serve would hold the wait below.
    exchange_.stop();
    if (rendezvous_->hosts_rendezvous_store()) {  // the others may still need the store
      lingering_ = true;                          // a signal ends it
      return rendezvous_->shut_down(others_read_the_end, [this] { io_.stop(); });
    }
    io_.stop();
  }

  // --restart_policy=none: the processes the workers left running are waited for (bounded)
  // before the report; then back to stop.
  void wait_for_adopted(AgentOutcome outcome) {
    adopted_outcome_ = std::move(outcome);
    adopted_waiting_ = true;
    adopted_->wait_all(
        kAdoptedGrace, config_.shutdown_timeout, [this](const std::string& line) { notice(line); },
        [this] {
          if (!adopted_waiting_) return;
          adopted_waiting_ = false;
          stop(std::move(*adopted_outcome_));
        });
  }

  // Every rank of the job as its record shows it: this node's, and what the other nodes'
  // agents shared (only when a local worker records: PyTorch jobs' stores stay untouched).
  std::vector<RankView> rank_views() {
    std::vector<RankView> views = workers_->rank_views();
    if (std::none_of(views.begin(), views.end(), [](const RankView& v) { return v.attached; })) {
      return views;
    }
    exchange_.publish(workers_->round(), views);
    exchange_.append_remote(views);
    return views;
  }

  // The timeline (--trace_file): the ranks' records are read every kTraceInterval, often
  // enough that their rings (256 collectives, 64 steps) do not move on unread.
  static constexpr std::chrono::milliseconds kTraceInterval{50};

  void collect_trace() {
    const int round = workers_->round().round;
    workers_->for_each_record(
        [&](int rank, const record::RecordPage& page) { trace_->collect(round, rank, page); });
    trace_timer_.expires_after(kTraceInterval);
    trace_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec) collect_trace();
    });
  }

  void trace_milestone(const std::string& what, const std::string& detail) {
    const std::uint64_t now = monotonic_now_ns();
    if (what == "rendezvous") {
      rendezvous_began_ns_ = now;
    } else if (what == "round ready" && rendezvous_began_ns_) {
      trace_->agent_span("rendezvous", *rendezvous_began_ns_, now, detail);
      rendezvous_began_ns_.reset();
    } else {
      if (what == "hang" || what == "worker failed" || what == "done") {  // before it goes
        const int round = workers_->round().round;
        workers_->for_each_record(
            [&](int rank, const record::RecordPage& page) { trace_->collect(round, rank, page); });
      }
      trace_->agent_instant(what, now, detail);
    }
  }

  // --event_log_handler=console: torchrun's events, one JSON line each on stderr.
  EventJob event_job() const {
    EventJob job;
    job.run_id = config_.rdzv_id;
    job.role = config_.role;
    job.hostname = host_;
    job.rdzv_backend = config_.rdzv_backend;
    job.entry_point = fs::path(command_.program).filename().string();
    job.max_restarts = config_.max_restarts;
    return job;
  }

  EventAgent event_agent(bool group_known) const {
    EventAgent agent;
    if (!workers_ || workers_->round().members.empty()) return agent;
    const elastic::RoundInfo& round = workers_->round();
    agent.restarts = round.restart_count;
    if (group_known) {
      agent.group_rank = round.group_rank;
      agent.group_world_size = static_cast<int>(round.members.size());
    }
    return agent;
  }

  EventWorker event_worker(int local_rank, pid_t pid) const {
    const elastic::WorkerRanks ranks = elastic::worker_ranks(workers_->round(), local_rank);
    EventWorker worker;
    worker.rank = ranks.rank;
    worker.role_rank = ranks.role_rank;
    worker.role_world_size = ranks.role_world_size;
    worker.local_rank = local_rank;
    worker.pid = pid;
    return worker;
  }

  void event_milestone(const std::string& what) {
    const auto now = std::chrono::steady_clock::now();
    if (what == "rendezvous") {
      event_rendezvous_began_ = now;
    } else if (what == "round ready") {
      const std::chrono::duration<double, std::milli> waited =
          now - event_rendezvous_began_.value_or(now);
      notice(agent_event(*events_job_, event_agent(false), "RENDEZVOUS", waited.count()));
      notice(agent_event(*events_job_, event_agent(false), "ASSIGN_WORKER_RANKS", 0.0));
    } else if (what == "workers started") {
      EventAgent agent = event_agent(true);
      for (const StillRunning& w : workers_->still_running()) {
        notice(worker_event(*events_job_, agent, "START", event_worker(w.local_rank, w.pid)));
      }
    }
  }

  // The end: every worker's state (after a signal torchrun records only the agent's), then the
  // agent's.
  void final_events(const AgentOutcome& outcome) {
    const bool signalled = outcome.signal != 0;
    EventAgent agent = event_agent(true);
    if (workers_ && !workers_->round().members.empty() && !signalled) {
      const int local_world = elastic::worker_ranks(workers_->round(), 0).local_world_size;
      for (int local_rank = 0; local_rank < local_world; ++local_rank) {
        auto failure =
            std::find_if(outcome.failures.begin(), outcome.failures.end(),
                         [&](const WorkerFailure& f) { return f.local_rank == local_rank; });
        EventWorker worker = event_worker(local_rank, workers_->pid_of(local_rank));
        std::string state = outcome.exit_code == 0 ? "SUCCEEDED" : "TERMINATED";
        if (failure != outcome.failures.end()) {
          state = "FAILED";
          worker.exit_code = failure->signal != 0 ? -failure->signal : failure->exit_code;
          worker.failure_pid = failure->pid;
          worker.raw_error = failure->error ? failure->error->message : "{}";
        }
        notice(worker_event(*events_job_, agent, state, worker));
      }
    }
    if (outcome.exit_code == 0) {
      notice(agent_event(*events_job_, agent, "SUCCEEDED"));
    } else {
      notice(agent_event(*events_job_, agent, "FAILED", std::nullopt,
                         outcome.report.empty()
                             ? "ddprun: exit status " + std::to_string(outcome.exit_code)
                             : outcome.report));
    }
  }

  // --trace_file, then stop() again. One node writes its trace. On several nodes whose
  // workers' store an agent serves, the agent of group rank 0 writes the whole job's, on that
  // store host's clock, and the others send it theirs (trace_share.hpp), off the loop: the
  // store may be this loop's. After a signal every node writes its own.
  void write_trace(AgentOutcome outcome) {
    trace_timer_.cancel();
    trace_written_ = true;
    const std::string path = *config_.trace_file;
    const elastic::RoundInfo round = workers_ ? workers_->round() : elastic::RoundInfo{};
    const bool shared =
        round.members.size() > 1 && outcome.signal == 0 && rendezvous_->workers_use_agent_store();
    if (!shared) {
      write_trace_file(path, trace_->json(), std::to_string(trace_->size()) + " events");
      return stop(std::move(outcome));
    }
    LocalTrace local{trace_->json(), trace_->origin_ns(), host_};
    trace_thread_ = std::thread([this, round, local = std::move(local), path,
                                 outcome = std::move(outcome)]() mutable {
      std::function<void()> then;
      try {
        if (round.group_rank == 0) {
          GatheredTrace gathered = gather_traces(round, local);
          then = [this, path, round, gathered = std::move(gathered)] {
            write_trace_file(path, gathered.json, merged_trace_text(round, gathered));
          };
        } else if (send_trace(round, local)) {
          then = [this, round, path] {
            notice("ddprun: this node's timeline went to the agent of group rank 0 (" +
                   round.members.front().host + "), which writes the job's to " + path + " there");
          };
        } else {  // larger than this node's share of what the host gathers
          const std::string own = path + ".group_rank_" + std::to_string(round.group_rank);
          then = [this, own, json = local.json] {
            notice("ddprun: this node's timeline is larger than its share of the merged one (" +
                   std::to_string(kMaxGatheredTrace >> 20) + " MiB for the job); it goes to " +
                   own + " on this node's clock");
            write_trace_file(own, json, "this node's events");
          };
        }
      } catch (const std::exception& e) {
        // The writer keeps the path; the others do not write over its file on a shared disk.
        const std::string own =
            round.group_rank == 0 ? path : path + ".group_rank_" + std::to_string(round.group_rank);
        then = [this, own, json = local.json, why = std::string(e.what())] {
          notice("ddprun: cannot share this node's timeline through the workers' store (" + why +
                 "); it goes to " + own + " on its own clock");
          write_trace_file(own, json, "this node's events");
        };
      }
      boost::asio::post(io_,
                        [this, then = std::move(then), outcome = std::move(outcome)]() mutable {
                          then();
                          stop(std::move(outcome));
                        });
    });
  }

  // "2 nodes on the clock of the workers' store host (10.0.0.1:29500); node-b (group rank 1)
  // +0.213 ms (± 0.041 ms) from this node".
  static std::string merged_trace_text(const elastic::RoundInfo& round,
                                       const GatheredTrace& gathered) {
    std::string text = std::to_string(gathered.nodes.size()) +
                       " nodes on the clock of the workers' store host (" + round.master_addr +
                       ":" + std::to_string(round.master_port) + ")";
    char offset[96];
    for (std::size_t i = 1; i < gathered.nodes.size(); ++i) {
      const NodeTrace& node = gathered.nodes[i];
      std::snprintf(
          offset, sizeof offset, "%+.3f ms (± %.3f ms)",
          static_cast<double>(node.offset_ns - gathered.nodes.front().offset_ns) / 1e6,
          static_cast<double>(node.uncertainty_ns + gathered.nodes.front().uncertainty_ns) / 1e6);
      text += "; " + node.host + " (group rank " + std::to_string(node.group_rank) + ") " + offset +
              " from this node";
    }
    for (int g : gathered.missing) {
      text += "; group rank " + std::to_string(g) + " sent none within " +
              std::to_string(kTraceShareTimeout.count() / 1000) + " s";
    }
    if (!gathered.left_out.empty()) {
      text += "; group ranks " + rank_list(gathered.left_out) +
              " kept their timeline on their node (the merged one holds at most " +
              std::to_string(kMaxGatheredTrace >> 20) + " MiB)";
    }
    return text;
  }

  void write_trace_file(const std::string& path, const std::string& json, const std::string& what) {
    std::ofstream out(path, std::ios::trunc);
    out << json << "\n";
    out.close();
    if (!out) {
      notice("ddprun: cannot write the trace to " + path + ": " + std::strerror(errno));
      return;
    }
    std::string note = "ddprun: the job's timeline is in " + path + " (" + what +
                       "; open it in Perfetto or chrome://tracing)";
    if (trace_->missed() > 0) {
      note += "; " + std::to_string(trace_->missed()) +
              " collectives went by unread (the record rings moved on)";
    }
    if (trace_->cut() > 0) {
      note += "; this node kept its first " + std::to_string(kMaxTraceEvents) +
              " events and cut the " + std::to_string(trace_->cut()) +
              " collective and step spans after them";
    }
    notice(note);
  }

  // As torchrun: a launcher started with TORCHELASTIC_ERROR_FILE (a scheduler that wraps it)
  // gets there the root cause's error file with its "errorCode", or the signal that ended it.
  void write_outer_error_file(const AgentOutcome& outcome) {
    const auto outer = options_.base_env.find("TORCHELASTIC_ERROR_FILE");
    if (outer == options_.base_env.end() || outer->second.empty()) return;
    std::string text;
    std::string what;
    if (outcome.signal != 0) {
      const auto now = std::chrono::system_clock::now().time_since_epoch();
      text = signal_error_file(::getpid(), outcome.signal,
                               std::chrono::duration_cast<std::chrono::seconds>(now).count());
      what = "the signal that stopped ddprun";
    } else if (!outcome.root_error_file.empty()) {
      std::ifstream in(outcome.root_error_file);
      std::stringstream content;
      content << in.rdbuf();
      if (!in) {
        return notice("ddprun: cannot read the root cause's error file " + outcome.root_error_file +
                      " to copy it to " + outer->second +
                      " (TORCHELASTIC_ERROR_FILE): " + std::strerror(errno));
      }
      const WorkerFailure& root = outcome.failures.front();  // ours: the root cause comes first
      text = error_file_with_code(content.str(), root.signal != 0 ? -root.signal : root.exit_code);
      what = "the root cause's error file " + outcome.root_error_file;
    } else {
      return;
    }
    if (auto error = write_error_file(outer->second, text)) {
      notice("ddprun: cannot write " + what + " to " + outer->second +
             " (TORCHELASTIC_ERROR_FILE): " + *error);
    }
  }

  // The process's exit status: torchrun's (0, or 1 for any failure or signal), or with
  // --exit_code=root_cause the job's own (AgentOutcome::exit_code).
  int exit_status(const AgentOutcome& outcome) const {
    if (config_.root_cause_exit_code || outcome.exit_code == 0) return outcome.exit_code;
    return 1;
  }

  bool handles(int signal) const {
    const auto& handled = config_.signals_to_handle;
    return std::find(handled.begin(), handled.end(), signal) != handled.end();
  }

  // kill -USR1 <ddprun>: where every rank's collectives are, and the live stacks of the
  // Python workers that run the probe; the job goes on.
  void print_collectives() {
    std::string view = hang_monitor_ ? hang_monitor_->view_now() : "";
    if (view.empty()) {
      view =
          "kill -USR1: no worker records its collectives (not a libddp program or a PyTorch "
          "job with ddprun's Python probe, or no communicator made yet)";
    }
    const bool taking = workers_ && workers_->capture_python_stacks([this, view](auto stacks) {
      std::string text = "ddprun: " + view;
      if (!stacks.empty()) {
        text += "\nwhere each Python worker is:\n" + indent_lines(group_python_stacks(stacks));
        text.pop_back();  // notice() ends the line
      }
      notice(text);
    });
    if (!taking) notice("ddprun: " + view);
  }

  void notice(const std::string& line) { console_.write_notice(options_.console_err, line + "\n"); }

  boost::asio::io_context& io_;
  LaunchConfig config_;
  WorkerCommand command_;
  AgentOptions options_;
  ConsoleWriter console_;              // every console write of the agent; never blocks the loop
  std::optional<GroupReaper> reaper_;  // kills the groups if this process dies first
  // --restart_policy=none: the processes the workers left, waited for at the end.
  std::optional<AdoptedProcesses> adopted_;
  std::optional<AgentOutcome> adopted_outcome_;  // the outcome, while they are waited for
  bool adopted_waiting_ = false;
  boost::asio::signal_set signals_;
  AsioTimers timers_;
  std::string host_;
  fs::path log_root_;  // <log_dir>/<run_id>_<random>/ (make_run_log_dir)
  fs::path temp_dir_;  // a temp dir of ours to remove at exit; empty when none
  std::unique_ptr<RendezvousHost> rendezvous_;
  std::unique_ptr<ProcessWorkerGroup> workers_;
  std::unique_ptr<AgentMachine> machine_;
  // --restart_policy=inplace: the generations in the workers' store (its threads answer
  // through post, which queues on the loop).
  std::unique_ptr<InplaceGenerations> generations_;
  std::unique_ptr<HangMonitor> hang_monitor_;  // after machine_: destroyed (joined) first
  // Its notices come from its own thread: onto the loop.
  CollectiveExchange exchange_{
      [this](const std::string& line) { boost::asio::post(io_, [this, line] { notice(line); }); },
      config_.hang_timeout};
  std::optional<int> exit_code_;
  std::shared_ptr<LogFileErrors> log_errors_ =
      std::make_shared<LogFileErrors>([this](std::string line) { notice(line); });
  bool lingering_ = false;            // the job is over; the rendezvous store waits for the others
  bool hurried_ = false;              // a signal came while lingering
  std::optional<TraceEvents> trace_;  // --trace_file
  bool trace_written_ = false;
  std::thread trace_thread_;  // sharing the trace with the other nodes (trace_share.hpp)
  boost::asio::steady_timer trace_timer_{io_};
  std::optional<std::uint64_t> rendezvous_began_ns_;  // of the rendezvous under way (trace)
  std::optional<EventJob> events_job_;                // --event_log_handler=console
  std::vector<std::vector<int>> cpus_of_local_rank_;  // --numa_binding
  std::optional<std::chrono::steady_clock::time_point> event_rendezvous_began_;
};

Agent::Agent(LaunchConfig config, WorkerCommand command, AgentOptions options)
    : io_(std::make_unique<boost::asio::io_context>(1)),
      impl_(std::make_unique<Impl>(*io_, std::move(config), std::move(command),
                                   std::move(options))) {}

Agent::~Agent() = default;

boost::asio::io_context& Agent::io_context() { return *io_; }

int Agent::run() { return impl_->run(); }

}  // namespace ddp::launcher
