#pragma once
// Shared by the rendezvous engine tests: engines ("nodes") whose callbacks feed one inbox that
// the test's main thread reads, waiting for the events it needs.

#include <algorithm>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

#include "ddp/elastic/rendezvous.hpp"

namespace ddp::test {

using namespace std::chrono_literals;
using namespace ddp::elastic;

// How long a test waits for an outcome that must come.
constexpr auto kOutcome = 20s;

struct Event {
  enum class Kind { kRound, kError, kWait, kStop, kDone };
  std::string node;
  Kind kind;
  RoundInfo round;
  std::string error;
  bool closed_error = false;
  WaitStatus wait;
  StopReason stop;
  bool done = false;
};

// Events from the engines' threads, taken by the main thread.
class Inbox {
 public:
  void push(Event event) {
    {
      std::lock_guard lock(mutex_);
      events_.push_back(std::move(event));
    }
    changed_.notify_all();
  }

  // The first event of this kind from this node, removed from the inbox; waits for it.
  std::optional<Event> take(const std::string& node, Event::Kind kind,
                            std::chrono::milliseconds timeout = kOutcome) {
    std::unique_lock lock(mutex_);
    std::optional<Event> found;
    changed_.wait_for(lock, timeout, [&] {
      for (auto it = events_.begin(); it != events_.end(); ++it) {
        if (it->node == node && it->kind == kind) {
          found = std::move(*it);
          events_.erase(it);
          return true;
        }
      }
      return false;
    });
    return found;
  }

  // How many events of this kind arrived and were not taken (no waiting).
  int count(Event::Kind kind) {
    std::lock_guard lock(mutex_);
    int n = 0;
    for (const auto& event : events_) n += event.kind == kind;
    return n;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Event> events_;
};

struct Job {
  std::string backend = "c10d";
  std::string run_id = "job";
  int min_nodes = 1;
  int max_nodes = 1;
  std::chrono::milliseconds last_call = 300ms;
  std::chrono::milliseconds join = kOutcome;
};

inline RendezvousSettings settings_for(int port, const Job& job, const std::string& name,
                                       std::optional<int> node_rank = std::nullopt) {
  RendezvousSettings s;
  s.backend = job.backend;
  s.run_id = job.run_id;
  s.store_host = "127.0.0.1";
  s.store_port = port;
  s.min_nodes = job.min_nodes;
  s.max_nodes = job.max_nodes;
  s.timeouts.join = job.join;
  s.timeouts.last_call = job.last_call;
  s.timeouts.keep_alive = 200ms;
  s.timeouts.keep_alive_max_attempt = 10;  // 2 s of silence: lost even on a loaded machine
  s.timeouts.read = 10s;
  s.timeouts.exit_barrier = kOutcome;
  s.wait_notice_interval = 100ms;
  s.self.node_id = name;
  s.self.host = "host-" + name;
  s.self.local_world_size = 2;
  s.self.fixed_group_rank = node_rank;
  return s;
}

// One agent's view: its engine, with callbacks feeding the shared inbox.
class Node {
 public:
  Node(Inbox& inbox, RendezvousSettings settings)
      : inbox_(inbox), name_(settings.self.node_id), rdzv_(make_store_rendezvous(settings)) {}

  void next_round(int worker_store_port = 0) {
    rdzv_->next_round(
        worker_store_port,
        [this](RoundInfo round) { push(Event::Kind::kRound, [&](Event& e) { e.round = round; }); },
        [this](std::exception_ptr error) {
          push(Event::Kind::kError, [&](Event& e) {
            try {
              std::rethrow_exception(error);
            } catch (const RendezvousClosedError& closed) {
              e.closed_error = true;
              e.error = closed.what();
            } catch (const std::exception& other) {
              e.error = other.what();
            }
          });
        },
        [this](WaitStatus status) {
          push(Event::Kind::kWait, [&](Event& e) { e.wait = status; });
        });
  }
  void watch() {
    rdzv_->watch_round([this](StopReason reason) {
      push(Event::Kind::kStop, [&](Event& e) { e.stop = reason; });
    });
  }
  void finish() {
    rdzv_->finish_round(
        [this](bool ok) { push(Event::Kind::kDone, [&](Event& e) { e.done = ok; }); });
  }
  Rendezvous& rdzv() { return *rdzv_; }
  // Destroys the engine without leave(): to the others, this node just went silent.
  void crash() { rdzv_.reset(); }

 private:
  template <class F>
  void push(Event::Kind kind, F fill) {
    Event event;
    event.node = name_;
    event.kind = kind;
    fill(event);
    inbox_.push(std::move(event));
  }

  Inbox& inbox_;
  std::string name_;
  std::unique_ptr<Rendezvous> rdzv_;
};

// Starts next_round on every node and returns each node's round.
inline std::map<std::string, RoundInfo> form_round(Inbox& inbox, std::vector<Node*> nodes,
                                                   const std::vector<std::string>& names) {
  for (std::size_t i = 0; i < nodes.size(); ++i) nodes[i]->next_round(6000 + static_cast<int>(i));
  std::map<std::string, RoundInfo> rounds;
  for (const auto& name : names) {
    auto event = inbox.take(name, Event::Kind::kRound);
    if (!event) {
      auto error = inbox.take(name, Event::Kind::kError, 0ms);
      FAIL("no round for node " << name << (error ? ": " + error->error : std::string()));
    }
    rounds[name] = event->round;
  }
  return rounds;
}

inline std::vector<std::string> member_ids(const RoundInfo& round) {
  std::vector<std::string> ids;
  for (const auto& member : round.members) ids.push_back(member.node_id);
  return ids;
}

}  // namespace ddp::test
