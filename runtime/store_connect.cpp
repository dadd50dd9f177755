// Connecting to the launcher's TCP store, as PyTorch's env:// does: the agent's store when
// TORCHELASTIC_USE_AGENT_STORE=True, otherwise rank 0 hosts one on MASTER_PORT.
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <thread>

#include "backends.hpp"
#include "ddp/common/worker_contract.hpp"
#include "ddp/store/client.hpp"
#include "ddp/store/server.hpp"

namespace ddp::detail {

namespace {

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1";
}

// A store server on its own io_context thread, for rank 0 when the agent hosts none.
class HostedStore {
 public:
  HostedStore(const std::string& host, std::uint16_t port) {
    store::ServerOptions options;
    options.host = host;
    options.port = port;
    server_ = std::make_unique<store::Server>(io_, options);
    thread_ = std::thread([this] { io_.run(); });
  }
  ~HostedStore() {
    boost::asio::post(io_, [this] {
      server_->close();
      io_.stop();
    });
    thread_.join();
  }
  HostedStore(const HostedStore&) = delete;
  HostedStore& operator=(const HostedStore&) = delete;

 private:
  boost::asio::io_context io_;
  std::unique_ptr<store::Server> server_;
  std::thread thread_;  // runs io_; joined before io_ and server_ go
};

std::optional<store::Dialect> choose_dialect(const LaunchEnv& env) {
  auto name = get_env(contract::kStoreDialect);
  if (name && (*name == "v1" || *name == "1")) return store::Dialect::V1;
  if (name && (*name == "v2" || *name == "2")) return store::Dialect::V2;
  if (name && *name == "auto") return std::nullopt;
  if (name && !name->empty()) {
    throw EnvError("DDP_STORE_DIALECT='" + *name + "' is not one of v1, v2, auto");
  }
  // An agent's store may be torchrun 1.x's (1.x dialect only): probe it. A store we host
  // ourselves speaks both; use the newer dialect.
  if (env.use_agent_store) return std::nullopt;
  return store::Dialect::V2;
}

}  // namespace

std::shared_ptr<store::Store> connect_client(const LaunchEnv& env, const InitOptions& options) {
  store::ClientOptions client;
  client.host = is_loopback(env.master_addr) ? "127.0.0.1" : env.master_addr;
  client.port = static_cast<std::uint16_t>(env.master_port);
  client.connect_timeout = options.init_timeout;
  try {
    client.dialect = choose_dialect(env);
    return std::make_shared<store::Client>(client);
  } catch (const store::StoreError& e) {
    throw InitError("rank " + std::to_string(env.rank) + ": cannot reach the store at " +
                    env.master_addr + ":" + std::to_string(env.master_port) + ": " + e.what());
  }
}

std::pair<std::shared_ptr<store::Store>, std::shared_ptr<void>> connect_store(
    const LaunchEnv& env, const InitOptions& options) {
  const std::string endpoint = env.master_addr + ":" + std::to_string(env.master_port);
  if (env.master_port > 65535) {
    throw EnvError("MASTER_PORT=" + std::to_string(env.master_port) + " is not a TCP port");
  }
  std::shared_ptr<HostedStore> hosted;
  store::ClientOptions client;
  client.host = env.master_addr;
  client.port = static_cast<std::uint16_t>(env.master_port);
  client.connect_timeout = options.init_timeout;
  try {
    client.dialect = choose_dialect(env);
    if (!env.use_agent_store && env.rank == 0) {
      const bool local = is_loopback(env.master_addr);
      hosted = std::make_shared<HostedStore>(local ? "127.0.0.1" : "0.0.0.0", client.port);
      if (local) client.host = "127.0.0.1";
    }
    auto store = std::make_shared<store::Client>(client);
    return {std::move(store), std::move(hosted)};
  } catch (const store::StoreError& e) {
    throw InitError("rank " + std::to_string(env.rank) + ": cannot " +
                    (hosted || env.use_agent_store || env.rank != 0 ? "reach" : "host") +
                    " the store at " + endpoint + ": " + e.what());
  }
}

}  // namespace ddp::detail
