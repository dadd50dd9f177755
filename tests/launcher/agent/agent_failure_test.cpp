// When the agent itself meets a failure, with real agents and workers: a worker that cannot
// be started on a restart attempt (its log directory is blocked by a file), on one node and
// in a two-node c10d job whose store that agent serves; and a rendezvous store that accepts
// connections but never answers, behind which SIGTERM must still end the agent promptly.
#include <catch2/catch.hpp>
#include <csignal>
#include <memory>
#include <thread>

#include "ddp/elastic/rendezvous.hpp"
#include "ddp/store/client.hpp"
#include "host/rendezvous_host.hpp"
#include "multi_node_harness.hpp"
#include "mute_store.hpp"

using namespace ddp::test;
using std::chrono::steady_clock;

namespace {

double seconds_since(steady_clock::time_point start) {
  return std::chrono::duration<double>(steady_clock::now() - start).count();
}

// ddprun OPTIONS /bin/sh -c SCRIPT: a worker written in shell.
std::vector<std::string> shell_job(std::vector<std::string> options, const std::string& script) {
  std::vector<std::string> argv = {bin_path("ddprun").string()};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), {"/bin/sh", "-c", script});
  return argv;
}

// The worker's run log root, from its error file <root>/attempt_<n>/<local rank>/error.json.
constexpr const char* kRoot = "root=${TORCHELASTIC_ERROR_FILE%/attempt_*}; ";

// Attempt 0: local rank 1 puts a file where attempt 1's directory of local rank 1 must go,
// and fails; local rank 0 waits to be stopped. Attempt 1: local rank 0 starts and waits to be
// stopped (local rank 1 cannot start). Later attempts succeed.
const std::string kBlockRank1 =
    std::string(kRoot) +
    "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then"
    "  if [ \"$LOCAL_RANK\" = 1 ]; then mkdir -p \"$root/attempt_1\" && : > "
    "\"$root/attempt_1/1\"; exit 3; fi;"
    "  exec sleep 600; "
    "fi; "
    "echo \"attempt $TORCHELASTIC_RESTART_COUNT ran local_rank $LOCAL_RANK\"; "
    "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 1 ]; then exec sleep 600; fi";

}  // namespace

TEST_CASE("a worker that cannot be started on the last attempt: its group stopped, a report") {
  TempDir dir;
  ProcessResult r =
      run_process(shell_job({"--nproc_per_node=2", "--max_restarts=1", "--monitor_interval=0.1",
                             "--log_dir", dir.path().string()},
                            kBlockRank1),
                  {}, {}, kJobTimeout);
  INFO(r.out << r.err);
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("restarting it (restart 1 of at most 1)"));
  // The report names the worker, the cause and what to do.
  REQUIRE_THAT(r.err, Catch::Contains("Root Cause"));
  const std::string root = r.err.substr(r.err.find("Root Cause"));
  CHECK_THAT(root, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(root, Catch::Contains("could not start the worker of local_rank 1 (rank 1)"));
  CHECK_THAT(root, Catch::Contains("attempt_1/1"));
  CHECK_THAT(root, Catch::Contains("pass another --log_dir"));
  CHECK_THAT(r.err, !Catch::Contains("terminate"));
  CHECK_THAT(r.out, !Catch::Contains("attempt 2"));
}

TEST_CASE("a worker that cannot be started is restarted while restarts remain") {
  TempDir dir;
  ProcessResult r =
      run_process(shell_job({"--nproc_per_node=2", "--max_restarts=2", "--monitor_interval=0.1",
                             "--log_dir", dir.path().string()},
                            kBlockRank1),
                  {}, {}, kJobTimeout);
  INFO(r.out << r.err);
  CHECK(r.status == 0);
  CHECK_THAT(r.err, Catch::Contains("ddprun: could not start the worker of local_rank 1 (rank 1)"));
  CHECK_THAT(r.err, Catch::Contains("restarting it (restart 2 of at most 2)"));
  CHECK_THAT(r.out, Catch::Contains("attempt 2 ran local_rank 0"));
  CHECK_THAT(r.out, Catch::Contains("attempt 2 ran local_rank 1"));
}

TEST_CASE(
    "c10d: the store's host cannot start its worker on the last attempt: both nodes report it") {
  TempDir dir;
  const int port = reserve_port();
  // The host's only worker blocks its own attempt-1 directory and fails; the other node's
  // worker waits to be stopped.
  const std::string host_worker = std::string(kRoot) +
                                  "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then mkdir -p "
                                  "\"$root/attempt_1\" && : > \"$root/attempt_1/0\"; exit 3; fi; "
                                  "exec sleep 600";
  auto options = [&](const char* is_host, const std::string& logs) {
    auto o = c10d_node("2", port, "cannot-start");
    o.insert(o.end(), {std::string("--rdzv_conf=is_host=") + is_host, "--max_restarts=1",
                       "--log_dir", (dir.path() / logs).string()});
    return o;
  };
  ChildProcess host(shell_job(options("1", "host"), host_worker));
  ChildProcess other(shell_job(options("0", "other"), "exec sleep 600"));
  ProcessResult h = host.wait(kJobTimeout);
  ProcessResult o = other.wait(kJobTimeout);
  INFO("host:\n" << h.err << "\nother:\n" << o.err);
  CHECK(h.status == 1);
  CHECK(o.status == 1);
  for (const std::string& err : {h.err, o.err}) {
    REQUIRE_THAT(err, Catch::Contains("Root Cause"));
    CHECK_THAT(err.substr(err.find("Root Cause")),
               Catch::Contains("could not start the worker of local_rank 0"));
  }
}

