// How much the agents' sharing of rank views costs the workers' store (scripts/bench-exchange):
// N CollectiveExchanges (N agents, 8 ranks each, in one process) against a real store Server
// on its own thread, each publishing every 0.5 s (HangMonitor::tick at the default
// --hang_timeout) views that change every tick, as in training. Prints one Markdown table row:
// agents, bytes a second through the store's socket (read + written), the store loop's CPU
// and the exchange threads' CPU (all agents together), both in % of one core.
//   ddp-bench-exchange AGENTS [SECONDS]
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/collective_exchange.hpp"
#include "ddp/store/server.hpp"

using namespace ddp::launcher;

namespace {

constexpr int kRanksPerNode = 8;
constexpr std::chrono::milliseconds kTick{500};

struct ThreadCost {
  double cpu_s = 0;  // user + system
};

// Forwards connections to the store, counting the bytes both ways (on its own loop, not the
// store's).
class CountingProxy {
 public:
  CountingProxy(boost::asio::io_context& io, std::uint16_t store_port)
      : acceptor_(io, {boost::asio::ip::make_address("127.0.0.1"), 0}),
        upstream_{boost::asio::ip::make_address("127.0.0.1"), store_port} {
    accept();
  }
  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
  std::uint64_t bytes() const { return bytes_.load(); }

 private:
  using Socket = boost::asio::ip::tcp::socket;
  void accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, Socket client) {
      if (ec) return;
      auto down = std::make_shared<Socket>(std::move(client));
      auto up = std::make_shared<Socket>(acceptor_.get_executor());
      up->connect(upstream_);
      pump(down, up);
      pump(up, down);
      accept();
    });
  }
  void pump(std::shared_ptr<Socket> from, std::shared_ptr<Socket> to) {
    auto buffer = std::make_shared<std::vector<char>>(65536);
    from->async_read_some(
        boost::asio::buffer(*buffer), [=, this](boost::system::error_code ec, std::size_t n) {
          if (ec) {
            boost::system::error_code ignored;
            to->shutdown(Socket::shutdown_both, ignored);
            return;
          }
          bytes_ += n;
          boost::asio::async_write(*to, boost::asio::buffer(buffer->data(), n),
                                   [=, this](boost::system::error_code wec, std::size_t) {
                                     if (!wec) pump(from, to);
                                   });
        });
  }
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::ip::tcp::endpoint upstream_;
  std::atomic<std::uint64_t> bytes_{0};
};

ThreadCost thread_cost(pid_t tid) {
  ThreadCost cost;
  const std::string dir = "/proc/self/task/" + std::to_string(tid);
  std::ifstream stat(dir + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::vector<std::string> f{std::istream_iterator<std::string>(fields),
                             std::istream_iterator<std::string>()};
  cost.cpu_s = static_cast<double>(std::stoull(f.at(11)) + std::stoull(f.at(12))) /
               static_cast<double>(::sysconf(_SC_CLK_TCK));
  return cost;
}

// CPU seconds of each thread of this process now, by thread id.
std::map<pid_t, double> threads_cpu_s() {
  std::map<pid_t, double> cpu;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    const pid_t tid = std::stoi(entry.path().filename().string());
    try {
      cpu[tid] = thread_cost(tid).cpu_s;
    } catch (const std::exception&) {
      // the thread ended meanwhile
    }
  }
  return cpu;
}

double process_cpu_s() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return s(usage.ru_utime) + s(usage.ru_stime);
}

