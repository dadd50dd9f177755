#pragma once
// The agent's view of a rendezvous: how several ddprun agents (one per node) agree on a
// world, learn that the world must change, and agree that the job is done.
//
// This header is the contract between the agent's state machine (launcher/agent/) and the
// rendezvous engine (rendezvous/elastic/). The agent never touches the network itself: a
// Rendezvous runs its own thread(s) and reports every outcome through a callback, which the
// agent posts onto its event loop. Tests of the agent use a fake Rendezvous; tests of the
// engine use MemoryStore.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::elastic {

// torchrun's --rdzv_conf keys, with its defaults.
struct RendezvousTimeouts {
  std::chrono::milliseconds join{std::chrono::seconds(600)};      // join_timeout / timeout
  std::chrono::milliseconds last_call{std::chrono::seconds(30)};  // last_call_timeout
  std::chrono::milliseconds close{std::chrono::seconds(30)};      // close_timeout
  std::chrono::milliseconds keep_alive{std::chrono::seconds(5)};  // keep_alive_interval
  int keep_alive_max_attempt = 3;                                 // keep_alive_max_attempt
  std::chrono::milliseconds read{std::chrono::seconds(60)};       // read_timeout (store ops)
  // How long finish_round waits for the other nodes (torchrun's exit barrier timeout).
  std::chrono::milliseconds exit_barrier{std::chrono::seconds(300)};
};

// What one node brings to a round.
struct NodeInfo {
  std::string node_id;       // unique per agent process: "<host>_<pid>_<random>"
  std::string host;          // for humans and reports (hostname or --local_addr)
  std::string addr;          // address other nodes reach this node at (MASTER_ADDR if rank 0);
                             // empty: the local address of the engine's store connection
  int local_world_size = 1;  // --nproc_per_node on this node
  std::string role = "default";
  std::optional<int> fixed_group_rank;  // static backend: --node_rank
};

// One node of a completed round, in group-rank order.
struct Member {
  std::string node_id;
  std::string host;
  std::string addr;
  int local_world_size = 1;
  std::string role;
};

// A completed round, as seen by one node.
struct RoundInfo {
  int round = 0;                // 0, 1, 2, ... (every restart and membership change is a round)
  int restart_count = 0;        // TORCHELASTIC_RESTART_COUNT: rounds that followed a worker failure
  int group_rank = 0;           // GROUP_RANK of this node
  std::vector<Member> members;  // GROUP_WORLD_SIZE = members.size(), by group rank
  std::string master_addr;      // MASTER_ADDR: the workers' store for this round
  int master_port = 0;          // MASTER_PORT
};

// The ranks of one worker, computed from a RoundInfo as torchrun 2.x does
// (torch/distributed/elastic/agent/server/api.py, _assign_worker_ranks).
struct WorkerRanks {
  int rank = 0;              // RANK: sum of local world sizes of lower group ranks + local rank
  int world_size = 0;        // WORLD_SIZE
  int role_rank = 0;         // ROLE_RANK: the same, counting only members with this role
  int role_world_size = 0;   // ROLE_WORLD_SIZE
  int local_world_size = 0;  // LOCAL_WORLD_SIZE
  int group_rank = 0;        // GROUP_RANK
  int group_world_size = 0;  // GROUP_WORLD_SIZE
};
WorkerRanks worker_ranks(const RoundInfo& round, int local_rank);

// Why a running round ends, as every node learns it (the first reason set wins).
// A worker as a failure report names it: the one record of a failed worker that a StopReason
// carries between nodes and the launcher's WorkerFailure extends (failure_report.hpp).
struct WorkerRecord {
  std::string host;
  int rank = 0;
  int local_rank = 0;
  int pid = 0;
  int exit_code = 0;  // exit code, or 0 when killed by a signal
  int signal = 0;     // terminating signal, or 0
  std::string error_file;
};

struct StopReason : WorkerRecord {
  enum class Kind {
    kWorkerFailed,  // a worker failed on some node; counts against --max_restarts
    kHung,          // ddprun found the job hung (--hang_timeout) and named a rank; counts too
    kNodeLost,      // a node's heartbeat went stale (killed, machine lost)
    kNodeJoined,    // a new node waits to join, and the round has room for it
    kNodeLeft,      // an agent left on a signal (pre-emption)
  };
  StopReason() {
    rank = -1;
    local_rank = -1;
  }
  Kind kind = Kind::kWorkerFailed;
  std::string node_id;  // the node it happened on (host: WorkerRecord's)
  // kWorkerFailed, kHung: the root cause (the record), enough for every node's failure
  // report; message: from the torchelastic error file (kHung: the hang's report), if any.
  std::string message;

  // A worker failure or a hang: counted against --max_restarts.
  bool failed() const { return kind == Kind::kWorkerFailed || kind == Kind::kHung; }
};
std::string describe(const StopReason& reason);  // one line for humans

class RendezvousError : public std::runtime_error {  // join timeout, store unreachable, ...
 public:
  using std::runtime_error::runtime_error;
};
class RendezvousClosedError : public RendezvousError {  // the job already finished
 public:
  using RendezvousError::RendezvousError;
};

