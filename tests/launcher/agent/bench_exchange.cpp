// How much the agents' sharing of rank views costs the gatherer and the workers' store, and how
// soon a hang of one rank is named (scripts/bench-exchange). NODES agents of RANKS_PER_NODE
// ranks each (default 8):
// - the gatherer (group rank 0) is the real CollectiveExchange, in a process of its own (its
//   memory is that process's), whose main thread plays its agent's loop: every 0.5 s tick
//   (HangMonitor's) it publishes its ranks' views and calls append_remote() and judge();
// - the other NODES - 1 agents are simulated by a few threads of the first process: each tick,
//   each writes its views as an agent does (ViewsWriter, the agents' own code) and reads the
//   verdict as a follower does (its count, then the verdict when it moved);
// - the store is the real Server, on its own thread, behind a proxy that counts the bytes.
// Every rank makes progress every tick (training: every view changes on every tick, the worst
// case) for SECONDS; then one rank blocks and the others wait (MODE absent: it never enters
// the next collective; stuck: it waits in a collective the others finished), and after it is
// named the hang is measured for SECONDS too. Prints, per case, one Markdown table row: nodes,
// ranks, case, bytes a second through the store's socket (both ways), the store loop's CPU,
// what the store holds, the gatherer's exchange thread's CPU, its agent loop's CPU in
// publish/remote/judge, and the gatherer process's memory (RSS over its start); then one line
// on the hang: when the gatherer and every agent had it, and its verdict.
//   ddp-bench-exchange NODES [SECONDS] [HANG_TIMEOUT_S] [MODE] [RANKS_PER_NODE]
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/store/server.hpp"
#include "watch/collective_exchange.hpp"
#include "watch/collective_keys.hpp"
#include "watch/views_writer.hpp"

using namespace ddp::launcher;
using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

