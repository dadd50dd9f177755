#pragma once
// The agent of one node: joins rounds through a rendezvous (in-process for --nnodes=1, the
// store engine of ddp/elastic/rendezvous.hpp for several nodes), starts each round's workers
// with the round's ranks, watches them on one Boost.Asio event loop (child exits, output
// pipes, signals, timers, rendezvous results posted from its threads; nothing sleeps or
// polls), stops them on a failure, a stop of the round from another node or a signal,
// restarts while --max_restarts allows, and reports. The logic is AgentMachine
// (launcher/agent/agent_machine.hpp); this class wires it to real processes.

#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <map>
#include <memory>
#include <string>

#include "ddp/launcher/agent_store.hpp"
#include "ddp/launcher/launch_config.hpp"
#include "ddp/launcher/master_endpoint.hpp"
#include "ddp/launcher/worker_command.hpp"

namespace ddp::launcher {

struct AgentOptions {
  // One node: who serves MASTER_PORT. Empty: the agent's own store (agent_store_factory),
  // its log lines through the agent's console writer.
  MasterHostFactory master_host;
  std::map<std::string, std::string> base_env;  // the workers' environment before the contract
  int console_out = STDOUT_FILENO;              // inherited by workers; teed stdout lines go here
  int console_err = STDERR_FILENO;  // inherited by workers; teed stderr lines, notices, report
};

class Agent {
 public:
  Agent(LaunchConfig config, WorkerCommand command, AgentOptions options);
  ~Agent();  // kills (SIGKILL, whole process groups) and reaps any worker still running
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // The agent's event loop, for things that live beside the workers (the store server).
  // run() drives it; it must not be run from another thread.
  boost::asio::io_context& io_context();

  // Runs the job to its end on the calling thread and returns ddprun's exit status: 0 when
  // every worker (of every node) succeeded, the root cause's status (exit code, or
  // 128+signal; on any node) when the group failed with no restarts left, 128+signal when the
  // agent got a handled signal, 1 when the rendezvous failed. A worker that cannot be
  // started is a failure of the round (restarted while restarts remain; then exit 1 with a
  // report naming it and the cause). Throws std::system_error when the log directory cannot
  // be made at the start, UsageError for rendezvous options it cannot use (--rdzv_conf
  // values, a c10d job without --rdzv_endpoint). Call once.
  int run();

 private:
  class Impl;
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::launcher
