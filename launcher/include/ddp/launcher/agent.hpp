#pragma once
// The single-node agent: starts the worker group, watches it on one Boost.Asio event loop
// (child exits, output pipes, signals, timers; nothing sleeps or polls), stops the group on
// a failure or a signal, restarts it while --max_restarts allows, and reports.

#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <map>
#include <memory>
#include <string>

#include "ddp/launcher/launch_config.hpp"
#include "ddp/launcher/agent_store.hpp"
#include "ddp/launcher/master_endpoint.hpp"
#include "ddp/launcher/worker_command.hpp"

namespace ddp::launcher {

struct AgentOptions {
  MasterHostFactory master_host = host_agent_store;  // who serves MASTER_PORT
  std::map<std::string, std::string> base_env;  // the workers' environment before the contract
  int console_out = STDOUT_FILENO;  // inherited by workers; teed stdout lines go here
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
  // every worker succeeded, the root cause's status (exit code, or 128+signal) when the
  // group failed with no restarts left, 128+signal when the agent got a handled signal.
  // Throws SpawnError / std::system_error when a worker cannot be started. Call once.
  int run();

 private:
  class Impl;
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::launcher
