// ddpstore-bench rendezvous: N simulated ranks go through what init_process_group and a
// first NCCL communicator do with the store, all connected until the last is through:
//   connect; (2.x) VALIDATE + PING;
//   ADD init/ 1, the rank that brings it to N sets init/complete (c10d's world-size count);
//   SET addr/<rank>, WAIT for init/complete and the addresses of rank 0 and both ring
//     neighbours, then fetch those (2.x MULTI_GET, 1.x GETs) (Gloo's address exchange);
//   rank 0 SETs uid (128 bytes, as NCCL's unique id); every rank WAITs for it, then GETs it;
//   the store barrier as c10d does it: ADD barrier 1, the last one in SETs barrier/done,
//     everyone WAITs for barrier/done.
// Non-blocking sockets on epoll loops, spread over loopback source addresses (127.0.0.2, .3,
// ...) so that ephemeral ports never run out. One descriptor table holds only RLIMIT_NOFILE
// sockets, so past that the ranks are split over threads that each unshare their table
// (unshare(CLONE_FILES)) and run their own loop.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <latch>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "ddp/store/store.hpp"
#include "ddp/store/wire_codec.hpp"
#include "ddpstore_bench.hpp"

namespace ddp::bench {
namespace {

using namespace ddp::store;
using Clock = std::chrono::steady_clock;

// Descriptors of each table left to the load generator itself (stdio, epoll, a margin).
constexpr int kOwnDescriptors = 256;
constexpr std::size_t kAddressBytes = 32;    // a rank's address blob
constexpr std::size_t kUniqueIdBytes = 128;  // NCCL's ncclUniqueId

// A rank's steps, in order; each waits for its reply before the next is sent.
enum Phase : int {
  kConnecting,
  kHandshake,    // 2.x: VALIDATE + PING
  kCountIn,      // ADD init/ 1
  kPublish,      // SET addr/<rank> (+ init/complete), WAIT for it and the peers' addresses
  kFetchPeers,   // MULTI_GET / GETs of the peers' addresses
  kWaitId,       // (rank 0: SET uid) WAIT uid
  kGetId,        // GET uid
  kBarrierAdd,   // ADD barrier 1
  kBarrierWait,  // (the last one in: SET barrier/done) WAIT barrier/done
  kDone,
};

struct Rank {
  int fd = -1;
  int phase = kConnecting;
  std::size_t expected = 0;  // reply bytes the phase waits for
  std::size_t received = 0;
  char count_reply[8] = {};  // the last ADD's reply
};

// Ranks [first, first + count) of the job on one epoll loop.
class Rendezvous {
 public:
  Rendezvous(const BenchOptions& o, std::string prefix, int first, int count, int max_connecting)
      : o_(o),
        dialect_(o.dialect == 1 ? Dialect::V1 : Dialect::V2),
        prefix_(std::move(prefix)),
        first_(first),
        max_connecting_(max_connecting),
        ranks_(static_cast<std::size_t>(count)) {
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
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Runs every rank to the end or to the deadline; returns the ranks done.
  int run(Clock::time_point deadline) {
    const int count = static_cast<int>(ranks_.size());
    std::vector<epoll_event> events(4096);
    while (done_ < count) {
      while (connecting_ < max_connecting_ && next_ < count) start(next_++);
      int n = ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), 100);
      for (int i = 0; i < n; ++i) step(static_cast<int>(events[i].data.u32), events[i].events);
      if (Clock::now() > deadline) break;
    }
    return done_;
  }

 private:
  [[noreturn]] void fail(int index, const std::string& what) {
    throw StoreError("rank " + std::to_string(first_ + index) + ": " + what);
  }

  std::string key(const std::string& name) const { return prefix_ + name; }
  std::string address_key(int rank) const { return key("addr/" + std::to_string(rank)); }