TEST_CASE("a rendezvous store that never answers: SIGTERM ends the agent within seconds") {
  MuteStore store;
  auto options = c10d_node("2", store.port(), "mute");
  // leave() gets 1 s for each store step; nothing else may wait on the store after SIGTERM
  // (its read timeout, 60 s, is what the agent used to wait).
  options.push_back("--rdzv_conf=is_host=0,close_timeout=1,read_timeout=60");
  ChildProcess agent(ddprun(options, {"--hello"}));
  // Its heartbeat and its join each sent a request that no answer will come to.
  REQUIRE(store.wait_for_unanswered(2, kJobTimeout));
  const auto start = steady_clock::now();
  agent.signal(SIGTERM);
  ProcessResult r = agent.wait(kJobTimeout);
  const double took = seconds_since(start);
  INFO(r.err);
  CHECK(r.status == 128 + SIGTERM);
  CHECK(took < 10);
  CHECK_THAT(r.err, Catch::Contains("got SIGTERM: leaving the rendezvous"));
}

TEST_CASE("a store client's interrupt cuts the call under way and fails every later one") {
  MuteStore store;
  ddp::store::ClientOptions options;
  options.port = static_cast<std::uint16_t>(store.port());
  options.connect_timeout = std::chrono::seconds(10);
  options.timeout = std::chrono::seconds(60);
  ddp::store::Client client(options);
  std::thread cutter([&] {
    store.wait_for_unanswered(1, kJobTimeout);  // the get below waits for its key
    client.interrupt();
  });
  const auto start = steady_clock::now();
  CHECK_THROWS_AS(client.get("never"), ddp::store::StoreError);
  const double took = seconds_since(start);
  cutter.join();
  CHECK(took < 5);  // not the 60 s timeout
  CHECK_THROWS_WITH(client.add("k", 1), Catch::Contains("interrupted"));
}

TEST_CASE("leaving the rendezvous twice is harmless") {
  boost::asio::io_context io(1);
  ddp::launcher::LaunchConfig config;  // one node: a LocalRendezvous and the agent's store
  config.master_addr = "127.0.0.1";
  std::vector<std::string> notices;
  ddp::launcher::RendezvousHost host(
      io, config, {"node-a", "host-a", "", 1, "default", std::nullopt},
      {nullptr, [&](const std::string& line) { notices.push_back(line); }});
  host.leave();
  host.leave();  // used to assign a running std::thread: std::terminate
  CHECK_FALSE(host.hosts_rendezvous_store());
  CHECK(notices.empty());
}

// What the agent does when it exits (or lingers and gets a second signal): end the engine
// while its threads are blocked on a store that stopped answering.
TEST_CASE("the rendezvous engine leaves and ends at once behind a store that never answers") {
  MuteStore store;
  ddp::elastic::RendezvousSettings settings;
  settings.backend = "c10d";
  settings.run_id = "mute-engine";
  settings.store_host = "127.0.0.1";
  settings.store_port = store.port();
  settings.min_nodes = settings.max_nodes = 2;
  settings.timeouts.close = std::chrono::seconds(1);
  settings.timeouts.read = std::chrono::seconds(60);
  settings.self = {"", "host-a", "127.0.0.1", 1, "default", std::nullopt};
  auto engine = ddp::elastic::make_store_rendezvous(settings);
  engine->next_round(
      0, [](ddp::elastic::RoundInfo) {}, [](std::exception_ptr) {}, {});
  // The round thread's first request (and the heartbeat's) got no answer: both block.
  REQUIRE(store.wait_for_unanswered(2, kJobTimeout));
  const auto start = steady_clock::now();
  engine->leave();  // each store step at most close_timeout
  const double left = seconds_since(start);
  engine.reset();  // the round thread's call is cut, not waited out (read timeout: 60 s)
  const double ended = seconds_since(start);
  CHECK(left < 5);
  CHECK(ended - left < 5);
}

TEST_CASE("c10d: a second SIGTERM while the store's host shuts down ends it at once") {
  TempDir dir;
  const int port = reserve_port();
  const std::vector<std::string> worker = {"--ready", "--wait"};
  auto options = [&](const char* is_host) {
    auto o = c10d_node("2", port, "twice");
    o.push_back(std::string("--rdzv_conf=is_host=") + is_host);
    return ddprun(o, worker);
  };
  ChildProcess host(options("1"));
  ChildProcess other(options("0"));
  for (auto* a : {&host, &other}) a->wait_for_stdout_lines("ready rank=", 1, kJobTimeout);
  const auto start = steady_clock::now();
  host.signal(SIGTERM);
  host.wait_for_stderr("got SIGTERM", kJobTimeout);
  host.signal(SIGTERM);
  ProcessResult r = host.wait(kJobTimeout);
  const double took = seconds_since(start);
  INFO(r.err);
  CHECK(r.status == 128 + SIGTERM);
  // Its leave() talks to the store its own loop serves: answered, never waited out (it used
  // to stop the loop at once and wait up to 5 s a step, or the read timeout).
  CHECK(took < 4);
  CHECK_THAT(r.err, !Catch::Contains("terminate"));
}
