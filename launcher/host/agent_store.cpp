#include "ddp/launcher/agent_store.hpp"

#include <boost/asio/ip/address.hpp>
#include <cstdio>

#include "host/store_admission.hpp"

namespace ddp::launcher {
namespace {

class AgentStore : public MasterHost {
 public:
  AgentStore(boost::asio::io_context& io, std::string addr, store::ServerOptions options)
      : server_(io, std::move(options)), addr_(std::move(addr)) {}

  MasterEndpoint endpoint() const override {
    return MasterEndpoint{addr_, server_.port(), /*agent_store=*/true};
  }
  void new_round() override { server_.clear_keys(); }

 private:
  store::Server server_;
  std::string addr_;
};

// MASTER_ADDR as the workers get it.
std::string master_addr(const LaunchConfig& config) {
  return config.local_addr.empty() ? config.master_addr : config.local_addr;
}

void log_to_stderr(std::string_view line) {
  std::fprintf(stderr, "ddprun: store: %.*s\n", static_cast<int>(line.size()), line.data());
}

std::unique_ptr<MasterHost> make_agent_store(boost::asio::io_context& io,
                                             const LaunchConfig& config, store::Logger logger) {
  store::ServerOptions options;
  options.host = store_bind_host(config);
  // On every address, yet only this host's workers use it.
  if (options.host == "0.0.0.0" && !config.store_allow_any) options.admission = admit_this_host();
  options.port = static_cast<std::uint16_t>(config.master_port.value_or(0));
  options.logger = logger ? std::move(logger) : store::Logger(log_to_stderr);
  options.clock_key = store::kClockKey;  // the reference clock of a job-wide --trace_file
  return std::make_unique<AgentStore>(io, master_addr(config), std::move(options));
}

}  // namespace

std::string store_bind_host(const LaunchConfig& config) {
  constexpr const char* kEveryInterface = "0.0.0.0";
  if (config.max_nodes != 1) return kEveryInterface;
  const std::string addr = master_addr(config);
  if (addr.empty() || addr == "localhost") return "127.0.0.1";
  boost::system::error_code ec;
  auto ip = boost::asio::ip::make_address(addr, ec);
  if (ec || !ip.is_loopback()) return kEveryInterface;
  return ip.to_string();  // 127.0.0.2 too: the address the workers will use
}

MasterHostFactory agent_store_factory(store::Logger logger) {
  return [logger = std::move(logger)](boost::asio::io_context& io, const LaunchConfig& config) {
    return make_agent_store(io, config, logger);
  };
}

std::unique_ptr<MasterHost> host_agent_store(boost::asio::io_context& io,
                                             const LaunchConfig& config) {
  return make_agent_store(io, config, {});
}

}  // namespace ddp::launcher