  void start(int index) {
    Rank& r = ranks_[static_cast<std::size_t>(index)];
    const int rank = first_ + index;
    r.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r.fd < 0) fail(index, std::string("socket: ") + std::strerror(errno));
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
      fail(index, std::string("bind: ") + std::strerror(errno));
    }
    int rc = ::connect(r.fd, reinterpret_cast<sockaddr*>(&server_), sizeof(server_));
    if (rc != 0 && errno != EINPROGRESS) {
      fail(index, std::string("connect: ") + std::strerror(errno));
    }
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.u32 = static_cast<std::uint32_t>(index);
    ::epoll_ctl(epoll_, EPOLL_CTL_ADD, r.fd, &ev);
    ++connecting_;
  }

  void request(Command command, std::vector<std::string> keys, std::vector<std::string> values = {},
               std::int64_t delta = 0, std::uint32_t u32 = 0) {
    encode_request(dialect_, make_request(command, std::move(keys), std::move(values), delta, u32),
                   out_);
  }

  bool last_in(const Rank& r) const { return get_i64(r.count_reply) == o_.ranks; }

  void send_phase(int index) {
    Rank& r = ranks_[static_cast<std::size_t>(index)];
    const int rank = first_ + index;
    out_.clear();
    r.received = 0;
    switch (r.phase) {
      case kHandshake:
        request(Command::Validate, {}, {}, 0, kValidationMagic);
        request(Command::Ping, {}, {}, 0, static_cast<std::uint32_t>(rank));
        r.expected = 4;
        break;
      case kCountIn:
        request(Command::Add, {key("init/")}, {}, 1);
        r.expected = 8;
        break;
      case kPublish: {
        request(Command::Set, {address_key(rank)}, {std::string(kAddressBytes, 'a')});
        if (last_in(r)) request(Command::Set, {key("init/complete")}, {"1"});
        auto keys = peers(rank);
        keys.insert(keys.begin(), key("init/complete"));
        request(Command::Wait, keys);
        r.expected = 1;
        break;
      }
      case kFetchPeers:
        if (dialect_ == Dialect::V2) {
          request(Command::MultiGet, peers(rank));
        } else {
          for (const auto& k : peers(rank)) request(Command::Get, {k});
        }
        r.expected = 3 * (8 + kAddressBytes);
        break;
      case kWaitId:
        if (rank == 0) request(Command::Set, {key("uid")}, {std::string(kUniqueIdBytes, 'u')});
        request(Command::Wait, {key("uid")});
        r.expected = 1;
        break;
      case kGetId:
        request(Command::Get, {key("uid")});
        r.expected = 8 + kUniqueIdBytes;
        break;
      case kBarrierAdd:
        request(Command::Add, {key("barrier")}, {}, 1);
        r.expected = 8;
        break;
      case kBarrierWait:
        if (last_in(r)) request(Command::Set, {key("barrier/done")}, {"1"});
        request(Command::Wait, {key("barrier/done")});
        r.expected = 1;
        break;
    }
    ssize_t n = ::send(r.fd, out_.data(), out_.size(), MSG_NOSIGNAL);
    if (n != static_cast<ssize_t>(out_.size())) fail(index, "short send");
  }

  std::vector<std::string> peers(int rank) const {
    const int n = o_.ranks;
    return {address_key(0), address_key((rank + 1) % n), address_key((rank + n - 1) % n)};
  }

  void step(int index, std::uint32_t events) {
    Rank& r = ranks_[static_cast<std::size_t>(index)];
    if (r.phase == kConnecting) {
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(r.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) fail(index, std::string("connect: ") + std::strerror(err));
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u32 = static_cast<std::uint32_t>(index);
      ::epoll_ctl(epoll_, EPOLL_CTL_MOD, r.fd, &ev);
      r.phase = dialect_ == Dialect::V2 ? kHandshake : kCountIn;
      send_phase(index);
      return;
    }
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
    ssize_t n = ::recv(r.fd, buffer_, sizeof(buffer_), 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) fail(index, "the server closed the connection in phase " + std::to_string(r.phase));
    if (r.phase == kCountIn || r.phase == kBarrierAdd) {
      std::memcpy(r.count_reply + r.received, buffer_,
                  std::min<std::size_t>(static_cast<std::size_t>(n), 8 - r.received));
    }
    r.received += static_cast<std::size_t>(n);
    if (r.received < r.expected) return;
    if (r.received > r.expected) fail(index, "more reply bytes than expected");
    // A rank stops counting as connecting once the server answered its first request.
    if (r.phase == (dialect_ == Dialect::V2 ? kHandshake : kCountIn)) --connecting_;
    if (++r.phase == kDone) {
      ++done_;
      return;
    }
    send_phase(index);
  }

  const BenchOptions& o_;
  Dialect dialect_;
  std::string prefix_;
  int first_;
  int max_connecting_;
  std::vector<Rank> ranks_;
  int epoll_;
  sockaddr_in server_{};
  int next_ = 0;
  int connecting_ = 0;
  int done_ = 0;
  std::string out_;
  char buffer_[64 * 1024];
};

// The number after `field` in /proc/<pid>/status (VmRSS: kB; Threads: a count); 0 when unknown.
long status_value(int pid, const std::string& field) {
  if (pid <= 0) return 0;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return 0;
}

