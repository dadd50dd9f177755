#pragma once
// MASTER_ADDR / MASTER_PORT of a job, and who hosts the store there. One small, replaceable
// step of the agent: the agent-hosted store (host_agent_store in agent_store.hpp, a
// ddp::store::Server on the agent's io_context) is the MasterHost ddprun uses;
// AgentOptions::master_host can name another.

#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <string>

#include "ddp/launcher/launch_config.hpp"

namespace ddp::launcher {

struct MasterEndpoint {
  std::string addr;          // MASTER_ADDR
  int port = 0;              // MASTER_PORT
  bool agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE: the agent serves a store there
};

// Owns whatever serves MASTER_PORT for as long as the job runs (nothing, or a store server).
class MasterHost {
 public:
  virtual ~MasterHost() = default;
  virtual MasterEndpoint endpoint() const = 0;
  // A new round is about to start its workers, every worker of the last one has exited: a
  // store there forgets the last round's keys (PyTorch 2.x no longer prefixes them with the
  // attempt, so a restarted Gloo group would read the last attempt's addresses).
  virtual void new_round() {}
};

// Makes the job's MasterHost. Called once per agent, on the agent's thread, before the first
// worker starts; it may put asynchronous work (a server) on io_context.
using MasterHostFactory =
    std::function<std::unique_ptr<MasterHost>(boost::asio::io_context&, const LaunchConfig&)>;

}  // namespace ddp::launcher
