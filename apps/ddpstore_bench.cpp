// ddpstore-bench: load generator for a c10d TCPStore server (ours or PyTorch's).
//
//   ddpstore-bench mix --port P --clients 64 --seconds 5 [--threads 1] [--dialect 1|2]
//                      [--server-pid PID]
//     N client connections, each closed-loop (one request outstanding, like a blocking
//     client), driven by a few epoll threads so that the load generator's own wake-ups do not
//     dominate a 2-core machine. Each repeats SET+WAIT, GET, ADD on its own keys. Reports
//     requests/s, reply latency p50/p99 and, given the server's pid, its CPU time per request.
//
//   ddpstore-bench rendezvous --port P --ranks 96000 [--dialect 1|2] [--server-pid PID]
//     N simulated ranks meet like init_process_group: connect, (2.x: VALIDATE + PING),
//     ADD init/ 1 (the rank that brings it to N sets init/complete), SET addr/<rank>, WAIT for
//     init/complete and the addresses of rank 0 and both ring neighbours, then fetch those
//     (2.x: MULTI_GET; 1.x: GETs). Non-blocking sockets on one epoll loop, spread over
//     several loopback source addresses (127.0.0.2, .3, ...) so ephemeral ports never run out.
//
//   ddpstore-bench floor-server [--port P]
//     A reference "server" for the 1.x mix that parses and stores nothing, only answers each
//     read: its CPU per request is the kernel's floor on this machine.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "ddp/store/client.hpp"
#include "ddp/store/wire_codec.hpp"

namespace {

using namespace ddp::store;
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string host = "127.0.0.1";  // server address (IPv4 for rendezvous mode)
  std::uint16_t port = 29500;      // server port
  int dialect = 2;                 // 1 or 2
  int clients = 16;                // mix: client connections
  int threads = 1;                 // mix: threads driving them (each an epoll loop)
  double seconds = 5;              // mix: measured duration
  int ranks = 1024;                // rendezvous: simulated ranks
  int max_connecting = 1024;       // rendezvous: ranks between connect and first reply
  int ranks_per_source = 4000;     // rendezvous: ranks per loopback source address
  double time_limit = 120;         // rendezvous: give up after this many seconds
  int server_pid = 0;              // server process for CPU accounting (0: none)
};

// The server's user + system CPU time so far, in seconds (0 without a pid).
double server_cpu_seconds(int pid) {
  if (pid <= 0) return 0;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto rest = text.substr(text.rfind(')') + 2);  // fields from 3 (state) on
  std::istringstream fields(rest);
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Raises the open-file limit to `wanted`, or as far as the hard limit allows.
void raise_open_file_limit(rlim_t wanted) {
  rlimit limit{wanted, wanted};
  if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) return;
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  std::cerr << "warning: the open-file limit is " << limit.rlim_cur << " (hard), below the "
            << wanted << " wanted: ranks beyond it cannot connect\n";
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

// ---- mix --------------------------------------------------------------------------------

// One closed-loop client connection: SET + WAIT (sent together, as a client's set returns
// without a reply), then GET, then ADD, each sent when the previous reply is complete.
struct MixClient {
  int fd = -1;
  int step = 0;  // 0: SET+WAIT, 1: GET, 2: ADD
  std::size_t expected = 0;
  std::size_t received = 0;
  Clock::time_point sent;
  std::string requests[3];  // encoded once
};

class MixLoad {
 public:
  MixLoad(const BenchOptions& o, int first, int count) : o_(o), clients_(count) {
    const Dialect d = o.dialect == 1 ? Dialect::V1 : Dialect::V2;
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    for (int i = 0; i < count; ++i) {
      MixClient& c = clients_[i];
      const std::string key = "mix/" + std::to_string(first + i);
      encode_request(d, make_request(Command::Set, {key}, {std::string(32, 'v')}), c.requests[0]);
      encode_request(d, make_request(Command::Wait, {key}), c.requests[0]);
      encode_request(d, make_request(Command::Get, {key}), c.requests[1]);
      encode_request(d, make_request(Command::Add, {key + "/n"}, {}, 1), c.requests[2]);
      c.fd = connect_to(o, d);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u32 = static_cast<std::uint32_t>(i);
      ::epoll_ctl(epoll_, EPOLL_CTL_ADD, c.fd, &ev);
    }
  }
  ~MixLoad() {
    for (auto& c : clients_) ::close(c.fd);
    ::close(epoll_);
  }

  // Runs until stop is set; returns false on a failure.
  bool run(const std::atomic<bool>& stop) {
    latencies_.reserve(1 << 22);
    for (std::size_t i = 0; i < clients_.size(); ++i) send(clients_[i]);
    std::vector<epoll_event> events(1024);
    while (!stop.load(std::memory_order_relaxed)) {
      int n = ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), 100);
      for (int i = 0; i < n; ++i) {
        if (!receive(clients_[events[i].data.u32])) return false;
      }
    }
    return true;
  }

  std::vector<double> latencies_;  // microseconds per reply-bearing request
  std::uint64_t requests_ = 0;

 private:
  static int connect_to(const BenchOptions& o, Dialect d) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(o.port);
    ::inet_pton(AF_INET, o.host.c_str(), &addr.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      throw StoreError("cannot connect to " + o.host + ":" + std::to_string(o.port));
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (d == Dialect::V2) {
      std::string hello;
      encode_request(d, make_request(Command::Validate, {}, {}, 0, kValidationMagic), hello);
      ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
    }
    return fd;
  }

  void send(MixClient& c) {
    const std::string& r = c.requests[c.step];
    c.expected = c.step == 0 ? 1 : c.step == 1 ? 8 + 32 : 8;
    c.received = 0;
    c.sent = Clock::now();
    if (::send(c.fd, r.data(), r.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(r.size())) {
      throw StoreError("short send");
    }
    requests_ += c.step == 0 ? 2 : 1;
  }

  bool receive(MixClient& c) {
    char buffer[4096];
    ssize_t n = ::recv(c.fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) {
      std::cerr << "the server closed a connection\n";
      return false;
    }
    c.received += static_cast<std::size_t>(n);
    if (c.received < c.expected) return true;
    latencies_.push_back(std::chrono::duration<double, std::micro>(Clock::now() - c.sent).count());
    c.step = (c.step + 1) % 3;
    send(c);
    return true;
  }

  const BenchOptions& o_;
  std::vector<MixClient> clients_;
  int epoll_;
};

