#pragma once
// Fakes of the agent's collaborators for in-process tests of AgentMachine: a rendezvous the
// test drives, a worker group that starts nothing, timers the test moves by hand.

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent/agent_timers.hpp"
#include "agent/worker_group.hpp"
#include "agent/worker_start_error.hpp"
#include "ddp/elastic/rendezvous.hpp"

namespace ddp::launcher::test {

using elastic::RoundInfo;
using elastic::StopReason;

// A rendezvous the test drives: it records calls and keeps the callbacks of every round.
class FakeRendezvous : public ddp::elastic::Rendezvous {
 public:
  struct Round {
    int worker_store_port = 0;
    std::function<void(RoundInfo)> on_round;
    std::function<void(std::exception_ptr)> on_error;
    std::function<void(ddp::elastic::WaitStatus)> on_wait;
    std::function<void(StopReason)> on_stop;
    std::function<void(bool)> on_done;
  };
  std::vector<Round> rounds;  // one per next_round call
  std::vector<StopReason> stopped;
  int left = 0;

  void next_round(int port, std::function<void(RoundInfo)> on_round,
                  std::function<void(std::exception_ptr)> on_error,
                  std::function<void(ddp::elastic::WaitStatus)> on_wait) override {
    rounds.push_back({port, std::move(on_round), std::move(on_error), std::move(on_wait), {}, {}});
  }
  void watch_round(std::function<void(StopReason)> on_stop) override {
    rounds.back().on_stop = std::move(on_stop);
  }
  void stop_round(StopReason reason) override { stopped.push_back(std::move(reason)); }
  void finish_round(std::function<void(bool)> on_done) override {
    rounds.back().on_done = std::move(on_done);
  }
  void leave() override { ++left; }
  std::string endpoint() const override { return "10.0.0.1:29500"; }

  Round& last() { return rounds.back(); }
};

// A worker group that starts nothing: the test says when workers exit.
class FakeWorkers : public WorkerGroup {
 public:
  std::vector<RoundInfo> starts;
  std::vector<ExitHandler> handlers;  // by start
  std::vector<int> signals;
  int released = 0;
  std::map<int, WorkerExit> exits;  // of the current round, by local rank
  std::set<int> failed_unreported;  // failed, exit event not delivered yet
  bool pending_output = false;
  bool nccl_workers = false;  // what request_abort answers
  int abort_requests = 0;
  // The next start fails at this local rank, after starting the ranks below it.
  std::optional<int> fail_start_at;
  // The next start waits (as for the warm template) until finish_start().
  bool hold_start = false;
  StartedHandler held;  // the start that waits

  void start(const RoundInfo& round, ExitHandler on_exit, StartedHandler on_started) override {
    starts.push_back(round);
    handlers.push_back(std::move(on_exit));
    exits.clear();
    const int local_world = ddp::elastic::worker_ranks(round, 0).local_world_size;
    if (std::exchange(hold_start, false)) {
      held = std::move(on_started);
      return;
    }
    if (auto rank = std::exchange(fail_start_at, std::nullopt)) {
      WorkerFailure f;
      f.host = "host-a";
      f.local_rank = *rank;
      f.rank = ddp::elastic::worker_ranks(round, *rank).rank;
      f.exit_code = 1;
      f.error = ErrorFileContent{
          "could not start the worker of local_rank " + std::to_string(*rank) + ": no space left",
          ""};
      return on_started({*rank, WorkerStartError(f, *rank)});
    }
    on_started({local_world, std::nullopt});
  }
  // The held start ends with `started` workers.
  void finish_start(int started) {
    if (auto done = std::exchange(held, nullptr)) done({started, std::nullopt});
  }
  void signal(int signal) override { signals.push_back(signal); }
  void release() override { ++released; }
  // --restart_policy=inplace: (local rank, generation) of each replacement; it starts unless
  // replace_fails.
  std::vector<std::pair<int, int>> replaced;
  bool replace_fails = false;
  std::vector<int> killed;  // kill_worker's local ranks
  bool kill_worker(int local_rank) override {
    killed.push_back(local_rank);
    return true;
  }
  void replace(int local_rank, int generation, StartedHandler on_started) override {
    replaced.emplace_back(local_rank, generation);
    exits.erase(local_rank);
    on_started({replace_fails ? 0 : 1, std::nullopt});
  }
  WorkerFailure failure_of(int local_rank) override {
    WorkerFailure f;
    f.host = "host-a";
    f.local_rank = local_rank;
    f.rank = ddp::elastic::worker_ranks(starts.back(), local_rank).rank;
    f.pid = 1000 + local_rank;
    if (exits.contains(local_rank)) {
      f.exit_code = exits[local_rank].exit_code;
      f.signal = exits[local_rank].signal;
    } else {
      f.exit_code = 9;  // failed_unreported
    }
    return f;
  }
  std::vector<WorkerFailure> other_failures(int except) override {
    std::vector<WorkerFailure> out;
    for (int rank : failed_unreported) {
      if (rank != except) out.push_back(failure_of(rank));
    }
    return out;
  }
  std::vector<StillRunning> still_running() const override { return {}; }
  bool output_pending() const override { return pending_output; }
  bool request_abort() override {
    ++abort_requests;
    return nccl_workers;
  }

  // Worker local_rank of the latest start exits.
  void exit(int local_rank, int code, int signal = 0) {
    WorkerExit e{code, signal, std::chrono::system_clock::now()};
    exits[local_rank] = e;
    handlers.back()(local_rank, e);
  }
};

class FakeTimers : public AgentTimers {
 public:
  Clock::time_point now_{};
  std::map<TimerId, std::pair<Clock::time_point, std::function<void()>>> armed;

  Clock::time_point now() const override { return now_; }
  void start(TimerId id, std::chrono::milliseconds after, std::function<void()> fn) override {
    armed[id] = {now_ + after, std::move(fn)};
  }
  void cancel(TimerId id) override { armed.erase(id); }
  bool is_armed(TimerId id) const { return armed.contains(id); }

  void advance(std::chrono::milliseconds by) {
    now_ += by;
    for (auto it = armed.begin(); it != armed.end();) {
      if (it->second.first <= now_) {
        auto fn = std::move(it->second.second);
        it = armed.erase(it);
        fn();
      } else {
        ++it;
      }
    }
  }
};

}  // namespace ddp::launcher::test
