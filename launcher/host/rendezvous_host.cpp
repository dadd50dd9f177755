#include "host/rendezvous_host.hpp"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstdio>

#include "ddp/elastic/round_state.hpp"
#include "ddp/launcher/agent_store.hpp"
#include "ddp/launcher/rdzv_settings.hpp"
#include "host/local_rendezvous.hpp"
#include "host/store_admission.hpp"

namespace ddp::launcher {
namespace {

// A store other nodes reach: every address. Its log lines go to the agent's console writer
// (never a blocking write on the loop).
store::ServerOptions store_options(int port,
                                   const std::function<void(const std::string&)>& notice) {
  store::ServerOptions options;
  options.host = "0.0.0.0";
  options.port = static_cast<std::uint16_t>(port);
  options.clock_key = store::kClockKey;  // the reference clock of a job-wide --trace_file
  options.logger = [notice](std::string_view line) {
    notice("ddprun: store: " + std::string(line));
  };
  return options;
}

// True when another process holds port on every address (binding it fails with EADDRINUSE).
bool port_taken(boost::asio::io_context& io, int port) {
  using boost::asio::ip::tcp;
  tcp::acceptor probe(io);
  boost::system::error_code ec;
  probe.open(tcp::v4(), ec);
  if (!ec) probe.bind(tcp::endpoint(tcp::v4(), static_cast<unsigned short>(port)), ec);
  return ec == boost::asio::error::address_in_use;
}

// True when something listens at 127.0.0.1:port (an agent or program serving it; every
// address includes loopback), false when a port that is taken has no listener: another
// program's connection holds it as its own end. A listener too busy to complete the
// connection within 200 ms counts as one (the loop never blocks longer).
bool someone_listens(int port) {
  constexpr int kListenProbeTimeoutMs = 200;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;  // cannot tell: keep torchrun's behaviour (join as a client)
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  bool listens = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  if (!listens && errno == EINPROGRESS) {
    pollfd wait{fd, POLLOUT, 0};
    int error = 0;
    socklen_t size = sizeof error;
    listens = ::poll(&wait, 1, kListenProbeTimeoutMs) == 0 ||  // still connecting: busy
              (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0);
  }
  ::close(fd);
  return listens;
}

// --nnodes=1 with a multi-node backend: the agent runs alone and never contacts it (torchrun
// would). One line says so, since a wrong endpoint then goes unnoticed. Empty when there is
// nothing to say (static, --standalone).
std::string single_node_notice(const LaunchConfig& config) {
  if (config.standalone || config.rdzv_backend == "static") return "";
  std::string where = config.rdzv_endpoint.empty() ? "" : " at " + config.rdzv_endpoint;
  return "ddprun: --nnodes=1: this node runs the job alone; the " + config.rdzv_backend +
         " rendezvous" + where +
         " is not contacted (give --nnodes=MIN:MAX with MAX above 1 for a job other nodes "
         "join)";
}

}  // namespace

RendezvousHost::RendezvousHost(boost::asio::io_context& io, const LaunchConfig& config,
                               elastic::NodeInfo self, RendezvousHostOptions options)
    : io_(io),
      options_(std::move(options)),
      store_allow_any_(config.store_allow_any),
      linger_timer_(io),
      host_retry_timer_(io) {
  const RdzvConf conf = parse_rdzv_conf(config.rdzv_conf);
  for (const std::string& key : conf.unknown_keys) options_.notice(unknown_rdzv_conf_warning(key));
  if (!is_multi_node(config)) {
    if (std::string line = single_node_notice(config); !line.empty()) options_.notice(line);
    master_ = options_.master_host
                  ? options_.master_host(io, config)
                  : agent_store_factory([notice = options_.notice](std::string_view line) {
                      notice("ddprun: store: " + std::string(line));
                    })(io, config);
    const MasterEndpoint endpoint = master_->endpoint();
    agent_store_ = endpoint.agent_store;
    rendezvous_ = std::make_unique<LocalRendezvous>(std::move(self), endpoint.addr, endpoint.port);
    return;
  }
  elastic::RendezvousSettings settings = rendezvous_settings(config, conf, std::move(self));
  settings.notice = options_.notice;
  agent_store_ = true;
  worker_stores_ = settings.backend != "static";
  if (launcher::hosts_rendezvous_store(config, conf, settings, is_local_host)) {
    host_rendezvous_store(settings.store_host, settings.store_port);
  }
  rendezvous_ = elastic::make_store_rendezvous(std::move(settings));
}

RendezvousHost::~RendezvousHost() {
  if (leaver_.joinable()) leaver_.join();
  rendezvous_.reset();
  if (closer_.joinable()) closer_.join();
}

void RendezvousHost::leave() {
  if (left_ || !rendezvous_) return;  // left already, or shut down
  left_ = true;
  leaver_ = std::thread([engine = rendezvous_.get()] { engine->leave(); });
}

store::ServerOptions RendezvousHost::rendezvous_store_options(int port) const {
  store::ServerOptions options = store_options(port, options_.notice);
  if (!worker_stores_) {
    // Static: the workers' MASTER_PORT is this store, for every attempt. Once every node has
    // joined the next round (each after its workers of the last one exited), and before any
    // of them starts its workers, the last attempt's worker keys go: PyTorch 2.x no longer
    // prefixes them with the attempt, and its Gloo would dial the last attempt's addresses.
    // ddprun's own keys (the rendezvous's, the collective exchange's, the clock) stay.
    options.reset_after_set = [reset_for = 0](std::string_view key,
                                              std::string_view value) mutable {
      const int round = elastic::round_closed_by(key, value);
      if (round <= reset_for) return false;  // round 0, or this round's keys went already
      reset_for = round;
      return true;
    };
    options.keep_on_reset = {"/ddprun/", "ddprun/"};
  }
  return options;
}

void RendezvousHost::host_rendezvous_store(const std::string& where, int port) {
  try {
    rendezvous_store_ = std::make_unique<store::Server>(io_, rendezvous_store_options(port));
    return;
  } catch (const store::StoreError&) {
    if (!port_taken(io_, port)) throw;
  }
  const std::string endpoint = where + ":" + std::to_string(port);
  if (someone_listens(port)) {
    options_.notice("ddprun: port " + std::to_string(port) +
                    " is held by another process; joining the rendezvous at " + endpoint +
                    " as a client");
    return;
  }
  options_.notice("ddprun: port " + std::to_string(port) +
                  " on this host is in use, but nothing accepts connections there (a "
                  "connection of another program holds it, or held it a moment ago); this "
                  "agent waits for the rendezvous at " +
                  endpoint +
                  " as a client, and hosts its store as soon as the port is free (give "
                  "--rdzv_endpoint another port if this lasts)");
  retry_hosting(port);
}

void RendezvousHost::retry_hosting(int port) {
  host_retry_timer_.expires_after(kHostRetryInterval);
  host_retry_timer_.async_wait([this, port](boost::system::error_code ec) {
    if (ec) return;  // shut down meanwhile
    try {
      rendezvous_store_ = std::make_unique<store::Server>(io_, rendezvous_store_options(port));
      options_.notice("ddprun: port " + std::to_string(port) +
                      " is free now: this agent hosts the rendezvous store there");
    } catch (const store::StoreError&) {
      // Still taken. Once a server listens there (another agent of this host won the port),
      // this agent stays its client.
      if (!someone_listens(port)) retry_hosting(port);
    }
  });
}

void RendezvousHost::shut_down(bool wait_for_others, std::function<void()> done) {
  if (closer_.joinable()) return;  // shutting down already
  host_retry_timer_.cancel();
  closer_ = std::thread([this, engine = std::move(rendezvous_), leaver = std::move(leaver_),
                         wait_for_others, done = std::move(done)]() mutable {
    if (leaver.joinable()) leaver.join();
    engine.reset();
    boost::asio::post(io_, [this, wait_for_others, done = std::move(done)] {
      if (!wait_for_others || hurry_) return done();
      check_linger(std::chrono::steady_clock::now() + kStoreLingerTimeout, done);
    });
  });
}

void RendezvousHost::check_linger(std::chrono::steady_clock::time_point deadline,
                                  std::function<void()> done) {
  const auto connections = rendezvous_store_->stats().connections;
  if (hurry_ || connections == 0) return done();
  if (std::chrono::steady_clock::now() >= deadline) {
    if (options_.notice) {
      options_.notice("ddprun: " + std::to_string(connections) +
                      " connection(s) to the rendezvous store this agent serves still open " +
                      std::to_string(kStoreLingerTimeout.count() / 1000) +
                      " s after the job ended; ending anyway");
    }
    return done();
  }
  linger_timer_.expires_after(kStoreLingerCheck);
  linger_timer_.async_wait([this, deadline, done = std::move(done)](boost::system::error_code ec) {
    if (!ec) check_linger(deadline, done);
  });
}

void RendezvousHost::next_round(int worker_store_port,
                                std::function<void(elastic::RoundInfo)> on_round,
                                std::function<void(std::exception_ptr)> on_error,
                                std::function<void(elastic::WaitStatus)> on_wait) {
  if (worker_store_ && !store_allow_any_) {
    // On the engine's thread: resolve the members there (never on the loop), then post the
    // admission before on_round posts its own handlers, so it is in place before any worker
    // of this node starts; the other nodes' workers are held until it is.
    on_round = [io = &io_, store = std::weak_ptr<store::Server>(worker_store_),
                on_round = std::move(on_round)](elastic::RoundInfo round) {
      boost::asio::post(*io, [store, admission = admit_members(round.members)]() mutable {
        if (auto server = store.lock()) server->set_admission(std::move(admission));
      });
      on_round(std::move(round));
    };
  }
  if (master_) master_->new_round();  // one node: its workers of the last round have exited
  rendezvous_->next_round(worker_store_port, std::move(on_round), std::move(on_error),
                          std::move(on_wait));
}

int RendezvousHost::open_worker_store() {
  worker_store_.reset();
  store::ServerOptions options = store_options(0, options_.notice);
  options.admission = store_allow_any_ ? store::Admission::anyone() : admit_round_pending();
  worker_store_ = std::make_shared<store::Server>(io_, std::move(options));
  return worker_store_->port();
}

}  // namespace ddp::launcher