// Progress while waiting for a round, for the one-line "waiting for ..." notice.
struct WaitStatus {
  int joined = 0;  // nodes in the round so far
  int min_nodes = 0;
  int max_nodes = 0;
  std::string endpoint;  // "host:port" of the rendezvous store
  std::chrono::milliseconds waited{0};
  bool wait_listed = false;  // a round runs without this node (full, or it is restarting into
                             // a larger world): it waits for the next round; joined is 0
  // MIN nodes joined but not MAX: the last call, after which the round closes with the nodes
  // it has (last_call_timeout); this is what is left of it. Empty otherwise.
  std::optional<std::chrono::milliseconds> last_call_left;
};

// Every method is called from the agent's thread and returns at once; results arrive through
// the callbacks, called from the engine's thread(s): the agent must post them to its loop.
// Callbacks of a round that the agent has already left are not delivered after stop_round()
// / leave() returned.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;

  // Joins the next round (the first, or the one after the running round ended). Calls
  // on_round once it closes, or on_error (RendezvousError, RendezvousClosedError) when it
  // cannot be formed (join timeout, fewer than MIN nodes left, store lost). on_wait may be
  // called every few seconds while waiting.
  // worker_store_port: the port of the fresh store this node serves to workers if it becomes
  // group rank 0 of the round (c10d); 0 when the round's master is fixed (static: the
  // rendezvous store itself at --master_addr:--master_port).
  virtual void next_round(int worker_store_port, std::function<void(RoundInfo)> on_round,
                          std::function<void(std::exception_ptr)> on_error,
                          std::function<void(WaitStatus)> on_wait) = 0;

  // While the round runs: on_stop is called once, when the round must end (set by any node,
  // this one included), with the reason every node agreed on.
  virtual void watch_round(std::function<void(StopReason)> on_stop) = 0;

  // This node's workers failed: end the round for everybody with this reason (unless another
  // reason was set first; watch_round reports whichever won).
  virtual void stop_round(StopReason reason) = 0;

  // This node's workers all succeeded. on_done(true) once every node of the round succeeded
  // (the exit barrier; the rendezvous is then closed to late nodes); on_done(false) if the
  // round was stopped instead (watch_round also reports why), or the barrier timed out.
  virtual void finish_round(std::function<void(bool all_succeeded)> on_done) = 0;

  // The agent got a signal: leave the rendezvous so the others can go on without this node.
  // Best effort and bounded; returns when done.
  virtual void leave() = 0;

  // "host:port" of the rendezvous store, for messages.
  virtual std::string endpoint() const = 0;
};

// How an agent meets the others through a c10d store (the static and c10d backends).
// --rdzv_backend=etcd: the etcd cluster that keeps the rendezvous state.
struct EtcdSettings {
  std::string endpoints;  // "host:port[,host:port...]": the members' client addresses
  bool tls = false;       // protocol=https
  std::string cacert;     // PEM paths (TLS)
  std::string cert;
  std::string key;
  std::string user;  // etcd auth
  std::string password;
};

struct RendezvousSettings {
  std::string backend = "static";  // "static": min = max = --nnodes, group rank = node_rank,
                                   // the workers use the rendezvous store; "c10d": dynamic;
                                   // "etcd" (or "etcd-v2"): dynamic, the state in etcd
  std::string run_id = "none";     // --rdzv_id: every key lives under /ddprun/<run_id>/
  std::string store_host;          // the rendezvous store (hosted by some agent); etcd: the
                                   // host of the first endpoint (for local addresses)
  int store_port = 0;
  EtcdSettings etcd;  // etcd only
  int min_nodes = 1;
  int max_nodes = 1;
  RendezvousTimeouts timeouts;
  NodeInfo self;
  // How often on_wait is called while a node waits for a round (the first time after one
  // interval, so a quick rendezvous prints nothing).
  std::chrono::milliseconds wait_notice_interval{std::chrono::seconds(3)};
  // A line for the console (warnings such as etcd losing its quorum); may be empty. Called
  // on the engine's threads.
  std::function<void(const std::string&)> notice;
};

// The engine over a store: a TCP store (static, c10d) or etcd (etcd, etcd-v2: settings.etcd).
// Connects (retrying with back-off until timeouts.join, then a RendezvousError naming where it
// tried and for how long) on its own thread.
//
// Protocol (docs/elastic.md, "How rounds work"): every key lives under /ddprun/<run_id>/.
// `state` holds the rounds as JSON, changed only by compare-and-set (round_state.hpp is the
// pure logic); `hb/<node_id>` says the node lives: a counter ADDed every keep_alive and judged
// stale on the observer's own clock (TCP store), or a key bound to the node's lease (etcd);
// `round_<r>/closed` is set when round r closes;
// `round_<r>/end` says how running round r ended, first writer wins (a StopReason, or
// finished once the exit barrier counter `round_<r>/done` reached every member).
// Threads: heartbeats; one for next_round / stop_round / finish_round (in call order); one
// for watch_round. Each has its own store client. Callbacks must not call leave().
// Throws RendezvousError at once for invalid settings (backend, MIN:MAX, static without a
// fixed_group_rank). An empty self.node_id gets "<host>_<pid>_<random>".
std::unique_ptr<Rendezvous> make_store_rendezvous(RendezvousSettings settings);

}  // namespace ddp::elastic
