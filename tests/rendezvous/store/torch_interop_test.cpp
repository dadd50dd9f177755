// Interop with the real peer, the PyTorch of DDP_TEST_PYTHON (Debian's python3-torch 1.13 by
// default, or a 2.x): its TCPStore client against our server, our client in its dialect
// against its server, and a Gloo job through our store. Each case checks what the version
// it finds does: 1.x speaks the 1.x dialect to a server on one blocking thread; 2.x speaks
// the 2.x dialect (VALIDATE first) to its libuv server, and its Gloo meets with other keys.

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
  if (ddp::test::torch_available() && ddp::test::torch_version()) return false;
  ddp::test::skip(ddp::test::torch_python() + " cannot import torch.distributed with Gloo");
  return true;
}

// True for PyTorch 2.x and later (the 2.x store dialect); false for 1.x.
bool torch_2x() { return ddp::test::torch_version()->major >= 2; }

// The keys a two-rank Gloo job (gloo_rank.py: TCPStore client, PrefixStore
// "/worker/attempt_0", init_process_group with that store) leaves in the store. The TCPStore
// client puts "/" before every key but its init/ counter, and each PrefixStore joins with "/".
std::vector<std::string> gloo_job_keys() {
  const std::string job = "//worker/attempt_0/";
  if (!torch_2x()) {
    // 1.13 (seen on the wire): group "0", Gloo's PrefixStore "0" per device; every rank SETs
    // rank_<r> (its hostname) and <r> (its address); rank 0 SETs the sequence number; the
    // store-based barrier after init ADDs to its key.
    return {"init/",
            job + "0/0/rank_0",
            job + "0/0/rank_1",
            job + "0/0/0",
            job + "0/0/1",
            job + "0/SEQ_NUM_STORE_KEY",
            job + "store_based_barrier_key:1"};
  }
  // 2.x (torch/distributed/distributed_c10d.py, ProcessGroupGloo.cpp, gloo's
  // transport/tcp/context.cc): PrefixStore "0/" for the group, then "cpu/" for the device
  // (one Gloo backend serves cpu and cuda), then Gloo's "0"; each rank SETs only <r>, one
  // blob with its hostname and address. No sequence-number key (Gloo starts at 0) and no
  // barrier after init (TORCH_DIST_INIT_BARRIER defaults to 0).
  return {"init/", job + "0//cpu//0/0", job + "0//cpu//0/1"};
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
    options.dialect = torch_2x() ? Dialect::V2 : Dialect::V1;
    options.timeout = 20s;
    return options;
  }

 private:
  ChildProcess python_;
  std::uint16_t port_ = 0;
};

}  // namespace

TEST_CASE("PyTorch's TCPStore client against our server: every operation it has",
          "[torch][sanitize]") {
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

TEST_CASE("a two-rank PyTorch Gloo job meets through our server", "[torch]") {
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
  const std::vector<std::string> keys = gloo_job_keys();
  for (const std::string& key : keys) {
    CAPTURE(key);
    CHECK(client.check({key}));
  }
  CHECK(client.num_keys() == static_cast<std::int64_t>(keys.size()));
  CHECK(client.get("init/") == "2");  // both ranks' clients counted themselves
}

TEST_CASE("our client in PyTorch's dialect against PyTorch's own TCPStore server", "[torch]") {
  if (skip_without_torch()) return;
  TorchServer torch_server;
  const ClientOptions options = torch_server.client_options();  // 1.x or 2.x dialect
  Client client(options);
  CHECK(client.dialect() == options.dialect);

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
  // After a timed-out wait, 1.x: the client reconnects on its next call; 2.x: CANCEL_WAIT
  // and the connection goes on.
  CHECK(client.num_keys() == 3);
  CHECK(client.delete_key("c"));
  CHECK_FALSE(client.delete_key("c"));
  client.multi_set({"m1", "m2"}, {"a", "b"});
  CHECK(client.multi_get({"m1", "m2"}) == std::vector<std::string>{"a", "b"});
  client.append("log", "ab");
  client.append("log", "cd");
  CHECK(client.get("log") == "abcd");
  CHECK(client.ping() > 0ns);  // 2.x: PING; 1.x: GETNUMKEYS
  // 1.x answers the 1.x GETNUMKEYS probe; 2.x ignores a first command other than VALIDATE.
  CHECK(detect_dialect("127.0.0.1", options.port) == options.dialect);
}

TEST_CASE("ADD on every stored form answers as PyTorch's own server does", "[torch]") {
  if (skip_without_torch()) return;
  TorchServer torch_server;
  const ClientOptions options = torch_server.client_options();
  for (const auto& form : ddp::test::add_forms()) {
    CAPTURE(form.stored);
    // A fresh connection: PyTorch's server (1.x, and 2.x's libuv one alike) parses the value
    // with std::stoll and closes the connection when it throws.
    Client client(options);
    client.set("n", form.stored);
    if (form.after) {
      CHECK(client.add("n", 1) == *form.after);
    } else {
      CHECK_THROWS_AS(client.add("n", 1), StoreError);
    }
  }
}
