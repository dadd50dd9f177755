#pragma once
// --restart_policy=inplace, the agent's side of the protocol with ddprun.inplace (the Python
// package; docs/inplace.md): generations of a round's process group, kept in the round's
// workers' store under ddprun/inplace/<restart count>/. Each request runs on a thread of its
// own (the store may be this agent's loop's), and answers through its callback on that thread:
// the caller posts it to its loop. Internal to the launcher.
//
// Keys, under that prefix (as the program names them: on the wire, PyTorch's client puts a
// "/" before each):
//   generation          the last generation begun (a counter; 0 until a recovery)
//   g<G>/joined         ranks that formed generation G and hold the job's state (a counter)
//   g<G>/done           set by the last of them: generation G has formed
//   g<G>/announced      set here when generation G begins: the ranks that failed
//   g<G>/pg/            generation G's process group (the workers' PrefixStore)

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/elastic/rendezvous.hpp"

namespace ddp::store {
class Client;
}

namespace ddp::launcher {

// The store prefix of a round's in-place generations.
std::string inplace_prefix(const elastic::RoundInfo& round);

class InplaceGenerations {
 public:
  // generation: the one begun (0 when it could not begin); why: why not (empty when it began).
  using Begun = std::function<void(int generation, std::string why)>;
  // why: why the generation did not form (empty when it formed).
  using Formed = std::function<void(std::string why)>;

  InplaceGenerations() = default;
  InplaceGenerations(const InplaceGenerations&) = delete;
  InplaceGenerations& operator=(const InplaceGenerations&) = delete;
  ~InplaceGenerations();  // interrupts what waits, and joins the threads

  // Begins the generation after the current one, for the failed rank: only when the current
  // one has formed (every rank of the round joined it through ddprun.inplace) and no other
  // agent began one meanwhile.
  void begin(const elastic::RoundInfo& round, int rank, Begun done);
  // Waits (at most limit) until every rank has joined generation.
  void watch(const elastic::RoundInfo& round, int generation, std::chrono::milliseconds limit,
             Formed done);

 private:
  void run(std::function<void(store::Client&)> task, const elastic::RoundInfo& round,
           std::function<void(const std::string&)> failed);
  bool stopping();  // the destructor runs: answer nothing more

  std::mutex mutex_;
  bool stopping_ = false;
  std::vector<std::shared_ptr<store::Client>> clients_;  // of the requests that run
  std::vector<std::thread> threads_;
};

}  // namespace ddp::launcher