namespace {

constexpr std::chrono::milliseconds kTick{500};
constexpr int kSimulators = 2;  // threads simulating the other agents

// The bench's course, in seconds from its start (the same on both processes: CLOCK_MONOTONIC).
struct Plan {
  int nodes = 0;
  int ranks_per_node = 8;
  double seconds = 10;       // each measured window
  double hang_timeout = 10;  // --hang_timeout
  bool absent = true;        // the blocked rank never enters the collective (else waits in one)
  int blocked_rank = 0;
  double warm = 0;  // until the training window
  double hang() const { return warm + seconds; }
  // After the hang is named (within hang_timeout + 10 s, or the bench fails): nothing moves.
  double hang_window() const { return hang() + hang_timeout + 10; }
  double end() const { return hang_window() + seconds; }
};

// A thread's CPU time, to the nanosecond where the kernel keeps schedstat (else in ticks).
double thread_cpu_s(pid_t tid) {
  const std::string dir = "/proc/self/task/" + std::to_string(tid);
  std::ifstream schedstat(dir + "/schedstat");
  unsigned long long ns = 0;
  if (schedstat >> ns) return static_cast<double>(ns) * 1e-9;
  std::ifstream stat(dir + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::vector<std::string> f{std::istream_iterator<std::string>(fields),
                             std::istream_iterator<std::string>()};
  return static_cast<double>(std::stoull(f.at(11)) + std::stoull(f.at(12))) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

pid_t this_thread_id() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// This process's resident memory, in bytes.
double rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  }
  return 0;
}

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
      // As the store's clients and server do: a request held back for an ACK (Nagle) would
      // make the proxy, not the store, the bottleneck.
      down->set_option(boost::asio::ip::tcp::no_delay(true));
      up->set_option(boost::asio::ip::tcp::no_delay(true));
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

CollectiveInfo all_reduce(std::uint64_t seq, double age_s, bool finished) {
  CollectiveInfo c;
  c.seq = seq;
  c.op = "all_reduce";
  c.dtype = "float32";
  c.count = 6'553'600;
  c.bytes = c.count * 4;
  c.bucket = 3;
  c.age_s = age_s;
  c.started = true;
  c.finished = finished;
  return c;
}

// A rank at `finished` collectives (and as many Reducer steps), in the next one for age_s
// (none: between collectives), its last finished since_s ago.
RankView rank_view(int rank, int per_node, std::uint64_t finished, bool waits, double age_s,
                   double since_s) {
  RankView v;
  v.rank = rank;
  v.local_rank = rank % per_node;
  v.host = "node-" + std::to_string(rank / per_node);
  v.pid = 10000 + rank;
  v.attached = true;
  v.backend = "nccl";
  v.finished = finished;
  v.queued = finished + (waits ? 1 : 0);
  v.since_finished_s = since_s;
  v.timeout_s = 600;
  if (waits) v.pending = all_reduce(finished + 1, age_s, false);
  v.last = all_reduce(finished, since_s, true);
  v.steps = finished;
  for (std::uint64_t s = finished > 64 ? finished - 63 : 1; s <= finished; ++s) {
    v.recent_steps.push_back({s, 0.25, 0.01});
  }
  return v;
}

// Node g's ranks at `now`: a step a tick until the hang; then every rank waits in the next
// collective but the blocked one.
std::vector<RankView> node_views(const Plan& plan, Clock::time_point start, int g,
                                 Clock::time_point now) {
  const double t = Seconds(now - start).count();
  std::vector<RankView> views;
  const auto step = [&](double at) { return 100 + static_cast<std::uint64_t>(at / 0.5); };
  const int n = plan.ranks_per_node;
  for (int r = g * n; r < (g + 1) * n; ++r) {
    if (t < plan.hang()) {
      views.push_back(rank_view(r, n, step(t), true, 0.01, 0.05));
      continue;
    }
    const std::uint64_t k = step(plan.hang());  // the collective the hang is at
    const double waited = t - plan.hang();
    if (r != plan.blocked_rank) {
      views.push_back(plan.absent ? rank_view(r, n, k - 1, true, waited, waited)
                                  : rank_view(r, n, k, true, waited, waited));
    } else {
      views.push_back(rank_view(r, n, k - 1, !plan.absent, waited, waited));
    }
  }
  return views;
}

ddp::elastic::RoundInfo round_of(int group_rank, int nodes, std::uint16_t port) {
  ddp::elastic::RoundInfo round;
  round.group_rank = group_rank;
  round.members.resize(static_cast<std::size_t>(nodes));
  round.master_addr = "127.0.0.1";
  round.master_port = port;
  return round;
}

// What the gatherer's process measured, sent to the other as one line.
struct GathererReport {
  double training_thread_s = 0, training_loop_s = 0, hang_thread_s = 0, hang_loop_s = 0;
  double onset_thread_s = 0;  // from the hang to its window: reading every view, judging
  double training_rss = 0, hang_rss = 0;  // over the process's before the exchange
  double named_after_s = -1;              // judge() on the gatherer had the hang
  std::size_t views = 0;                  // the ranks its node's loop then saw
  std::string headline;
};

// The gatherer's process: the real CollectiveExchange of group rank 0 and its agent's loop.
GathererReport run_gatherer(const Plan& plan, Clock::time_point start, std::uint16_t port) {
  GathererReport report;
  const double rss0 = rss_bytes();
  const pid_t main_tid = this_thread_id();
  auto exchange = std::make_unique<CollectiveExchange>(
      [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); },
      std::chrono::milliseconds(static_cast<long>(plan.hang_timeout * 1000)));
  const auto round = round_of(0, plan.nodes, port);
  // Every thread but the loop's: the exchange's (and Asio's resolver's, idle).
  auto exchange_cpu = [&] {
    double cpu = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
      const pid_t tid = std::stoi(entry.path().filename().string());
      if (tid != main_tid) cpu += thread_cpu_s(tid);
    }
    return cpu;
  };
  double loop_s = 0;  // the agent loop's CPU in the exchange's calls
  std::map<double, std::pair<double, double>> marks;  // time -> (thread, loop) CPU
  const std::vector<double> at = {plan.warm,          plan.hang(),        plan.hang(),
                                  plan.hang_window(), plan.hang_window(), plan.end()};
  std::size_t next_mark = 0;
  for (auto tick = start + kTick;; tick += kTick) {
    std::this_thread::sleep_until(tick);
    const double t = Seconds(Clock::now() - start).count();
    while (next_mark < at.size() && t >= at[next_mark]) {
      marks[at[next_mark]] = {exchange_cpu(), loop_s};
      if (at[next_mark] == plan.hang()) report.training_rss = rss_bytes() - rss0;
      ++next_mark;
    }
    if (next_mark == at.size()) break;
    std::vector<RankView> local = node_views(plan, start, 0, Clock::now());
    const double cpu0 = thread_cpu_s(main_tid);
    exchange->publish(round, local);
    std::vector<RankView> views = local;
    exchange->append_remote(views);  // as the agent's rank_views()
    const auto verdict = exchange->judge(views, plan.hang_timeout);
    loop_s += thread_cpu_s(main_tid) - cpu0;
    if (verdict && report.named_after_s < 0) {
      report.named_after_s = t - plan.hang();
      report.headline = verdict->headline;
      report.views = views.size();
    }
  }
  report.hang_rss = rss_bytes() - rss0;
  report.training_thread_s = marks[plan.hang()].first - marks[plan.warm].first;
  report.training_loop_s = marks[plan.hang()].second - marks[plan.warm].second;
  report.onset_thread_s = marks[plan.hang_window()].first - marks[plan.hang()].first;
  report.hang_thread_s = marks[plan.end()].first - marks[plan.hang_window()].first;
  report.hang_loop_s = marks[plan.end()].second - marks[plan.hang_window()].second;
  return report;
}

