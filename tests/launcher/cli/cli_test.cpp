// The command line, in-process: every option in both spellings, PET_ defaults, bad input.
#include "ddp/launcher/cli.hpp"

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "test_support.hpp"

using namespace ddp::launcher;

namespace {

// Exactly `env` as the process's PET_* variables (CLI11 reads them with getenv).
class ScopedPetEnvironment : public ddp::test::ScopedEnvironment {
 public:
  explicit ScopedPetEnvironment(const std::map<std::string, std::string>& env)
      : ScopedEnvironment(env, "PET_") {}
};

struct Fake {
  std::map<std::string, std::string> env;  // PET_* variables
  int gpus = 0;
  int cpus = 8;

  CliContext context() const {
    CliContext c;
    c.gpu_count = [this] { return gpus; };
    c.cpu_count = [this] { return cpus; };
    return c;
  }
};

LaunchConfig parse(std::vector<std::string> args, const Fake& fake = {}) {
  ScopedPetEnvironment env(fake.env);
  CliResult result = parse_command_line(args, fake.context());
  REQUIRE(result.action == CliResult::Action::kRun);
  return result.config;
}

std::string usage_error(std::vector<std::string> args, const Fake& fake = {}) {
  ScopedPetEnvironment env(fake.env);
  try {
    parse_command_line(args, fake.context());
  } catch (const NotImplementedError& e) {
    FAIL("expected a UsageError, got NotImplementedError: " << e.what());
  } catch (const UsageError& e) {
    return e.what();
  }
  FAIL("no error for the arguments");
  return "";
}

std::string not_implemented(std::vector<std::string> args, const Fake& fake = {}) {
  ScopedPetEnvironment env(fake.env);
  try {
    parse_command_line(args, fake.context());
  } catch (const NotImplementedError& e) {
    return e.what();
  }
  FAIL("not refused as not implemented");
  return "";
}

}  // namespace

