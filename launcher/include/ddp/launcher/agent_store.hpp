#pragma once
// The agent-hosted store: a ddp::store::Server on the agent's event loop at MASTER_PORT, so
// every rank of a PyTorch (env://) or libddp job connects as a client
// (TORCHELASTIC_USE_AGENT_STORE=True) and nothing of the store dies with rank 0.

#include "ddp/launcher/master_endpoint.hpp"

namespace ddp::launcher {

// MASTER_ADDR = --local_addr or --master_addr. The server listens on every interface, as
// PyTorch's TCPStore does, at --master_port when given (a port in use throws StoreError
// naming it) or at a port the kernel picks, held for the whole job, so no other process can
// take it between attempts. Store log lines go to stderr prefixed "ddprun: store: ".
std::unique_ptr<MasterHost> host_agent_store(boost::asio::io_context& io,
                                             const LaunchConfig& config);

}  // namespace ddp::launcher