// The kernel's TCP buffer memory in use (/proc/net/sockstat "TCP: ... mem N", in pages),
// in kB; every TCP socket of the machine, both ends of these connections included.
long tcp_buffer_kb() {
  std::ifstream sockstat("/proc/net/sockstat");
  std::string line;
  while (std::getline(sockstat, line)) {
    if (line.rfind("TCP:", 0) != 0) continue;
    const auto at = line.find(" mem ");
    if (at == std::string::npos) return 0;
    return std::stol(line.substr(at + 5)) * (::sysconf(_SC_PAGESIZE) / 1024);
  }
  return 0;
}

// The machine's slab memory (/proc/meminfo Slab), in kB: where sockets' own structures live.
long slab_kb() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("Slab:", 0) == 0) return std::stol(line.substr(5));
  }
  return 0;
}

// Closes every descriptor a thread's new table copied from the process's but stdio.
void drop_copied_descriptors() {
  if (::close_range(3, ~0U, 0) == 0) return;
  const long highest = ::sysconf(_SC_OPEN_MAX);
  for (long fd = 3; fd < highest; ++fd) ::close(static_cast<int>(fd));
}

// What the threads report to the main one.
struct Outcome {
  std::mutex mutex;
  int done = 0;
  Clock::time_point last_done;
  std::exception_ptr error;
};

}  // namespace

int run_rendezvous(const BenchOptions& o) {
  const auto limit = static_cast<int>(std::min<std::uint64_t>(
      raise_open_file_limit(static_cast<std::uint64_t>(o.ranks) + 1024), 1u << 30));
  const int per_table =
      o.ranks_per_table > 0 ? o.ranks_per_table : std::max(1, limit - kOwnDescriptors);
  const int tables = (o.ranks + per_table - 1) / per_table;
  const int max_connecting = std::max(16, o.max_connecting / tables);
  const std::string prefix = "rdv" + std::to_string(::getpid()) + "/";

  const long rss_before = status_value(o.server_pid, "VmRSS");
  const long tcp_before = tcp_buffer_kb();
  const long slab_before = slab_kb();
  const double cpu_before = server_cpu_seconds(o.server_pid);
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(o.time_limit));
  Outcome outcome;
  outcome.last_done = start;
  std::latch finished(tables);  // every thread's ranks are done (or gave up)
  std::latch measured(1);       // the main thread has measured: sockets may close
  std::vector<std::thread> threads;
  for (int t = 0; t < tables; ++t) {
    const int first = t * per_table;
    const int count = std::min(per_table, o.ranks - first);
    threads.emplace_back([&, first, count] {
      int done = 0;
      std::exception_ptr error;
      try {
        if (tables > 1) {
          sigset_t all;  // signals stay with the main thread's table
          ::sigfillset(&all);
          ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
          if (::unshare(CLONE_FILES) != 0) {
            throw StoreError(std::string("unshare(CLONE_FILES): ") + std::strerror(errno));
          }
          drop_copied_descriptors();
        }
        Rendezvous rendezvous(o, prefix, first, count, max_connecting);
        done = rendezvous.run(deadline);
        {
          std::lock_guard lock(outcome.mutex);
          outcome.done += done;
          outcome.last_done = std::max(outcome.last_done, Clock::now());
        }
        finished.count_down();
        measured.wait();  // every rank stays connected until the measurement
      } catch (...) {
        std::lock_guard lock(outcome.mutex);
        if (!outcome.error) outcome.error = std::current_exception();
        error = outcome.error;
      }
      if (error) finished.count_down();
    });
  }
  finished.wait();
  const double cpu = server_cpu_seconds(o.server_pid) - cpu_before;
  const long rss_after = status_value(o.server_pid, "VmRSS");
  const long tcp_after = tcp_buffer_kb();
  const long slab_after = slab_kb();
  measured.count_down();
  for (auto& t : threads) t.join();
  if (outcome.error) std::rethrow_exception(outcome.error);

  const double elapsed = std::chrono::duration<double>(outcome.last_done - start).count();
  const double n = o.ranks;
  std::cout << "rendezvous dialect=" << o.dialect << ".x ranks=" << o.ranks
            << " done=" << outcome.done << " tables=" << tables << " seconds=" << elapsed;
  if (o.server_pid > 0) {
    std::cout << " server_cpu_s=" << cpu << " server_rss_mb=" << rss_after / 1024.0
              << " server_rss_kb_per_rank=" << static_cast<double>(rss_after - rss_before) / n
              << " server_threads=" << status_value(o.server_pid, "Threads");
  }
  std::cout << " tcp_buffers_kb=" << tcp_after - tcp_before
            << " slab_kb_per_rank=" << static_cast<double>(slab_after - slab_before) / n
            << (outcome.done < o.ranks ? " (time limit reached)" : "") << std::endl;
  return outcome.done == o.ranks ? 0 : 3;
}

}  // namespace ddp::bench
