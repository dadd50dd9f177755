// The agent's store in-process: where it listens, and where its log lines go.
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <thread>

#include "ddp/launcher/agent_store.hpp"
#include "raw_socket.hpp"

using ddp::launcher::LaunchConfig;
using ddp::launcher::store_bind_host;

namespace {

LaunchConfig one_node(std::string master_addr, std::string local_addr = {}) {
  LaunchConfig config;
  config.master_addr = std::move(master_addr);
  config.local_addr = std::move(local_addr);
  return config;
}

}  // namespace

TEST_CASE("a one-node job's store listens on loopback unless another address is named") {
  CHECK(store_bind_host(one_node("127.0.0.1")) == "127.0.0.1");
  CHECK(store_bind_host(one_node("")) == "127.0.0.1");
  CHECK(store_bind_host(one_node("localhost")) == "127.0.0.1");
  CHECK(store_bind_host(one_node("127.0.0.2")) == "127.0.0.2");
  CHECK(store_bind_host(one_node("::1")) == "::1");
  CHECK(store_bind_host(one_node("10.1.2.3")) == "0.0.0.0");
  CHECK(store_bind_host(one_node("node07.cluster")) == "0.0.0.0");
  // --local_addr names MASTER_ADDR when given.
  CHECK(store_bind_host(one_node("127.0.0.1", "10.1.2.3")) == "0.0.0.0");
  CHECK(store_bind_host(one_node("10.1.2.3", "127.0.0.1")) == "127.0.0.1");
}

TEST_CASE("a multi-node job's store listens on every interface") {
  LaunchConfig config = one_node("127.0.0.1");
  config.min_nodes = 1;
  config.max_nodes = 2;
  CHECK(store_bind_host(config) == "0.0.0.0");
  config.min_nodes = config.max_nodes = 3;
  CHECK(store_bind_host(config) == "0.0.0.0");
}

TEST_CASE("the agent's store writes its log lines through the logger it is given") {
  boost::asio::io_context io(1);
  std::mutex mutex;
  std::vector<std::string> lines;
  auto factory = ddp::launcher::agent_store_factory([&](std::string_view line) {
    std::lock_guard lock(mutex);
    lines.emplace_back(line);
  });
  auto host = factory(io, one_node("127.0.0.1"));
  const auto endpoint = host->endpoint();
  CHECK(endpoint.agent_store);
  std::thread loop([&] { io.run(); });
  {
    ddp::test::RawSocket bad(static_cast<std::uint16_t>(endpoint.port));
    bad.send(std::string("\xff", 1));  // no such command in the 1.x dialect
    CHECK(bad.closed_by_peer());
  }
  boost::asio::post(io, [&] {
    host.reset();
    io.stop();
  });
  loop.join();
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Catch::Contains("unknown command byte"));
}
