// WorkerTemplate over a fake template (python/fake_template.py, plain Python): every answer, and
// every way of not answering, reaches the loop as a handler; the loop goes on meanwhile.

#include "process/worker_template.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <catch2/catch.hpp>
#include <filesystem>
#include <optional>
#include <string>

#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::launcher;
using namespace ddp::test;
using namespace std::chrono_literals;

namespace {

WorkerTemplateOptions fake(const std::string& mode) {
  WorkerTemplateOptions options;
  options.program = torch_python();
  options.argv = {torch_python(),
                  source_path("tests/launcher/process/python/fake_template.py").string(), mode};
  options.env = {"PATH=/usr/bin:/bin"};
  return options;
}

// Runs the loop until `done` or 20 s.
void run_until(boost::asio::io_context& io, const bool& done) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!done && std::chrono::steady_clock::now() < deadline) io.run_one_for(100ms);
}

}  // namespace

TEST_CASE("a template that answers: prepared on the loop, its count kept, and a spawn refused") {
  if (!std::filesystem::exists(torch_python())) return skip(torch_python() + " is missing");
  boost::asio::io_context io;
  WorkerTemplate t(io, fake("answer"));
  t.prepare({"/nonexistent/modules.txt"}, {}, {}, {});
  CHECK(t.preparing());
  bool ready = false;
  t.when_prepared(10s, [&] { ready = true; });
  CHECK_FALSE(ready);  // never inside the call
  run_until(io, ready);
  REQUIRE(ready);
  CHECK(t.reason().empty());
  CHECK(t.imported() == 5);
  CHECK(t.import_seconds() == Approx(0.25));
  std::optional<WorkerTemplate::Forked> forked;
  bool spawned = false;
  SpawnOptions spawn;
  spawn.argv = {"python", "job.py"};
  t.spawn(spawn, "/", 10s, false, [&](WorkerTemplate::Forked result) {
    forked = std::move(result);
    spawned = true;
  });
  run_until(io, spawned);
  REQUIRE(forked);
  REQUIRE(std::holds_alternative<std::string>(*forked));
  CHECK(std::get<std::string>(*forked) == "the fake forks nothing");
}

TEST_CASE("a template whose imports make it unusable: refused, with its problem") {
  if (!std::filesystem::exists(torch_python())) return skip(torch_python() + " is missing");
  boost::asio::io_context io;
  WorkerTemplate t(io, fake("refuse"));
  t.prepare({}, {}, {}, {});
  bool ready = false;
  t.when_prepared(10s, [&] { ready = true; });
  run_until(io, ready);
  REQUIRE(ready);
  CHECK(t.refused());
  CHECK(t.reason() == "an import started a thread");
}

TEST_CASE("a template that never answers: the wait ends at its limit, the loop went on") {
  if (!std::filesystem::exists(torch_python())) return skip(torch_python() + " is missing");
  boost::asio::io_context io;
  WorkerTemplate t(io, fake("silent"));
  t.prepare({}, {}, {}, {});
  bool ready = false;
  bool ticked = false;
  t.when_prepared(1500ms, [&] {
    CHECK(ticked);  // the loop ran other handlers while it waited
    ready = true;
  });
  boost::asio::steady_timer tick(io, 100ms);
  tick.async_wait([&](auto) { ticked = true; });
  run_until(io, ready);
  REQUIRE(ready);
  CHECK(t.reason() == "the warm template was still importing after 1 s");
  CHECK_FALSE(t.refused());
}

TEST_CASE("a template that answers garbage, or exits, is gone with the reason") {
  if (!std::filesystem::exists(torch_python())) return skip(torch_python() + " is missing");
  for (const std::string mode : {"garbage", "exit"}) {
    INFO("mode " << mode);
    boost::asio::io_context io;
    WorkerTemplate t(io, fake(mode));
    t.prepare({}, {}, {}, {});
    bool ready = false;
    t.when_prepared(10s, [&] { ready = true; });
    run_until(io, ready);
    REQUIRE(ready);
    CHECK_THAT(t.reason(), Catch::Contains(mode == "garbage" ? "answered garbage" : "exited"));
  }
}

TEST_CASE("abandon: the template is killed and the waiting handler runs next on the loop") {
  if (!std::filesystem::exists(torch_python())) return skip(torch_python() + " is missing");
  boost::asio::io_context io;
  WorkerTemplate t(io, fake("silent"));
  t.prepare({}, {}, {}, {});
  bool ready = false;
  t.when_prepared(30s, [&] { ready = true; });
  CHECK(t.waiting());
  t.abandon("ddprun got SIGTERM");
  CHECK_FALSE(ready);  // not inside abandon
  run_until(io, ready);
  REQUIRE(ready);
  CHECK(t.reason() == "ddprun got SIGTERM");
  CHECK(t.pid() == 0);  // killed and reaped
}

TEST_CASE("a template dropped while a handler waits never calls it") {
  if (!std::filesystem::exists(torch_python())) return skip(torch_python() + " is missing");
  boost::asio::io_context io;
  bool called = false;
  {
    WorkerTemplate t(io, fake("answer"));
    t.prepare({}, {}, {}, {});
    t.when_prepared(10s, [&] { called = true; });
  }
  io.run_for(300ms);
  CHECK_FALSE(called);
}
