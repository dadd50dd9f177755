// Interop with the real peer, PyTorch 1.13 (Debian's python3-torch): its TCPStore client
// against our server, our 1.x client against its server, and a Gloo job through our store.

#include <catch2/catch.hpp>

#include "add_forms.hpp"
#include "ddp/store/client.hpp"
#include "process_harness.hpp"
#include "skip.hpp"
#include "store_fixture.hpp"
#include "test_support.hpp"

using namespace ddp::store;
using namespace std::chrono_literals;
using ddp::test::ChildProcess;
using ddp::test::TestServer;

namespace {

std::string script(const std::string& name) {
  return ddp::test::source_path("tests/rendezvous/store/torch/" + name).string();
}

bool skip_without_torch() {
  if (ddp::test::torch_available()) return false;
  ddp::test::skip(ddp::test::torch_python() + " cannot import torch.distributed with Gloo");
  return true;
}

// PyTorch's own TCPStore server (store_server.py), and how our client reaches it.
class TorchServer {
 public:
  TorchServer() : python_({ddp::test::torch_python(), script("store_server.py")}) {
    const std::string port_line = python_.next_stdout_line();  // the port it listens on
    REQUIRE_FALSE(port_line.empty());
    port_ = static_cast<std::uint16_t>(std::stoi(port_line));
  }

  ClientOptions client_options() const {
    ClientOptions options;
    options.port = port_;
    options.dialect = Dialect::V1;
    options.timeout = 20s;
    return options;
  }

 private:
  ChildProcess python_;
  std::uint16_t port_ = 0;
};

}  // namespace

TEST_CASE("PyTorch 1.13 TCPStore client against our server: every operation it has") {
  if (skip_without_torch()) return;
  TestServer server;
  ChildProcess python(
      {ddp::test::torch_python(), script("store_client.py"), std::to_string(server.port())});
  CHECK(python.next_stdout_line() == "OK");
  CHECK(python.wait().status == 0);
  CHECK(server.stats().rejected == 0);
  // The Python client puts "/" before user keys, not before its init/ counter.
  Client client(server.client_options());
  CHECK(client.get("/counter") == "3");
  CHECK(client.get("init/") == "2");  // both clients counted themselves
}

TEST_CASE("a two-rank PyTorch Gloo job meets through our server") {
  if (skip_without_torch()) return;
  TestServer server;
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{ddp::test::torch_python(), script("gloo_rank.py"),
                                 std::to_string(server.port()), std::to_string(rank), "2"}));
  }
  for (auto& rank : ranks) {
    CHECK(rank->next_stdout_line() == "sum 3");
    CHECK(rank->wait().status == 0);
  }
  CHECK(server.stats().rejected == 0);
  Client client(server.client_options());
  CHECK(client.num_keys() >= 5);  // init/, the ranks' addresses and the barrier keys
}

TEST_CASE("our 1.x client against PyTorch 1.13's TCPStore server") {
  if (skip_without_torch()) return;
  TorchServer torch_server;
  const ClientOptions options = torch_server.client_options();
  Client client(options);

  client.set("k", std::string("\0v", 2));
  CHECK(client.get("k") == std::string("\0v", 2));
  CHECK(client.add("n", 3) == 3);
  CHECK(client.add("n", 4) == 7);
  CHECK(client.get("n") == "7");
  CHECK(client.compare_set("c", "", "one") == "one");
  CHECK(client.compare_set("absent", "x", "y") == "x");
  CHECK(client.compare_set("c", "one", "two") == "two");
  CHECK(client.compare_set("c", "bad", "three") == "two");
  CHECK(client.check({"k", "n"}));
  CHECK_FALSE(client.check({"k", "absent"}));
  client.wait({"k", "c"}, 5s);
  CHECK_THROWS_AS(client.wait({"never"}, 100ms), StoreTimeout);
  // After a timed-out 1.x wait the client reconnects on its next call.
  CHECK(client.num_keys() == 3);
  CHECK(client.delete_key("c"));
  CHECK_FALSE(client.delete_key("c"));
  client.multi_set({"m1", "m2"}, {"a", "b"});
  CHECK(client.multi_get({"m1", "m2"}) == std::vector<std::string>{"a", "b"});
  client.append("log", "ab");
  client.append("log", "cd");
  CHECK(client.get("log") == "abcd");
  CHECK(client.ping() > 0ns);
  CHECK(detect_dialect("127.0.0.1", options.port) == Dialect::V1);
}

TEST_CASE("ADD on every stored form answers as PyTorch 1.13's own server does") {
  if (skip_without_torch()) return;
  TorchServer torch_server;
  const ClientOptions options = torch_server.client_options();
  for (const auto& form : ddp::test::add_forms()) {
    CAPTURE(form.stored);
    Client client(options);  // a fresh connection: PyTorch's server closes it when stoll throws
    client.set("n", form.stored);
    if (form.after) {
      CHECK(client.add("n", 1) == *form.after);
    } else {
      CHECK_THROWS_AS(client.add("n", 1), StoreError);
    }
  }
}
