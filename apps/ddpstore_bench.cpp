// ddpstore-bench: load generator for a c10d TCPStore server (ours or PyTorch's).
//
//   ddpstore-bench mix --port P --clients 64 --seconds 5 [--threads 1] [--dialect 1|2]
//                      [--server-pid PID]
//     N client connections, each closed-loop (one request outstanding, like a blocking
//     client), driven by a few epoll threads so that the load generator's own wake-ups do not
//     dominate a 2-core machine. Each repeats SET+WAIT, GET, ADD on its own keys. Reports
//     requests/s, reply latency p50/p99 and, given the server's pid, its CPU time per request.
//
//   ddpstore-bench rendezvous --port P --ranks 100000 [--dialect 1|2] [--server-pid PID]
//     N simulated ranks through init_process_group's store pattern, all connected until the
//     last is through; over several descriptor tables past RLIMIT_NOFILE
//     (bench_rendezvous.cpp). Reports the time to the last rank and, given the server's pid,
//     its CPU time and memory per rank.
//
//   ddpstore-bench floor-server [--port P]
//     A reference "server" for the 1.x mix that parses and stores nothing, only answers each
//     read: its CPU per request is the kernel's floor on this machine.

#include "ddpstore_bench.hpp"

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

namespace ddp::bench {

using namespace ddp::store;
using Clock = std::chrono::steady_clock;

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

std::uint64_t raise_open_file_limit(std::uint64_t wanted) {
  rlimit limit{wanted, wanted};
  if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) return wanted;
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  return limit.rlim_cur;
}

namespace {

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

}  // namespace

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

}  // namespace ddp::bench

int main(int argc, char** argv) {
  using namespace ddp::bench;
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
  rdv->add_option("--ranks-per-table", o.ranks_per_table,
                  "Ranks per descriptor table (a thread each); 0: the open-file limit less 256")
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
