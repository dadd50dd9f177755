#pragma once
// MASTER_ADDR / MASTER_PORT of a job, and who hosts the store there. One small, replaceable
// step of the agent: today it reserves a free port that rank 0 of a PyTorch job binds its
// own TCPStore to; an agent-hosted store (ddp::store::Server on the agent's io_context)
// plugs in as another MasterHost and sets agent_store.

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
};

// Makes the job's MasterHost. Called once per agent, on the agent's thread, before the first
// worker starts; it may put asynchronous work (a server) on io_context.
using MasterHostFactory =
    std::function<std::unique_ptr<MasterHost>(boost::asio::io_context&, const LaunchConfig&)>;

// The default: MASTER_ADDR = --local_addr or --master_addr; MASTER_PORT = --master_port when
// given, else a port the kernel reports free (bound and released, as torchrun does);
// agent_store = false. Throws std::system_error when no port can be bound.
std::unique_ptr<MasterHost> reserve_master_port(boost::asio::io_context& io,
                                                const LaunchConfig& config);

}  // namespace ddp::launcher
