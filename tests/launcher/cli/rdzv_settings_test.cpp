// --rdzv_conf and the rendezvous options to the engine's settings, in-process.
#include "ddp/launcher/rdzv_settings.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>

#include "ddp/launcher/cli.hpp"

using namespace ddp::launcher;
using namespace std::chrono_literals;

namespace {

std::string usage_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  FAIL("expected a UsageError");
  return "";
}

LaunchConfig nodes(int min, int max, std::string backend) {
  LaunchConfig config;
  config.min_nodes = min;
  config.max_nodes = max;
  config.rdzv_backend = std::move(backend);
  config.rdzv_id = "job";
  config.nproc_per_node = 2;
  return config;
}

}  // namespace

TEST_CASE("rdzv_conf keys become the rendezvous timeouts") {
  RdzvConf conf = parse_rdzv_conf({{"join_timeout", "90"},
                                   {"last_call_timeout", "2.5"},
                                   {"close_timeout", "7"},
                                   {"keep_alive_interval", "1"},
                                   {"keep_alive_max_attempt", "4"},
                                   {"read_timeout", "11"},
                                   {"is_host", "true"}});
  CHECK(conf.timeouts.join == 90s);
  CHECK(conf.timeouts.last_call == 2500ms);
  CHECK(conf.timeouts.close == 7s);
  CHECK(conf.timeouts.keep_alive == 1s);
  CHECK(conf.timeouts.keep_alive_max_attempt == 4);
  CHECK(conf.timeouts.read == 11s);
  CHECK(conf.is_host == true);
  CHECK(conf.unknown_keys.empty());

  RdzvConf defaults = parse_rdzv_conf({});
  CHECK(defaults.timeouts.join == 600s);
  CHECK(defaults.timeouts.last_call == 30s);
  CHECK_FALSE(defaults.is_host);
  CHECK(parse_rdzv_conf({{"timeout", "42"}}).timeouts.join == 42s);
  CHECK(parse_rdzv_conf({{"timeout", "42"}, {"join_timeout", "5"}}).timeouts.join == 5s);
  CHECK(parse_rdzv_conf({{"is_host", "0"}}).is_host == false);
}

TEST_CASE(
    "an unknown --rdzv_conf key is kept for a warning that names it and a bad value is an error") {
  RdzvConf conf = parse_rdzv_conf({{"jion_timeout", "5"}});
  REQUIRE(conf.unknown_keys == std::vector<std::string>{"jion_timeout"});
  CHECK_THAT(unknown_rdzv_conf_warning("jion_timeout"), Catch::Contains("jion_timeout"));
  CHECK_THAT(usage_error([] {
               parse_rdzv_conf({{"join_timeout", "soon"}});
             }),
             Catch::Contains("join_timeout=soon"));
  CHECK_THAT(usage_error([] {
               parse_rdzv_conf({{"keep_alive_max_attempt", "0"}});
             }),
             Catch::Contains("keep_alive_max_attempt=0"));
  CHECK_THAT(usage_error([] {
               parse_rdzv_conf({{"is_host", "maybe"}});
             }),
             Catch::Contains("is_host=maybe"));
}

TEST_CASE("host and port of an endpoint") {
  auto a = parse_host_port("--rdzv_endpoint", "node1:1234", 29400);
  CHECK(a.host == "node1");
  CHECK(a.port == 1234);
  CHECK(parse_host_port("--rdzv_endpoint", "node1", 29400).port == 29400);
  auto v6 = parse_host_port("--rdzv_endpoint", "[fe80::1]:99", 29400);
  CHECK(v6.host == "fe80::1");
  CHECK(v6.port == 99);
  CHECK(parse_host_port("--rdzv_endpoint", "fe80::1", 29400).host == "fe80::1");
  CHECK_THAT(usage_error([] { parse_host_port("--rdzv_endpoint", "n:http", 1); }),
             Catch::Contains("--rdzv_endpoint=n:http"));
}

TEST_CASE("static: the store at --master_addr:--master_port, a fixed group of --nnodes") {
  LaunchConfig config = nodes(3, 3, "static");
  config.master_addr = "10.0.0.1";
  config.node_rank = 2;
  ddp::elastic::NodeInfo self;
  self.node_id = "n";
  auto s = rendezvous_settings(config, parse_rdzv_conf({}), self);
  CHECK(s.backend == "static");
  CHECK(s.run_id == "job");
  CHECK(s.store_host == "10.0.0.1");
  CHECK(s.store_port == kDefaultMasterPort);
  CHECK(s.min_nodes == 3);
  CHECK(s.max_nodes == 3);
  CHECK(s.self.fixed_group_rank == 2);
  CHECK(s.self.node_id == "n");
  config.master_port = 31000;
  CHECK(rendezvous_settings(config, {}, self).store_port == 31000);
  config.rdzv_endpoint = "10.0.0.9:32000";
  CHECK(rendezvous_settings(config, {}, self).store_host == "10.0.0.9");
  CHECK(rendezvous_settings(config, {}, self).store_port == 32000);
  CHECK_THAT(usage_error([] { rendezvous_settings(nodes(1, 3, "static"), {}, {}); }),
             Catch::Contains("c10d"));

  auto is_local = [](const std::string&) { return false; };
  config.node_rank = 0;
  CHECK(hosts_rendezvous_store(config, {}, s, is_local));
  config.node_rank = 1;
  CHECK_FALSE(hosts_rendezvous_store(config, {}, s, is_local));
}

