#pragma once
// The agent-hosted store: a ddp::store::Server on the agent's event loop at MASTER_PORT, so
// every rank of a PyTorch (env://) or libddp job connects as a client
// (TORCHELASTIC_USE_AGENT_STORE=True) and nothing of the store dies with rank 0.

#include <string>

#include "ddp/launcher/master_endpoint.hpp"
#include "ddp/store/server.hpp"

namespace ddp::launcher {

// The address the agent's store listens on. A one-node job (--nnodes=1) whose MASTER_ADDR
// (--local_addr, else --master_addr) is a loopback address, "localhost" or empty is reached
// only over loopback, so its store listens on that loopback address (127.0.0.1 for
// "localhost" or empty) and no other host can reach it. Any other job listens on every interface
// ("0.0.0.0"), as PyTorch's TCPStore does, because workers on other hosts, or at the address named,
// must reach it.
std::string store_bind_host(const LaunchConfig& config);

// A MasterHostFactory hosting the agent's store. MASTER_ADDR = --local_addr or
// --master_addr. The server listens on store_bind_host(config) at --master_port when given
// (a port in use throws StoreError naming it) or at a port the kernel picks, held for the
// whole job, so no other process can take it between attempts. Each store log line (a
// client closed for a bad request) goes to logger, without a newline; it is called on the
// io_context's thread and must not block (the agent passes one that queues the line on its
// ConsoleWriter). An empty logger writes to stderr, prefixed "ddprun: store: ".
MasterHostFactory agent_store_factory(store::Logger logger = {});

// agent_store_factory() with the stderr logger, as a plain function (the agent's default).
std::unique_ptr<MasterHost> host_agent_store(boost::asio::io_context& io,
                                             const LaunchConfig& config);

}  // namespace ddp::launcher