// The other agents, `simulator` of kSimulators: each tick, each of its nodes writes its views
// when they changed and reads the verdict when its count moved. Returns, per node, when it
// first read a verdict of a hang (seconds after the hang; -1: never), and counts ticks it
// could not keep.
std::map<int, double> simulate(const Plan& plan, Clock::time_point start, std::uint16_t port,
                               int simulator, std::atomic<int>& late_ticks) {
  ddp::store::ClientOptions options;
  options.port = port;
  options.timeout = std::chrono::seconds(10);
  ddp::store::Client client(options);
  std::map<int, ViewsWriter> writers;
  std::map<int, std::int64_t> counts;
  std::map<int, double> named;
  for (int g = 1 + simulator; g < plan.nodes; g += kSimulators) named[g] = -1;
  const std::string count_key = verdict_count_key(0);
  for (auto tick = start; Seconds(tick - start).count() < plan.end(); tick += kTick) {
    std::this_thread::sleep_until(tick);
    for (auto& [g, when] : named) {
      const auto now = Clock::now();
      writers[g].write(client, round_of(g, plan.nodes, port), node_views(plan, start, g, now));
      const std::int64_t count = client.add(count_key, 0);
      if (count == counts[g]) continue;
      counts[g] = count;
      const auto verdict = nlohmann::json::parse(client.get(verdict_key(0)));
      if (when < 0 && verdict.at("hung").get<bool>()) {
        when = Seconds(Clock::now() - start).count() - plan.hang();
      }
    }
    if (Clock::now() > tick + kTick) ++late_ticks;
  }
  return named;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: ddp-bench-exchange NODES [SECONDS] [HANG_TIMEOUT_S] [MODE] "
                 "[RANKS_PER_NODE]\n");
    return 2;
  }
  Plan plan;
  plan.nodes = std::atoi(argv[1]);
  if (argc > 2) plan.seconds = std::atof(argv[2]);
  if (argc > 3) plan.hang_timeout = std::atof(argv[3]);
  plan.absent = argc <= 4 || std::string(argv[4]) != "stuck";
  if (argc > 5) plan.ranks_per_node = std::atoi(argv[5]);
  plan.blocked_rank = (plan.nodes * plan.ranks_per_node * 5) / 8 + 3;  // on a node in the middle
  plan.warm = 5 + plan.nodes / 200.0;  // connections made, every key written once
  if (plan.nodes < 2) return 2;

  // The gatherer's process, forked before any thread: the port and the start come down one
  // pipe, its report goes up another.
  int down[2], up[2];
  if (::pipe(down) != 0 || ::pipe(up) != 0) return 1;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(down[1]);
    ::close(up[0]);
    struct {
      std::uint16_t port;
      Clock::rep start;
    } message{};
    if (::read(down[0], &message, sizeof message) != sizeof message) ::_exit(1);
    const GathererReport r =
        run_gatherer(plan, Clock::time_point(Clock::duration(message.start)), message.port);
    const std::string line = nlohmann::json{
        {"training_thread_s", r.training_thread_s},
        {"training_loop_s", r.training_loop_s},
        {"onset_thread_s", r.onset_thread_s},
        {"hang_thread_s", r.hang_thread_s},
        {"hang_loop_s", r.hang_loop_s},
        {"training_rss", r.training_rss},
        {"hang_rss", r.hang_rss},
        {"named_after_s", r.named_after_s},
        {"views", r.views},
        {"headline", r.headline}}.dump();
    const bool sent = ::write(up[1], line.data(), line.size()) == static_cast<ssize_t>(line.size());
    ::_exit(sent ? 0 : 1);
  }

  ::close(down[0]);
  ::close(up[1]);
  boost::asio::io_context io;
  ddp::store::ServerOptions options;
  options.host = "127.0.0.1";
  options.logger = [](std::string_view) {};
  ddp::store::Server server(io, options);
  std::promise<pid_t> server_tid;
  boost::asio::post(io, [&] { server_tid.set_value(this_thread_id()); });
  std::thread loop([&] { io.run(); });
  const pid_t store_tid = server_tid.get_future().get();
  boost::asio::io_context proxy_io;
  CountingProxy proxy(proxy_io, server.port());
  std::thread proxy_loop([&] { proxy_io.run(); });

  const Clock::time_point start = Clock::now() + std::chrono::milliseconds(200);
  struct {
    std::uint16_t port;
    Clock::rep start;
  } message{proxy.port(), start.time_since_epoch().count()};
  if (::write(down[1], &message, sizeof message) != sizeof message) return 1;

  std::atomic<int> late_ticks{0};
  std::vector<std::future<std::map<int, double>>> simulators;
  for (int s = 0; s < kSimulators; ++s) {
    simulators.push_back(std::async(
        std::launch::async, [&, s] { return simulate(plan, start, proxy.port(), s, late_ticks); }));
  }
  // The store's side of each window: its loop's CPU, the bytes through it, what it holds.
  struct Mark {
    double store_s;
    std::uint64_t bytes;
    Clock::time_point at;
  };
  auto mark_at = [&](double t) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(Seconds(t)));
    return Mark{thread_cpu_s(store_tid), proxy.bytes(), Clock::now()};
  };
  const Mark t0 = mark_at(plan.warm), t1 = mark_at(plan.hang());
  const double stored_training = static_cast<double>(server.stats().stored_bytes);
  const Mark h0 = mark_at(plan.hang_window()), h1 = mark_at(plan.end());
  const double stored_hang = static_cast<double>(server.stats().stored_bytes);
  double named_all = 0;  // when the last agent had read the hang (infinite: one never did)
  for (auto& s : simulators) {
    for (const auto& [g, when] : s.get()) {
      named_all = std::max(named_all, when < 0 ? HUGE_VAL : when);
    }
  }
  std::string line;
  char buffer[4096];
  for (ssize_t n; (n = ::read(up[0], buffer, sizeof buffer)) > 0;) {
    line.append(buffer, static_cast<std::size_t>(n));
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  boost::asio::post(io, [&] {
    server.close();
    io.stop();
  });
  loop.join();
  proxy_io.stop();
  proxy_loop.join();
  if (line.empty()) {
    std::fprintf(stderr, "the gatherer's process reported nothing\n");
    return 1;
  }
  const nlohmann::json g = nlohmann::json::parse(line);

  auto row = [&](const char* which, const Mark& a, const Mark& b, double stored, double thread_s,
                 double loop_s, double rss) {
    const double wall = Seconds(b.at - a.at).count();
    std::printf("| %d | %d | %s | %.0f KB/s | %.1f %% | %.1f MB | %.2f %% | %.2f %% | %.1f MB |\n",
                plan.nodes, plan.nodes * plan.ranks_per_node, which,
                static_cast<double>(b.bytes - a.bytes) / wall / 1000.0,
                100.0 * (b.store_s - a.store_s) / wall, stored / 1e6, 100.0 * thread_s / wall,
                100.0 * loop_s / wall, rss / 1e6);
  };
  row("training", t0, t1, stored_training, g["training_thread_s"], g["training_loop_s"],
      g["training_rss"]);
  row(plan.absent ? "hang (absent rank)" : "hang (stuck rank)", h0, h1, stored_hang,
      g["hang_thread_s"], g["hang_loop_s"], g["hang_rss"]);
  std::fflush(stdout);
  const double named = g["named_after_s"].get<double>();
  std::fprintf(stderr,
               "%d nodes: rank %d blocked; named by the gatherer %.1f s after (--hang_timeout %.0f "
               "s; its loop then saw %zu ranks), read by every agent %.1f s after; the "
               "gatherer's onset (reading every view, judging) took %.0f ms of CPU; simulation "
               "ticks late: %d\n  %s\n",
               plan.nodes, plan.blocked_rank, named, plan.hang_timeout,
               g["views"].get<std::size_t>(), named_all, 1000.0 * g["onset_thread_s"].get<double>(),
               late_ticks.load(), g["headline"].get<std::string>().c_str());
  const bool in_time =
      named >= 0 && named <= plan.hang_timeout + 10 && named_all <= plan.hang_timeout + 10;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 && in_time ? 0 : 1;
}