TEST_CASE("defaults are torchrun's") {
  LaunchConfig c = parse({"train.py"});
  CHECK(c.min_nodes == 1);
  CHECK(c.max_nodes == 1);
  CHECK(c.nproc_per_node == 1);
  CHECK(c.nproc_per_node_spec == "1");
  CHECK(c.node_rank == 0);
  CHECK_FALSE(c.standalone);
  CHECK(c.rdzv_backend == "static");
  CHECK(c.rdzv_endpoint.empty());
  // One node without a master port or endpoint: a fresh UUID per run, as torchrun 2.x.
  CHECK(std::regex_match(
      c.rdzv_id,
      std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")));
  CHECK(parse({"x"}).rdzv_id != c.rdzv_id);
  CHECK(parse({"--master_port=29555", "x"}).rdzv_id == "none");
  CHECK(parse({"--nnodes=2", "x"}).rdzv_id == "none");
  CHECK(parse({"--rdzv_id=mine", "x"}).rdzv_id == "mine");
  CHECK(parse({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:29400", "x"}).rdzv_id == "none");
  CHECK(c.rdzv_conf.empty());
  CHECK(c.master_addr == "127.0.0.1");
  CHECK_FALSE(c.master_port.has_value());
  CHECK(c.local_addr.empty());
  CHECK(c.max_restarts == 0);
  CHECK(c.monitor_interval_s == 5.0);
  CHECK(c.start_method == "spawn");
  CHECK(c.role == "default");
  CHECK(c.signals_to_handle == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});
  CHECK(c.shutdown_timeout == std::chrono::seconds(30));
  CHECK(c.hang_timeout == std::chrono::seconds(300));
  CHECK(c.straggler_window == 20);
  CHECK(c.straggler_threshold_s == 0.005);
  CHECK_FALSE(c.trace_file.has_value());
  CHECK_FALSE(c.log_dir.has_value());
  CHECK(c.redirects.for_rank(0) == Std::kNone);
  CHECK(c.tee.for_rank(3) == Std::kNone);
  CHECK_FALSE(c.local_ranks_filter.has_value());
  CHECK(c.entrypoint_kind == EntrypointKind::kAuto);
  CHECK_FALSE(c.run_path);
  CHECK_FALSE(c.legacy_local_rank);
  CHECK_FALSE(c.store_allow_any);
  CHECK(c.entrypoint == "train.py");
  CHECK(c.entrypoint_args.empty());
}

TEST_CASE("every valued option in every spelling") {
  struct Row {
    std::vector<std::string> args;
    std::function<bool(const LaunchConfig&)> check;
  };
  auto nproc3 = [](const LaunchConfig& c) { return c.nproc_per_node == 3; };
  auto restarts = [](const LaunchConfig& c) { return c.max_restarts == 4; };
  auto logdir = [](const LaunchConfig& c) { return c.log_dir == std::optional<std::string>("/l"); };
  std::vector<Row> rows = {
      {{"--nnodes=1"}, [](auto& c) { return c.min_nodes == 1 && c.max_nodes == 1; }},
      {{"--nnodes", "1:1"}, [](auto& c) { return c.max_nodes == 1; }},
      {{"--nproc_per_node=3"}, nproc3},
      {{"--nproc-per-node=3"}, nproc3},
      {{"--nproc_per_node", "3"}, nproc3},
      {{"--nproc-per-node", "3"}, nproc3},
      {{"--node_rank=0"}, [](auto& c) { return c.node_rank == 0; }},
      {{"--node-rank", "0"}, [](auto& c) { return c.node_rank == 0; }},
      {{"--rdzv_backend=c10d"}, [](auto& c) { return c.rdzv_backend == "c10d"; }},
      {{"--rdzv-backend", "c10d"}, [](auto& c) { return c.rdzv_backend == "c10d"; }},
      {{"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:29400"},
       [](auto& c) { return c.rdzv_endpoint == "localhost:29400"; }},
      {{"--rdzv_backend=c10d", "--rdzv-endpoint", "127.0.0.1:1"},
       [](auto& c) { return c.rdzv_endpoint == "127.0.0.1:1"; }},
      {{"--rdzv_id=job7"}, [](auto& c) { return c.rdzv_id == "job7"; }},
      {{"--rdzv-id", "job7"}, [](auto& c) { return c.rdzv_id == "job7"; }},
      {{"--rdzv_conf=timeout=5,read_timeout=60"},
       [](auto& c) {
         return c.rdzv_conf.at("timeout") == "5" && c.rdzv_conf.at("read_timeout") == "60";
       }},
      {{"--rdzv-conf", "a=1"}, [](auto& c) { return c.rdzv_conf.at("a") == "1"; }},
      {{"--master_addr=10.0.0.1"}, [](auto& c) { return c.master_addr == "10.0.0.1"; }},
      {{"--master-addr", "h"}, [](auto& c) { return c.master_addr == "h"; }},
      {{"--master_port=1234"}, [](auto& c) { return c.master_port == 1234; }},
      {{"--master-port", "1234"}, [](auto& c) { return c.master_port == 1234; }},
      {{"--local_addr=127.0.0.2"}, [](auto& c) { return c.local_addr == "127.0.0.2"; }},
      {{"--local-addr", "127.0.0.2"}, [](auto& c) { return c.local_addr == "127.0.0.2"; }},
      {{"--max_restarts=4"}, restarts},
      {{"--max-restarts", "4"}, restarts},
      {{"--monitor_interval=0.1"}, [](auto& c) { return c.monitor_interval_s == 0.1; }},
      {{"--monitor-interval", "2"}, [](auto& c) { return c.monitor_interval_s == 2.0; }},
      {{"--start_method=fork"}, [](auto& c) { return c.start_method == "fork"; }},
      {{"--start-method", "forkserver"}, [](auto& c) { return c.start_method == "forkserver"; }},
      {{"--role=trainer"}, [](auto& c) { return c.role == "trainer"; }},
      {{"--role", "trainer"}, [](auto& c) { return c.role == "trainer"; }},
      {{"--signals_to_handle=SIGUSR1,SIGTERM"},
       [](auto& c) {
         return c.signals_to_handle == std::vector<int>{SIGUSR1, SIGTERM};
       }},
      {{"--signals-to-handle", "SIGINT"},
       [](auto& c) { return c.signals_to_handle == std::vector<int>{SIGINT}; }},
      {{"--shutdown_timeout=1.5"},
       [](auto& c) { return c.shutdown_timeout == std::chrono::milliseconds(1500); }},
      {{"--shutdown-timeout", "0"},
       [](auto& c) { return c.shutdown_timeout == std::chrono::milliseconds(0); }},
      {{"--hang_timeout=2.5"},
       [](auto& c) { return c.hang_timeout == std::chrono::milliseconds(2500); }},
      {{"--hang-timeout", "0"},
       [](auto& c) { return c.hang_timeout == std::chrono::milliseconds(0); }},
      {{"--straggler-window", "0"}, [](auto& c) { return c.straggler_window == 0; }},
      {{"--straggler_threshold=0.02"}, [](auto& c) { return c.straggler_threshold_s == 0.02; }},
      {{"--trace_file=/t.json"}, [](auto& c) { return c.trace_file == "/t.json"; }},
      {{"--log_dir=/l"}, logdir},
      {{"--log-dir", "/l"}, logdir},
      {{"-r", "3"}, [](auto& c) { return c.redirects.for_rank(5) == Std::kAll; }},
      {{"-r2"}, [](auto& c) { return c.redirects.for_rank(0) == Std::kErr; }},
      {{"--redirects=0:1,1:2"},
       [](auto& c) {
         return c.redirects.for_rank(0) == Std::kOut && c.redirects.for_rank(1) == Std::kErr &&
                c.redirects.for_rank(2) == Std::kNone;
       }},
      {{"--redirects", "1"}, [](auto& c) { return c.redirects.for_rank(0) == Std::kOut; }},
      {{"-t", "3"}, [](auto& c) { return c.tee.for_rank(0) == Std::kAll; }},
      {{"-t1"}, [](auto& c) { return c.tee.for_rank(0) == Std::kOut; }},
      {{"--tee=1:3"},
       [](auto& c) { return c.tee.for_rank(1) == Std::kAll && c.tee.for_rank(0) == Std::kNone; }},
      {{"--nproc_per_node=3", "--local_ranks_filter=0,2"},
       [](auto& c) {
         return c.local_ranks_filter == std::set<int>{0, 2};
       }},
      {{"--nproc_per_node=2", "--local-ranks-filter", "1"},
       [](auto& c) { return c.local_ranks_filter == std::set<int>{1}; }},
      {{"-m"}, [](auto& c) { return c.entrypoint_kind == EntrypointKind::kModule; }},
      {{"--module"}, [](auto& c) { return c.entrypoint_kind == EntrypointKind::kModule; }},
      {{"--no_python"}, [](auto& c) { return c.entrypoint_kind == EntrypointKind::kDirect; }},
      {{"--no-python"}, [](auto& c) { return c.entrypoint_kind == EntrypointKind::kDirect; }},
      {{"--run_path"}, [](auto& c) { return c.run_path; }},
      {{"--run-path", "--no_python"},
       [](auto& c) { return c.run_path && c.entrypoint_kind == EntrypointKind::kAuto; }},
      {{"--legacy_local_rank"}, [](auto& c) { return c.legacy_local_rank; }},
      {{"--legacy-local-rank"}, [](auto& c) { return c.legacy_local_rank; }},
      {{"--store_allow_any"}, [](auto& c) { return c.store_allow_any; }},
      {{"--store-allow-any"}, [](auto& c) { return c.store_allow_any; }},
      {{"--max_restarts=1", "--max_restarts=4"}, restarts},  // the last one wins, as argparse
      {{"--virtual_local_rank"}, [](auto& c) { return c.virtual_local_rank; }},
      {{"--virtual-local-rank"}, [](auto& c) { return c.virtual_local_rank; }},
      {{"--numa_binding=node"}, [](auto& c) { return c.numa_binding == "node"; }},
      {{"--numa-binding", "core-complex"},
       [](auto& c) { return c.numa_binding == "core-complex"; }},
      {{"--log_line_prefix_template=${rank}: "},
       [](auto& c) { return c.log_line_prefix_template == "${rank}: "; }},
      {{"--log-line-prefix-template", "[${hostname}]"},
       [](auto& c) { return c.log_line_prefix_template == "[${hostname}]"; }},
      {{"--duplicate_stdout_filters=apple,or,,ange"},
       [](auto& c) {
         return c.duplicate_stdout_filters == std::vector<std::string>{"apple", "or,ange"};
       }},
      {{"--duplicate-stderr-filters", "loss"},
       [](auto& c) { return c.duplicate_stderr_filters == std::vector<std::string>{"loss"}; }},
      {{"--event_log_handler=console"}, [](auto& c) { return c.event_log_handler == "console"; }},
      {{"--event-log-handler", "dynamic_rendezvous"},
       [](auto& c) { return c.event_log_handler == "dynamic_rendezvous"; }},
      {{"--logs_specs=default"}, [](auto& c) { return c.log_dir == std::nullopt; }},
      {{"--logs-specs", "default"}, [](auto& c) { return c.event_log_handler == "null"; }},
      {{"--warm_start=off"}, [](auto& c) { return c.warm_start == WarmStart::kOff; }},
      {{"--warm-start", "always"}, [](auto& c) { return c.warm_start == WarmStart::kAlways; }},
  };
  for (const Row& row : rows) {
    std::vector<std::string> args = row.args;
    args.push_back("train.py");
    INFO("args: " << Catch::Detail::stringify(args));
    CHECK(row.check(parse(args)));
  }
}

TEST_CASE("standalone makes a local c10d rendezvous with a fresh run id") {
  LaunchConfig a = parse({"--standalone", "--rdzv_id=ignored", "train.py"});
  LaunchConfig b = parse({"--standalone", "train.py"});
  CHECK(a.standalone);
  CHECK(a.rdzv_backend == "c10d");
  CHECK(a.rdzv_endpoint == "localhost:0");
  CHECK(a.rdzv_id.size() == 36);
  CHECK(a.rdzv_id[14] == '4');
  CHECK(a.rdzv_id != b.rdzv_id);
}

TEST_CASE("nproc_per_node as cpu or gpu or auto") {
  Fake fake;
  fake.cpus = 6;
  CHECK(parse({"--nproc_per_node=cpu", "x"}, fake).nproc_per_node == 6);
  CHECK(parse({"--nproc_per_node=auto", "x"}, fake).nproc_per_node == 6);
  CHECK_THAT(usage_error({"--nproc_per_node=gpu", "x"}, fake), Catch::Contains("no GPU found"));
  fake.gpus = 2;
  CHECK(parse({"--nproc_per_node=gpu", "x"}, fake).nproc_per_node == 2);
  CHECK(parse({"--nproc_per_node=auto", "x"}, fake).nproc_per_node == 2);
  CHECK(parse({"--nproc_per_node=gpu", "x"}, fake).nproc_per_node_spec == "gpu");
}

TEST_CASE("PET_ variables give every option its default and the command line wins") {
  Fake fake;
  fake.env = {{"PET_NPROC_PER_NODE", "4"},
              {"PET_MAX_RESTARTS", "2"},
              {"PET_RDZV_ID", "pet-job"},
              {"PET_ROLE", "r"},
              {"PET_STANDALONE", "0"},
              {"PET_NO_PYTHON", "1"},
              {"PET_TEE", "3"},
              {"PET_LOG_DIR", "/pet"},
              {"PET_MASTER_PORT", "4321"},
              {"PET_LOCAL_RANKS_FILTER", "0"},
              {"PET_SHUTDOWN_TIMEOUT", "2"},
              {"PET_SIGNALS_TO_HANDLE", "SIGTERM"},
              {"PET_MONITOR_INTERVAL", "1"},
              {"PET_REDIRECTS", "2"},
              {"PET_NNODES", "1:1"},
              {"PET_MASTER_ADDR", "127.0.0.9"}};
  LaunchConfig c = parse({"x"}, fake);
  CHECK(c.nproc_per_node == 4);
  CHECK(c.max_restarts == 2);
  CHECK(c.rdzv_id == "pet-job");
  CHECK(c.role == "r");
  CHECK_FALSE(c.standalone);
  CHECK(c.entrypoint_kind == EntrypointKind::kDirect);
  CHECK(c.tee.for_rank(0) == Std::kAll);
  CHECK(c.redirects.for_rank(0) == Std::kErr);
  CHECK(c.log_dir == std::optional<std::string>("/pet"));
  CHECK(c.master_port == 4321);
  CHECK(c.master_addr == "127.0.0.9");
  CHECK(c.local_ranks_filter == std::set<int>{0});
  CHECK(c.shutdown_timeout == std::chrono::seconds(2));
  CHECK(c.signals_to_handle == std::vector<int>{SIGTERM});
  CHECK(c.monitor_interval_s == 1.0);

  LaunchConfig d = parse({"--nproc-per-node=2", "--max_restarts", "0", "x"}, fake);
  CHECK(d.nproc_per_node == 2);
  CHECK(d.max_restarts == 0);

  fake.env = {{"PET_STANDALONE", "1"},
              {"PET_MODULE", "1"},
              {"PET_LEGACY_LOCAL_RANK", "1"},
              {"PET_STORE_ALLOW_ANY", "1"}};
  LaunchConfig e = parse({"pkg.mod"}, fake);
  CHECK(e.standalone);
  CHECK(e.store_allow_any);
  CHECK(e.entrypoint_kind == EntrypointKind::kModule);
  CHECK(e.legacy_local_rank);
}

TEST_CASE("everything after the entrypoint goes to the worker untouched") {
  LaunchConfig c = parse(
      {"--nproc_per_node=2", "train.py", "--nproc_per_node=5", "-m", "--", "x y", "", "--help"});
  CHECK(c.nproc_per_node == 2);
  CHECK(c.entrypoint == "train.py");
  CHECK(c.entrypoint_args ==
        std::vector<std::string>{"--nproc_per_node=5", "-m", "--", "x y", "", "--help"});
  LaunchConfig d = parse({"--", "-weird-name", "a"});
  CHECK(d.entrypoint == "-weird-name");
  CHECK(d.entrypoint_args == std::vector<std::string>{"a"});
}

TEST_CASE("bad input is a UsageError naming the option") {
  CHECK_THAT(usage_error({"--nnodes=3:2", "x"}), Catch::Contains("--nnodes=3:2"));
  CHECK_THAT(usage_error({"--nnodes=0", "x"}), Catch::Contains("--nnodes=0"));
  CHECK_THAT(usage_error({"--nnodes=a:b", "x"}), Catch::Contains("--nnodes"));
  CHECK_THAT(usage_error({"--nproc_per_node=abc", "x"}), Catch::Contains("--nproc_per_node=abc"));
  CHECK_THAT(usage_error({"--nproc_per_node=0", "x"}), Catch::Contains("--nproc_per_node=0"));
  CHECK_THAT(usage_error({"-m", "--no_python", "x"}), Catch::Contains("cannot be used together"));
  CHECK_THAT(usage_error({}), Catch::Contains("missing entrypoint"));
  CHECK_THAT(usage_error({"--nproc_per_node=2"}), Catch::Contains("missing entrypoint"));
  CHECK_THAT(usage_error({"--"}), Catch::Contains("missing entrypoint"));
  CHECK_THAT(usage_error({"--bogus", "x"}), Catch::Contains("--bogus"));
  CHECK_THAT(usage_error({"-z", "x"}), Catch::Contains("-z"));
  CHECK_THAT(usage_error({"--redirects=4", "x"}), Catch::Contains("--redirects=4"));
  CHECK_THAT(usage_error({"--tee=0:5", "x"}), Catch::Contains("--tee=0:5"));
  CHECK_THAT(usage_error({"--tee=a:1", "x"}), Catch::Contains("--tee"));
  CHECK_THAT(usage_error({"--max_restarts=-1", "x"}), Catch::Contains("--max_restarts=-1"));
  CHECK_THAT(usage_error({"--max_restarts=two", "x"}), Catch::Contains("--max_restarts"));
  CHECK_THAT(usage_error({"--monitor_interval=soon", "x"}), Catch::Contains("--monitor_interval"));
  CHECK_THAT(usage_error({"--shutdown_timeout=-1", "x"}), Catch::Contains("--shutdown_timeout"));
  CHECK_THAT(usage_error({"--hang_timeout=never", "x"}), Catch::Contains("--hang_timeout"));
  CHECK_THAT(usage_error({"--straggler_window=65", "x"}), Catch::Contains("--straggler_window"));
  CHECK_THAT(usage_error({"--start_method=thread", "x"}), Catch::Contains("--start_method"));
  CHECK_THAT(usage_error({"--signals_to_handle=SIGFOO", "x"}), Catch::Contains("SIGFOO"));
  CHECK_THAT(usage_error({"--signals_to_handle=TERM", "x"}), Catch::Contains("TERM"));
  CHECK_THAT(usage_error({"--signals_to_handle=SIGKILL", "x"}), Catch::Contains("SIGKILL"));
  CHECK_THAT(usage_error({"--node_rank=1", "x"}), Catch::Contains("--node_rank=1"));
  CHECK_THAT(usage_error({"--rdzv_conf=novalue", "x"}), Catch::Contains("--rdzv_conf"));
  CHECK_THAT(usage_error({"--rdzv_backend=zookeeper", "x"}), Catch::Contains("zookeeper"));
  CHECK_THAT(usage_error({"--local_ranks_filter=a", "x"}), Catch::Contains("--local_ranks_filter"));
  CHECK_THAT(usage_error({"--master_port=70000", "x"}), Catch::Contains("--master_port"));
  CHECK_THAT(usage_error({"--role=", "x"}), Catch::Contains("--role"));
  CHECK_THAT(usage_error({"--nproc_per_node"}), Catch::Contains("nproc_per_node"));
  Fake fake;
  fake.env = {{"PET_NPROC_PER_NODE", "abc"}};
  CHECK_THAT(usage_error({"x"}, fake), Catch::Contains("PET_NPROC_PER_NODE=abc"));
  fake.env = {{"PET_STANDALONE", "yes"}};  // torchrun: int(value)
  CHECK_THAT(usage_error({"x"}, fake), Catch::Contains("PET_STANDALONE=yes"));
}

TEST_CASE("the static rendezvous's endpoint is the master on one node too, as in torchrun") {
  LaunchConfig one = parse({"--rdzv_backend=static", "--rdzv_endpoint=127.0.0.2:29555", "x"});
  CHECK(one.master_addr == "127.0.0.2");
  CHECK(one.master_port == 29555);
  // Without a port: --master_port, else torchrun's 29500.
  CHECK(parse({"--rdzv_endpoint=127.0.0.1", "--master_port=4000", "x"}).master_port == 4000);
  CHECK(parse({"--rdzv_endpoint=127.0.0.1", "x"}).master_port == 29500);
  // Other backends (and --standalone) keep their endpoint for the rendezvous.
  CHECK(!parse({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29555", "x"}).master_port);
  CHECK(!parse({"--standalone", "--rdzv_endpoint=127.0.0.1:29555", "x"}).master_port);
}

TEST_CASE("multi-node options are parsed and options ddprun lacks are refused as not implemented") {
  LaunchConfig two = parse({"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "x"});
  CHECK(two.min_nodes == 2);
  CHECK(two.max_nodes == 2);
  CHECK(two.node_rank == 1);
  LaunchConfig elastic = parse({"--nnodes=1:4", "--rdzv_backend=c10d",
                                "--rdzv_endpoint=node7.example:29400", "--rdzv_id=job", "x"});
  CHECK(elastic.min_nodes == 1);
  CHECK(elastic.max_nodes == 4);
  CHECK(elastic.rdzv_endpoint == "node7.example:29400");
  CHECK_THAT(usage_error({"--standalone", "--nnodes=2", "x"}), Catch::Contains("--standalone"));
  CHECK_THAT(usage_error({"--nnodes=2", "--node_rank=2", "x"}), Catch::Contains("--node_rank"));
  LaunchConfig etcd = parse(
      {"--nnodes=2:3", "--rdzv_backend=etcd", "--rdzv_endpoint=10.0.0.1:2379,10.0.0.2:2379", "x"});
  CHECK(etcd.rdzv_backend == "etcd");
  CHECK(etcd.rdzv_endpoint == "10.0.0.1:2379,10.0.0.2:2379");
  CHECK(parse({"--rdzv_backend=etcd-v2", "x"}).rdzv_backend == "etcd-v2");
  CHECK_THAT(usage_error({"--rdzv_backend=zookeeper", "x"}), Catch::Contains("etcd-v2"));
  CHECK_THAT(not_implemented({"--logs_specs=my.Specs", "x"}), Catch::Contains("--logs_specs"));
  // A c10d rendezvous with one node is a single-node job.
  CHECK(parse({"--rdzv_backend=c10d", "--rdzv_endpoint=localhost:29400", "x"}).max_nodes == 1);
  CHECK(parse({"--rdzv_backend=c10d", "--rdzv_endpoint=[::1]:29400", "x"}).max_nodes == 1);
}

TEST_CASE("help and version texts") {
  Fake fake;
  ScopedPetEnvironment env(fake.env);
  CliResult help = parse_command_line({"--help"}, fake.context());
  CHECK(help.action == CliResult::Action::kHelp);
  CHECK(parse_command_line({"-h", "x"}, fake.context()).action == CliResult::Action::kHelp);
  CliResult version = parse_command_line({"--version"}, fake.context());
  CHECK(version.action == CliResult::Action::kVersion);
  CHECK_THAT(version.text, Catch::StartsWith("ddprun "));
  std::istringstream lines(help.text);
  std::string line;
  while (std::getline(lines, line)) {
    INFO(line);
    CHECK(line.size() <= 80);
  }
  for (const char* option : {"--nnodes",
                             "--nproc_per_node",
                             "--standalone",
                             "--rdzv_backend",
                             "--rdzv_endpoint",
                             "--rdzv_id",
                             "--rdzv_conf",
                             "--max_restarts",
                             "--monitor_interval",
                             "--role",
                             "--log_dir",
                             "--redirects",
                             "--tee",
                             "--local_ranks_filter",
                             "--node_rank",
                             "--master_addr",
                             "--master_port",
                             "--local_addr",
                             "--module",
                             "--no_python",
                             "--signals_to_handle",
                             "--shutdown_timeout",
                             "--legacy_local_rank",
                             "--store_allow_any",
                             "Nodes and workers:",
                             "Logs:"}) {
    CHECK_THAT(help.text, Catch::Contains(option));
  }
}

TEST_CASE("an empty value after = is an empty value, never the next argument") {
  // argparse: "--opt=" is the empty string; options that cannot be empty say so.
  CHECK(parse({"--log_dir=", "--nproc_per_node=2", "x"}).nproc_per_node == 2);
  CHECK(parse({"--local_addr=", "x"}).local_addr.empty());
  CHECK(parse({"--rdzv_conf=", "x"}).rdzv_conf.empty());
  CHECK_THAT(usage_error({"--role=", "--nproc_per_node=2", "x"}),
             Catch::Contains("--role") && Catch::Contains("cannot be empty"));
  CHECK_THAT(usage_error({"--rdzv_id=", "x"}),
             Catch::Contains("--rdzv_id") && Catch::Contains("cannot be empty"));
  CHECK_THAT(usage_error({"--master_addr=", "x"}), Catch::Contains("cannot be empty"));
  CHECK_THAT(usage_error({"-r=", "x"}), Catch::Contains("-r"));
  // A value that looks like an option is a missing value, as in argparse.
  CHECK_THAT(usage_error({"--role", "--nproc_per_node=2", "x"}),
             Catch::Contains("--role") && Catch::Contains("expected a value"));
  CHECK_THAT(usage_error({"--nproc_per_node"}),
             Catch::Contains("--nproc_per_node: expected a value"));
  CHECK(parse({"--role", "-", "x"}).role == "-");
  CHECK_THAT(usage_error({"--max_restarts", "-1", "x"}), Catch::Contains("--max_restarts=-1"));
  CHECK(parse({"-r=3", "x"}).redirects.for_rank(0) == Std::kAll);
}

TEST_CASE("unambiguous prefixes of long options are accepted, as argparse does") {
  CHECK(parse({"--nproc=3", "x"}).nproc_per_node == 3);
  CHECK(parse({"--nproc-per", "3", "x"}).nproc_per_node == 3);
  CHECK(parse({"--nnode=1", "x"}).max_nodes == 1);
  CHECK(parse({"--max_r=2", "x"}).max_restarts == 2);
  CHECK(parse({"--stand", "x"}).standalone);
  CHECK(parse({"--no_p", "x"}).entrypoint_kind == EntrypointKind::kDirect);
  CHECK(parse_command_line({"--vers"}, Fake{}.context()).action == CliResult::Action::kVersion);
  // Exact names win over longer names they prefix; prefixes stop at the entrypoint.
  CHECK(parse({"--role=a", "x", "--nproc=9"}).entrypoint_args ==
        std::vector<std::string>{"--nproc=9"});
  std::string ambiguous = usage_error({"--n=1", "x"});
  CHECK_THAT(ambiguous, Catch::Contains("ambiguous option: --n could match"));
  CHECK_THAT(ambiguous, Catch::Contains("--nnodes") && Catch::Contains("--nproc_per_node") &&
                            Catch::Contains("--node_rank") && Catch::Contains("--no_python"));
  CHECK_THAT(usage_error({"--rdzv=x", "y"}),
             Catch::Contains("--rdzv_backend") && Catch::Contains("--rdzv_id"));
  CHECK_THAT(usage_error({"--nprocx=2", "x"}), Catch::Contains("unknown option --nprocx=2"));
}

TEST_CASE("unknown options before the entrypoint are errors, after it the worker's") {
  CHECK_THAT(usage_error({"--nproc_per_node=2", "--bogus", "x"}),
             Catch::Contains("unknown option --bogus"));
  CHECK_THAT(usage_error({"--bogus", "--", "x"}), Catch::Contains("unknown option --bogus"));
  CHECK(parse({"x", "--bogus"}).entrypoint_args == std::vector<std::string>{"--bogus"});
  CHECK(parse({"--", "--bogus"}).entrypoint == "--bogus");
  CHECK(parse({"x", "--", "y"}).entrypoint_args == std::vector<std::string>{"--", "y"});
}

TEST_CASE("names that become directories and prefixes are checked") {
  CHECK_THAT(usage_error({"--rdzv_id=../../x", "y"}),
             Catch::Contains("--rdzv_id=../../x") && Catch::Contains("'/'"));
  CHECK_THAT(usage_error({"--rdzv_id=..", "y"}), Catch::Contains("'..'"));
  CHECK_THAT(usage_error({"--rdzv_id=a\nb", "y"}), Catch::Contains("control characters"));
  CHECK_THAT(usage_error({"--role=a\nb", "y"}),
             Catch::Contains("--role") && Catch::Contains("control characters"));
  CHECK(parse({"--rdzv_id=job-7.a_b", "y"}).rdzv_id == "job-7.a_b");
  Fake fake;
  fake.env = {{"PET_RDZV_ID", "a/b"}};
  CHECK_THAT(usage_error({"y"}, fake), Catch::Contains("PET_RDZV_ID=a/b"));
}

TEST_CASE("local_ranks_filter names local ranks that exist") {
  CHECK_THAT(usage_error({"--nproc_per_node=2", "--local_ranks_filter=99", "x"}),
             Catch::Contains("--local_ranks_filter=99") && Catch::Contains("no local rank 99") &&
                 Catch::Contains("0-1"));
  CHECK(parse({"--nproc_per_node=2", "--local_ranks_filter=1", "x"}).local_ranks_filter ==
        std::set<int>{1});
}

TEST_CASE(
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT is the grace period when --shutdown_timeout is not "
    "given, as in torchrun 2.x") {
  CliContext context = Fake{}.context();
  context.getenv = [](const std::string& name) -> std::optional<std::string> {
    if (name == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT") return "5";
    return std::nullopt;
  };
  ScopedPetEnvironment none({});
  CHECK(parse_command_line({"x"}, context).config.shutdown_timeout == std::chrono::seconds(5));
  CHECK(parse_command_line({"--shutdown_timeout=7", "x"}, context).config.shutdown_timeout ==
        std::chrono::seconds(7));
  context.getenv = [](const std::string& name) -> std::optional<std::string> {
    if (name == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT") return "soon";
    return std::nullopt;
  };
  try {
    parse_command_line({"x"}, context);
    FAIL("no error for TORCH_ELASTIC_SHUTDOWN_TIMEOUT=soon");
  } catch (const UsageError& e) {
    CHECK_THAT(e.what(), Catch::Contains("TORCH_ELASTIC_SHUTDOWN_TIMEOUT=soon"));
  }
}

TEST_CASE("torchrun 2.x's logging options: defaults, the template variable, bad values") {
  LaunchConfig c = parse({"x"});
  CHECK(c.log_line_prefix_template.empty());
  CHECK(c.duplicate_stdout_filters.empty());
  CHECK(c.duplicate_stderr_filters.empty());
  CHECK(c.event_log_handler == "null");
  CHECK(c.warm_start == WarmStart::kOff);  // auto: off unless the policy is inplace
  CHECK(c.warm_preload.empty());
  CHECK(parse({"--restart_policy=inplace", "x"}).warm_start == WarmStart::kRestart);
  CHECK(parse({"--restart_policy=inplace", "--warm_start=off", "x"}).warm_start == WarmStart::kOff);
  CHECK(parse({"--warm_preload=transformers,numpy.linalg", "x"}).warm_preload ==
        std::vector<std::string>{"transformers", "numpy.linalg"});
  CHECK_FALSE(c.virtual_local_rank);
  CHECK(c.numa_binding.empty());
  CHECK(parse({"--duplicate_stdout_filters=", "x"}).duplicate_stdout_filters.empty());

  CliContext context = Fake{}.context();
  context.getenv = [](const std::string& name) -> std::optional<std::string> {
    if (name == "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") return "<${rank}> ";
    return std::nullopt;
  };
  ScopedPetEnvironment none({});
  CHECK(parse_command_line({"x"}, context).config.log_line_prefix_template == "<${rank}> ");
  CHECK(parse_command_line({"--log_line_prefix_template=[${rank}]", "x"}, context)
            .config.log_line_prefix_template == "[${rank}]");

  CHECK_THAT(usage_error({"--event_log_handler=kafka", "x"}), Catch::Contains("null, console"));
  CHECK_THAT(usage_error({"--numa_binding=all", "x"}), Catch::Contains("node, socket"));
  CHECK_THAT(usage_error({"--warm_start=yes", "x"}), Catch::Contains("auto, off, restart, always"));
  CHECK_THAT(usage_error({"--warm_preload=transformers,../evil", "x"}),
             Catch::Contains("'../evil' is not a module name"));
  CHECK_THAT(not_implemented({"--logs_specs=custom", "x"}), Catch::Contains("'default'"));
}

TEST_CASE("print_completion prints a completion script of every option, and no job") {
  ScopedPetEnvironment none({});
  for (const std::string shell : {"bash", "zsh", "tcsh"}) {
    INFO(shell);
    CliResult result = parse_command_line({"--print_completion", shell}, Fake{}.context());
    CHECK(result.action == CliResult::Action::kHelp);
    CHECK_THAT(result.text, Catch::Contains("ddprun"));
    CHECK_THAT(result.text, Catch::Contains("nproc-per-node"));
    CHECK_THAT(result.text, Catch::Contains("numa_binding"));
  }
  CHECK_THAT(usage_error({"--print-completion", "fish"}), Catch::Contains("bash, zsh or tcsh"));
}