int run_mix(const BenchOptions& o) {
  std::vector<std::unique_ptr<MixLoad>> loads;
  const int threads = std::min(o.threads, o.clients);
  for (int t = 0, first = 0; t < threads; ++t) {
    int count = o.clients / threads + (t < o.clients % threads ? 1 : 0);
    loads.push_back(std::make_unique<MixLoad>(o, first, count));
    first += count;
  }
  std::atomic<bool> stop{false};
  std::atomic<bool> failed{false};
  double cpu_before = server_cpu_seconds(o.server_pid);
  auto start = Clock::now();
  std::vector<std::thread> workers;
  for (auto& load : loads) {
    workers.emplace_back([&, l = load.get()] {
      if (!l->run(stop)) failed = true;
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));  // the measured window
  stop = true;
  for (auto& w : workers) w.join();
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  double cpu = server_cpu_seconds(o.server_pid) - cpu_before;

  std::vector<double> all;
  std::uint64_t total = 0;
  for (auto& l : loads) {
    all.insert(all.end(), l->latencies_.begin(), l->latencies_.end());
    total += l->requests_;
  }
  double rate = static_cast<double>(total) / elapsed;
  std::cout << "mix dialect=" << o.dialect << ".x clients=" << o.clients << " threads=" << threads
            << " seconds=" << elapsed << " requests=" << total
            << " requests_per_s=" << static_cast<long>(rate) << " p50_us=" << percentile(all, 0.50)
            << " p99_us=" << percentile(all, 0.99);
  if (o.server_pid > 0) {
    std::cout << " server_cpu_s=" << cpu
              << " server_cpu_us_per_request=" << cpu * 1e6 / static_cast<double>(total);
  }
  std::cout << std::endl;
  return failed ? 1 : 0;
}

// ---- rendezvous -------------------------------------------------------------------------

struct Rank {
  int fd = -1;
  int phase = 0;             // 0 connecting, 1 handshake, 2 add, 3 wait, 4 fetch, 5 done
  std::size_t expected = 0;  // reply bytes the phase waits for
  std::size_t received = 0;
  char add_reply[8] = {};
};

class Rendezvous {
 public:
  explicit Rendezvous(const BenchOptions& o)
      : o_(o), dialect_(o.dialect == 1 ? Dialect::V1 : Dialect::V2), ranks_(o.ranks) {
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    server_.sin_family = AF_INET;
    server_.sin_port = htons(o.port);
    ::inet_pton(AF_INET, o.host.c_str(), &server_.sin_addr);
  }
  ~Rendezvous() {
    for (auto& r : ranks_) {
      if (r.fd >= 0) ::close(r.fd);
    }
    ::close(epoll_);
  }

  // Runs every rank to the end; returns the ranks done (all of them unless the limit hit).
  int run() {
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(o_.time_limit));
    std::vector<epoll_event> events(4096);
    while (done_ < o_.ranks) {
      while (connecting_ < o_.max_connecting && next_ < o_.ranks) start(next_++);
      int n = ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), 100);
      for (int i = 0; i < n; ++i) step(static_cast<int>(events[i].data.u32), events[i].events);
      if (Clock::now() > deadline) break;
    }
    return done_;
  }

 private:
  [[noreturn]] void fail(int rank, const std::string& what) {
    throw StoreError("rank " + std::to_string(rank) + ": " + what);
  }

  void start(int rank) {
    Rank& r = ranks_[rank];
    r.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r.fd < 0) fail(rank, std::string("socket: ") + std::strerror(errno));
    int one = 1;
    ::setsockopt(r.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(r.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
    linger no_time_wait{1, 0};  // reset on close: no TIME_WAIT to exhaust ports for later runs
    ::setsockopt(r.fd, SOL_SOCKET, SO_LINGER, &no_time_wait, sizeof(no_time_wait));
    sockaddr_in source{};
    source.sin_family = AF_INET;
    source.sin_addr.s_addr =
        htonl(0x7F000002u + static_cast<std::uint32_t>(rank / o_.ranks_per_source));
    if (::bind(r.fd, reinterpret_cast<sockaddr*>(&source), sizeof(source)) != 0) {
      fail(rank, std::string("bind: ") + std::strerror(errno));
    }
    int rc = ::connect(r.fd, reinterpret_cast<sockaddr*>(&server_), sizeof(server_));
    if (rc != 0 && errno != EINPROGRESS)
      fail(rank, std::string("connect: ") + std::strerror(errno));
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.u32 = static_cast<std::uint32_t>(rank);
    ::epoll_ctl(epoll_, EPOLL_CTL_ADD, r.fd, &ev);
    ++connecting_;
  }

  void send_phase(int rank) {
    Rank& r = ranks_[rank];
    out_.clear();
    r.received = 0;
    const std::string key = prefix_ + "addr/" + std::to_string(rank);
    switch (r.phase) {
      case 1:  // 2.x handshake
        encode_request(dialect_, make_request(Command::Validate, {}, {}, 0, kValidationMagic),
                       out_);
        encode_request(dialect_,
                       make_request(Command::Ping, {}, {}, 0, static_cast<std::uint32_t>(rank)),
                       out_);
        r.expected = 4;
        break;
      case 2:
        encode_request(dialect_, make_request(Command::Add, {prefix_ + "init/"}, {}, 1), out_);
        r.expected = 8;
        break;
      case 3: {
        encode_request(dialect_, make_request(Command::Set, {key}, {std::string(32, 'a')}), out_);
        if (get_i64(r.add_reply) == o_.ranks) {
          encode_request(dialect_, make_request(Command::Set, {prefix_ + "init/complete"}, {"1"}),
                         out_);
        }
        auto keys = peers(rank);
        keys.insert(keys.begin(), prefix_ + "init/complete");
        encode_request(dialect_, make_request(Command::Wait, keys), out_);
        r.expected = 1;
        break;
      }
      case 4:
        if (dialect_ == Dialect::V2) {
          encode_request(dialect_, make_request(Command::MultiGet, peers(rank)), out_);
        } else {
          for (const auto& k : peers(rank))
            encode_request(dialect_, make_request(Command::Get, {k}), out_);
        }
        r.expected = 3 * (8 + 32);
        break;
    }
    ssize_t n = ::send(r.fd, out_.data(), out_.size(), MSG_NOSIGNAL);
    if (n != static_cast<ssize_t>(out_.size())) fail(rank, "short send");
  }

  std::vector<std::string> peers(int rank) const {
    const int n = o_.ranks;
    return {prefix_ + "addr/0", prefix_ + "addr/" + std::to_string((rank + 1) % n),
            prefix_ + "addr/" + std::to_string((rank + n - 1) % n)};
  }

  void step(int rank, std::uint32_t events) {
    Rank& r = ranks_[rank];
    if (r.phase == 0) {
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(r.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) fail(rank, std::string("connect: ") + std::strerror(err));
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u32 = static_cast<std::uint32_t>(rank);
      ::epoll_ctl(epoll_, EPOLL_CTL_MOD, r.fd, &ev);
      r.phase = dialect_ == Dialect::V2 ? 1 : 2;
      send_phase(rank);
      return;
    }
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
    ssize_t n = ::recv(r.fd, buffer_, sizeof(buffer_), 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) fail(rank, "the server closed the connection in phase " + std::to_string(r.phase));
    if (r.phase == 2)
      std::memcpy(r.add_reply + r.received, buffer_, std::min<std::size_t>(n, 8 - r.received));
    r.received += static_cast<std::size_t>(n);
    if (r.received < r.expected) return;
    if (r.received > r.expected) fail(rank, "more reply bytes than expected");
    // A rank stops counting as connecting once the server answered its first request.
    if (r.phase == (dialect_ == Dialect::V2 ? 1 : 2)) --connecting_;
    if (++r.phase == 5) {
      ++done_;
      return;
    }
    send_phase(rank);
  }

  const BenchOptions& o_;
  Dialect dialect_;
  std::vector<Rank> ranks_;
  int epoll_;
  sockaddr_in server_{};
  int next_ = 0;
  int connecting_ = 0;
  int done_ = 0;
  std::string out_;
  // Keys of this run under their own prefix, so that runs against one server never meet.
  std::string prefix_ = "rdv" + std::to_string(::getpid()) + "/";
  char buffer_[64 * 1024];
};