RankView rank_view(int rank, std::uint64_t finished) {
  RankView v;
  v.rank = rank;
  v.local_rank = rank % kRanksPerNode;
  v.host = "node-" + std::to_string(rank / kRanksPerNode);
  v.pid = 10000 + rank;
  v.attached = true;
  v.backend = "nccl";
  v.finished = finished;
  v.queued = finished + 1;
  v.since_finished_s = 0.05;
  v.timeout_s = 600;
  CollectiveInfo c;
  c.seq = finished + 1;
  c.op = "all_reduce";
  c.dtype = "float32";
  c.count = 6'553'600;
  c.bytes = c.count * 4;
  c.bucket = 3;
  c.age_s = 0.01;
  c.started = true;
  v.pending = c;
  v.last = c;
  v.last->seq = finished;
  v.last->finished = true;
  v.steps = finished;
  for (std::uint64_t s = finished > 64 ? finished - 63 : 1; s <= finished; ++s) {
    v.recent_steps.push_back({s, 0.25, 0.01});
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ddp-bench-exchange AGENTS [SECONDS]\n");
    return 2;
  }
  const int agents = std::atoi(argv[1]);
  const double seconds = argc > 2 ? std::atof(argv[2]) : 10.0;

  boost::asio::io_context io;
  ddp::store::ServerOptions options;
  options.host = "127.0.0.1";
  options.logger = [](std::string_view) {};
  ddp::store::Server server(io, options);
  std::promise<pid_t> server_tid;
  boost::asio::post(io, [&] { server_tid.set_value(static_cast<pid_t>(::syscall(SYS_gettid))); });
  std::thread loop([&] { io.run(); });
  const pid_t tid = server_tid.get_future().get();
  boost::asio::io_context proxy_io;
  CountingProxy proxy(proxy_io, server.port());
  std::promise<pid_t> proxy_tid;
  boost::asio::post(proxy_io,
                    [&] { proxy_tid.set_value(static_cast<pid_t>(::syscall(SYS_gettid))); });
  std::thread proxy_loop([&] { proxy_io.run(); });
  const pid_t ptid = proxy_tid.get_future().get();

  std::vector<std::unique_ptr<CollectiveExchange>> nodes;
  std::vector<ddp::elastic::RoundInfo> rounds;
  for (int g = 0; g < agents; ++g) {
    nodes.push_back(std::make_unique<CollectiveExchange>(
        [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); },
        std::chrono::seconds(300)));
    ddp::elastic::RoundInfo round;
    round.group_rank = g;
    round.members.resize(static_cast<std::size_t>(agents));
    round.master_addr = "127.0.0.1";
    round.master_port = proxy.port();
    rounds.push_back(round);
  }
  std::uint64_t step = 100;
  std::size_t remote_seen = 0;
  auto tick = [&] {
    ++step;
    for (int g = 0; g < agents; ++g) {
      std::vector<RankView> views;
      for (int l = 0; l < kRanksPerNode; ++l)
        views.push_back(rank_view(g * kRanksPerNode + l, step));
      nodes[static_cast<std::size_t>(g)]->publish(rounds[static_cast<std::size_t>(g)], views);
      remote_seen += nodes[static_cast<std::size_t>(g)]->remote().size();
    }
  };
  // Warm up (connections made, every key written), then measure.
  auto next = std::chrono::steady_clock::now();
  for (int i = 0; i < 4; ++i, next += kTick) {
    tick();
    std::this_thread::sleep_until(next + kTick);
  }
  const ThreadCost store0 = thread_cost(tid), proxy0 = thread_cost(ptid);
  const std::uint64_t bytes0 = proxy.bytes();
  const double cpu0 = process_cpu_s();
  const std::map<pid_t, double> threads0 = threads_cpu_s();
  const auto began = std::chrono::steady_clock::now();
  const int ticks = static_cast<int>(seconds * 1000 / kTick.count());
  for (int i = 0; i < ticks; ++i, next += kTick) {
    tick();
    std::this_thread::sleep_until(next + kTick);
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  const ThreadCost store1 = thread_cost(tid), proxy1 = thread_cost(ptid);
  const std::uint64_t bytes1 = proxy.bytes();
  const double cpu1 = process_cpu_s();
  const std::map<pid_t, double> threads1 = threads_cpu_s();
  // The busiest exchange thread: the gatherer's (node 0) where there is one.
  double busiest = 0;
  const pid_t main_tid = static_cast<pid_t>(::syscall(SYS_gettid));
  for (const auto& [t, cpu] : threads1) {
    if (t == tid || t == ptid || t == main_tid || !threads0.contains(t)) continue;
    busiest = std::max(busiest, cpu - threads0.at(t));
  }
  const double store_cpu = store1.cpu_s - store0.cpu_s;
  const double proxy_cpu = proxy1.cpu_s - proxy0.cpu_s;
  std::printf("| %d | %d | %.0f KB/s | %.1f %% | %.1f %% | %.1f %% |\n", agents,
              agents * kRanksPerNode, static_cast<double>(bytes1 - bytes0) / wall / 1000.0,
              100.0 * store_cpu / wall, 100.0 * ((cpu1 - cpu0) - store_cpu - proxy_cpu) / wall,
              100.0 * busiest / wall);
  std::fflush(stdout);
  nodes.clear();
  boost::asio::post(io, [&] {
    server.close();
    io.stop();
  });
  loop.join();
  proxy_io.stop();
  proxy_loop.join();
  return remote_seen > 0 ? 0 : 1;
}
