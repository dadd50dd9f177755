#pragma once
// ddpstore-bench's modes and what they share (ddpstore_bench.cpp has the command line).

#include <cstdint>
#include <string>

namespace ddp::bench {

struct BenchOptions {
  std::string host = "127.0.0.1";  // server address (IPv4 for rendezvous mode)
  std::uint16_t port = 29500;      // server port
  int dialect = 2;                 // 1 or 2
  int clients = 16;                // mix: client connections
  int threads = 1;                 // mix: threads driving them (each an epoll loop)
  double seconds = 5;              // mix: measured duration
  int ranks = 1024;                // rendezvous: simulated ranks
  int max_connecting = 1024;       // rendezvous: ranks between connect and first reply, in all
  int ranks_per_source = 4000;     // rendezvous: ranks per loopback source address
  int ranks_per_table = 0;         // rendezvous: ranks per descriptor table (0: the limit - 256)
  double time_limit = 120;         // rendezvous: give up after this many seconds
  int server_pid = 0;              // server process for CPU and memory accounting (0: none)
};

// The server's user + system CPU time so far (all its threads), in seconds (0 without a pid).
double server_cpu_seconds(int pid);

// Raises the soft open-file limit to `wanted`, or as far as the hard limit allows; returns
// the soft limit it ends at.
std::uint64_t raise_open_file_limit(std::uint64_t wanted);

int run_mix(const BenchOptions& o);
int run_rendezvous(const BenchOptions& o);  // bench_rendezvous.cpp
int run_floor_server(std::uint16_t port);   // bench_floor_server.cpp

}  // namespace ddp::bench
