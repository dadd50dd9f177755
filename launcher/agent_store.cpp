#include "ddp/launcher/agent_store.hpp"

#include <cstdio>

#include "ddp/store/server.hpp"

namespace ddp::launcher {
namespace {

class AgentStore : public MasterHost {
 public:
  AgentStore(boost::asio::io_context& io, std::string addr, store::ServerOptions options)
      : server_(io, std::move(options)), addr_(std::move(addr)) {}

  MasterEndpoint endpoint() const override {
    return MasterEndpoint{addr_, server_.port(), /*agent_store=*/true};
  }

 private:
  store::Server server_;
  std::string addr_;
};

}  // namespace

std::unique_ptr<MasterHost> host_agent_store(boost::asio::io_context& io,
                                             const LaunchConfig& config) {
  store::ServerOptions options;
  options.host = "0.0.0.0";
  options.port = static_cast<std::uint16_t>(config.master_port.value_or(0));
  options.logger = [](std::string_view line) {
    std::fprintf(stderr, "ddprun: store: %.*s\n", static_cast<int>(line.size()), line.data());
  };
  std::string addr = config.local_addr.empty() ? config.master_addr : config.local_addr;
  return std::make_unique<AgentStore>(io, std::move(addr), std::move(options));
}

}  // namespace ddp::launcher