int run_rendezvous(const BenchOptions& o) {
  raise_open_file_limit(static_cast<rlim_t>(o.ranks) + 1024);
  double cpu_before = server_cpu_seconds(o.server_pid);
  auto start = Clock::now();
  int done = 0;
  {
    Rendezvous rendezvous(o);
    done = rendezvous.run();
  }
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  double cpu = server_cpu_seconds(o.server_pid) - cpu_before;
  std::cout << "rendezvous dialect=" << o.dialect << ".x ranks=" << o.ranks << " done=" << done
            << " seconds=" << elapsed;
  if (o.server_pid > 0) std::cout << " server_cpu_s=" << cpu;
  std::cout << (done < o.ranks ? " (time limit reached)" : "") << std::endl;
  return done == o.ranks ? 0 : 3;
}

}  // namespace

int run_floor_server(std::uint16_t port);  // bench_floor_server.cpp

int main(int argc, char** argv) {
  BenchOptions o;
  CLI::App app("ddpstore-bench: load generator for c10d TCPStore servers");
  app.require_subcommand(1);
  for (auto* sub : {app.add_subcommand("mix", "set/get/add/wait mix from N client connections"),
                    app.add_subcommand("rendezvous", "N simulated ranks meet through the store")}) {
    sub->add_option("--host", o.host, "Server address")->capture_default_str();
    sub->add_option("--port", o.port, "Server port")->required();
    sub->add_option("--dialect", o.dialect, "Wire dialect: 1 or 2")
        ->check(CLI::IsMember({1, 2}))
        ->capture_default_str();
    sub->add_option("--server-pid", o.server_pid, "Server pid, for its CPU time per request");
  }
  auto* mix = app.get_subcommand("mix");
  mix->add_option("--clients", o.clients, "Client connections")->capture_default_str();
  mix->add_option("--threads", o.threads, "Threads driving the connections")->capture_default_str();
  mix->add_option("--seconds", o.seconds, "Measured duration")->capture_default_str();
  auto* rdv = app.get_subcommand("rendezvous");
  rdv->add_option("--ranks", o.ranks, "Simulated ranks")->capture_default_str();
  rdv->add_option("--max-connecting", o.max_connecting, "Ranks connecting at once")
      ->capture_default_str();
  rdv->add_option("--ranks-per-source", o.ranks_per_source,
                  "Ranks per loopback source address (127.0.0.2, .3, ...)")
      ->capture_default_str();
  rdv->add_option("--time-limit", o.time_limit, "Seconds before giving up")->capture_default_str();
  std::uint16_t floor_port = 0;
  auto* floor = app.add_subcommand(
      "floor-server", "a reference server for the 1.x mix that stores nothing: recv + send only");
  floor->add_option("--port", floor_port, "Port (0 picks one; printed)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (floor->parsed()) return run_floor_server(floor_port);
    return mix->parsed() ? run_mix(o) : run_rendezvous(o);
  } catch (const std::exception& e) {
    std::cerr << "ddpstore-bench: " << e.what() << std::endl;
    return 1;
  }
}