TEST_CASE(
    "c10d: the store at --rdzv_endpoint (port 29400), MIN:MAX, hosted by the endpoint's host") {
  LaunchConfig config = nodes(2, 4, "c10d");
  config.rdzv_endpoint = "node7";
  auto s = rendezvous_settings(config, {}, {});
  CHECK(s.store_host == "node7");
  CHECK(s.store_port == kDefaultC10dPort);
  CHECK(s.min_nodes == 2);
  CHECK(s.max_nodes == 4);
  CHECK_FALSE(s.self.fixed_group_rank);

  auto is_node7 = [](const std::string& host) { return host == "node7"; };
  auto elsewhere = [](const std::string&) { return false; };
  CHECK(hosts_rendezvous_store(config, {}, s, is_node7));
  CHECK_FALSE(hosts_rendezvous_store(config, {}, s, elsewhere));
  RdzvConf host;
  host.is_host = true;
  CHECK(hosts_rendezvous_store(config, host, s, elsewhere));
  host.is_host = false;
  CHECK_FALSE(hosts_rendezvous_store(config, host, s, is_node7));

  CHECK_THAT(usage_error([] { rendezvous_settings(nodes(2, 2, "c10d"), {}, {}); }),
             Catch::Contains("--rdzv_endpoint"));
  LaunchConfig zero = nodes(2, 2, "c10d");
  zero.rdzv_endpoint = "localhost:0";
  CHECK_THAT(usage_error([&] { rendezvous_settings(zero, {}, {}); }), Catch::Contains("port"));
}

TEST_CASE("etcd: the members at --rdzv_endpoint (port 2379), TLS and auth from --rdzv_conf") {
  LaunchConfig config = nodes(2, 3, "etcd");
  config.rdzv_endpoint = "e1,e2:12379,[::1]:2381";
  auto s = rendezvous_settings(config, {}, {});
  CHECK(s.etcd.endpoints == "e1:2379,e2:12379,[::1]:2381");
  CHECK(s.store_host == "e1");  // the route to the first member finds this node's address
  CHECK(s.store_port == kDefaultEtcdPort);
  CHECK_FALSE(s.etcd.tls);
  CHECK_FALSE(hosts_rendezvous_store(config, {}, s, [](const std::string&) { return true; }));

  // PEM files must exist; giving certificates means https.
  char dir[] = "/tmp/ddp_rdzv_conf_XXXXXX";
  REQUIRE(::mkdtemp(dir));
  const std::string pem = std::string(dir) + "/ca.pem";
  std::FILE* file = std::fopen(pem.c_str(), "w");
  REQUIRE(file);
  std::fclose(file);
  RdzvConf conf = parse_rdzv_conf({{"cacert", pem}, {"user", "ddp"}, {"password", "pw"}});
  auto tls = rendezvous_settings(config, conf, {});
  CHECK(tls.etcd.tls);
  CHECK(tls.etcd.cacert == pem);
  CHECK(tls.etcd.user == "ddp");
  CHECK(tls.etcd.password == "pw");
  CHECK(parse_rdzv_conf({{"protocol", "https"}}).etcd.tls);
  CHECK_THAT(usage_error([] {
               parse_rdzv_conf({{"protocol", "ftp"}});
             }),
             Catch::Contains("protocol=ftp"));
  CHECK_THAT(usage_error([] {
               parse_rdzv_conf({{"cacert", "/nonexistent/ca.pem"}});
             }),
             Catch::Contains("cacert=/nonexistent/ca.pem") && Catch::Contains("PEM"));
  RdzvConf half = parse_rdzv_conf({{"cert", pem}});
  CHECK_THAT(usage_error([&] { rendezvous_settings(config, half, {}); }),
             Catch::Contains("cert and key"));
  std::filesystem::remove_all(dir);

  CHECK_THAT(usage_error([] { rendezvous_settings(nodes(2, 2, "etcd-v2"), {}, {}); }),
             Catch::Contains("--rdzv_endpoint"));
}

TEST_CASE("this machine's names and addresses are local and another host's are not") {
  CHECK(is_local_host("localhost"));
  CHECK(is_local_host("127.0.0.1"));
  CHECK(is_local_host("0.0.0.0"));
  char name[256] = {};
  REQUIRE(::gethostname(name, sizeof name - 1) == 0);
  CHECK(is_local_host(name));
  CHECK_FALSE(is_local_host("192.0.2.1"));  // TEST-NET-1: never assigned to a machine
}
