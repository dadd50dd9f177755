// torchelastic error files (both forms PyTorch writes), the failure report, and what ddprun
// writes to its own TORCHELASTIC_ERROR_FILE.
#include "ddp/launcher/failure_report.hpp"

#include <catch2/catch.hpp>
#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "output/outer_error_file.hpp"
#include "test_support.hpp"

using namespace ddp::launcher;

TEST_CASE("read_error_file reads @record's format") {
  ddp::test::TempDir dir;
  auto path = (dir.path() / "error.json").string();
  CHECK_FALSE(read_error_file(path).has_value());

  std::ofstream(path) << R"({"message": {"message": "ValueError: bad", "extraInfo": )"
                         R"({"py_callstack": "Traceback (most recent call last):\n  x\n", )"
                         R"("timestamp": "1700000000"}}})";
  auto full = read_error_file(path);
  REQUIRE(full);
  CHECK(full->message == "ValueError: bad");
  CHECK(full->traceback == "Traceback (most recent call last):\n  x\n");

  std::ofstream(path) << R"({"message": "Signal 9 received", "timestamp": 1700000000})";
  auto short_form = read_error_file(path);
  REQUIRE(short_form);
  CHECK(short_form->message == "Signal 9 received");
  CHECK(short_form->traceback.empty());

  std::ofstream(path) << "not json at all";
  CHECK(read_error_file(path)->message == "not json at all");
}

TEST_CASE("the report shows the other failures and then the root cause") {
  WorkerFailure root;
  root.time = std::chrono::system_clock::now();
  root.host = "node1";
  root.rank = 3;
  root.local_rank = 1;
  root.pid = 4242;
  root.exit_code = 7;
  root.error_file = "/logs/error.json";
  root.error = ErrorFileContent{"ValueError: bad", "Traceback:\n  line 1\n"};
  WorkerFailure other = root;
  other.rank = 2;
  other.local_rank = 0;
  other.exit_code = 0;
  other.signal = SIGSEGV;
  other.error.reset();

  CHECK(root.status() == 7);
  CHECK(other.status() == 128 + SIGSEGV);
  CHECK(other.describe_exit() == "signal SIGSEGV (11)");

  std::string report = format_failure_report("train.py", root, {other});
  CHECK_THAT(report, Catch::Contains("train.py FAILED"));
  auto others_at = report.find("\nFailures:\n");
  auto root_at = report.find("Root Cause (first observed failure):\n");
  REQUIRE(others_at != std::string::npos);
  REQUIRE(root_at != std::string::npos);
  CHECK(others_at < root_at);  // torchrun's order: the others first, the root cause last
  std::string root_part = report.substr(root_at);
  CHECK_THAT(root_part, Catch::Contains("host      : node1"));
  CHECK_THAT(root_part, Catch::Contains("rank      : 3 (local_rank: 1)"));
  CHECK_THAT(root_part, Catch::Contains("exitcode  : 7 (pid: 4242)\n"));
  CHECK_THAT(root_part, Catch::Contains("error_file: /logs/error.json"));
  CHECK_THAT(root_part, Catch::Contains("traceback : Traceback:\n    line 1\n"));
  CHECK_THAT(root_part, Catch::Contains("exit      : exit code 7"));
  CHECK_THAT(root_part, Catch::Contains("message   : ValueError: bad"));
  std::string other_part = report.substr(others_at, root_at - others_at);
  CHECK_THAT(other_part, Catch::Contains("rank      : 2 (local_rank: 0)"));
  CHECK_THAT(other_part, Catch::Contains("exitcode  : -11 (pid: 4242)  (SIGSEGV)\n"));
  CHECK_THAT(other_part, Catch::Contains("error_file: <N/A>"));
  CHECK_THAT(other_part, Catch::Contains("traceback : Signal 11 (SIGSEGV) received by PID 4242"));
  CHECK_THAT(other_part, Catch::Contains("signal SIGSEGV (11)"));
  CHECK_THAT(format_failure_report("x", root, {}),
             Catch::Contains("Failures:\n  <NO_OTHER_FAILURES>\n"));
}

TEST_CASE("the report is torchrun 2.x's layout, line for line, with ddprun's fields last") {
  WorkerFailure root;
  root.time = std::chrono::system_clock::from_time_t(1700000000);
  root.host = "node1";
  root.rank = 1;
  root.local_rank = 1;
  root.pid = 77;
  root.exit_code = 1;
  WorkerFailure other = root;
  other.rank = 0;
  other.local_rank = 0;
  other.pid = 76;
  other.exit_code = 0;
  other.signal = SIGKILL;
  std::string report = format_failure_report("train.py", root, {other});
  std::vector<std::string> lines;
  std::istringstream in(report);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  // The time is local: only its form is checked.
  REQUIRE(lines.size() == 23);
  const std::string rule(60, '=');  // as wide as the widest line, at most 60 (torchrun)
  const std::vector<std::string> expected = {
      rule,
      "train.py FAILED",
      std::string(60, '-'),
      "Failures:",
      "[1]:",
      "",  // time
      "  host      : node1",
      "  rank      : 0 (local_rank: 0)",
      "  exitcode  : -9 (pid: 76)  (SIGKILL)",  // torchrun 2.x names the signal
      "  error_file: <N/A>",
      "  traceback : Signal 9 (SIGKILL) received by PID 76",
      "  exit      : signal SIGKILL (9)",
      std::string(60, '-'),
      "Root Cause (first observed failure):",
      "[0]:",
      "",  // time
      "  host      : node1",
      "  rank      : 1 (local_rank: 1)",
      "  exitcode  : 1 (pid: 77)",
      "  error_file: <N/A>",
      "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
      "  exit      : exit code 1",
      rule,
  };
  for (std::size_t i = 0; i < expected.size() && i < lines.size(); ++i) {
    INFO("line " << i);
    if (expected[i].empty()) {
      CHECK(std::regex_match(
          lines[i], std::regex("  time      : \\d{4}-\\d\\d-\\d\\d_\\d\\d:\\d\\d:\\d\\d")));
    } else {
      CHECK(lines[i] == expected[i]);
    }
  }
}

TEST_CASE("error files that are garbled or empty or huge or unreadable never break the report") {
  ddp::test::TempDir dir;
  auto path = (dir.path() / "error.json").string();
  const char* garbled[] = {
      "",  // a worker killed while it wrote the file
      "{\"message\": null}",
      "{\"message\": {\"message\": 7, \"extraInfo\": {\"py_callstack\": [1, 2]}}}",
      "{\"message\": {\"extraInfo\": \"x\"}}",
      "[\"message\"]",
      "{\"message\": \"\\u00e9t\\u00e9\", \"timestamp\": \"later\"}",
      "\xff\xfe{\"message\": \"bad bytes\"}",
      "{\"message\": {\"message\": \"half",
  };
  for (const char* text : garbled) {
    INFO("error file: " << text);
    std::ofstream(path, std::ios::trunc) << text;
    std::optional<ErrorFileContent> content;
    REQUIRE_NOTHROW(content = read_error_file(path));
    REQUIRE(content);
    WorkerFailure failure;
    failure.exit_code = 1;
    failure.error_file = path;
    failure.error = content;
    std::string report;
    REQUIRE_NOTHROW(report = format_failure_report("w", failure, {}));
    CHECK_THAT(report, Catch::Contains("message   : "));
  }
  std::ofstream(path, std::ios::trunc) << "";
  CHECK_THAT(read_error_file(path)->message, Catch::Contains("empty"));

  // A worker that wrote a gigabyte there: the report shows the start, not all of it.
  {
    std::ofstream big(path, std::ios::trunc);
    std::string chunk(1 << 20, 'x');
    for (int i = 0; i < 64; ++i) big << chunk;
  }
  auto big = read_error_file(path);
  REQUIRE(big);
  CHECK(big->message.size() < (2u << 20));
  CHECK(big->message.find("truncated") != std::string::npos);  // (no 64 MiB in the log)

  // A directory where the file should be.
  auto as_dir = dir.path() / "dir.json";
  std::filesystem::create_directory(as_dir);
  std::optional<ErrorFileContent> from_dir;
  REQUIRE_NOTHROW(from_dir = read_error_file(as_dir.string()));
  CHECK_FALSE(from_dir.has_value());
}

TEST_CASE("the SIGKILL after --shutdown_timeout names the workers that did not stop") {
  CHECK(kill_notice(std::chrono::milliseconds(1500), SIGTERM, {{1, 1, 4242}, {3, 3, 4244}}) ==
        "ddprun: 2 workers did not stop within --shutdown_timeout=1.5s after SIGTERM: sending "
        "SIGKILL to rank 1 (local_rank 1, pid 4242), rank 3 (local_rank 3, pid 4244)");
  CHECK_THAT(kill_notice(std::chrono::seconds(30), SIGINT, {{0, 0, 7}}),
             Catch::StartsWith(
                 "ddprun: 1 worker did not stop within --shutdown_timeout=30s after SIGINT"));
}

TEST_CASE("the root cause is [0] and the other failures follow it in rank order") {
  WorkerFailure root;
  root.rank = 2;
  root.exit_code = 3;
  std::vector<WorkerFailure> others(3, root);
  others[0].rank = 3;
  others[1].rank = 0;
  others[2].rank = 1;
  const std::string report = format_failure_report("train.py", root, others);
  const auto at = [&](const std::string& text) { return report.find(text); };
  REQUIRE(at("Root Cause") != std::string::npos);
  CHECK(at("[0]:\n") > at("Root Cause"));
  CHECK(at("[1]:\n") < at("[2]:\n"));
  CHECK(at("[2]:\n") < at("[3]:\n"));
  CHECK(report.find("rank      : 0", at("[1]:\n")) < at("[2]:\n"));
  CHECK(report.find("rank      : 1", at("[2]:\n")) < at("[3]:\n"));
  CHECK(report.find("rank      : 3", at("[3]:\n")) < at("Root Cause"));
}

TEST_CASE("the outer error file: the root cause's with errorCode, or ddprun's SignalException") {
  const std::string worker =
      R"({"message": {"message": "ValueError: bad", "extraInfo": {"py_callstack": "tb", )"
      R"("timestamp": "1"}}})";
  auto copied = nlohmann::json::parse(error_file_with_code(worker, 3));
  CHECK(copied["message"]["errorCode"] == 3);
  CHECK(copied["message"]["message"] == "ValueError: bad");
  CHECK(copied["message"]["extraInfo"]["py_callstack"] == "tb");
  CHECK(nlohmann::json::parse(error_file_with_code(worker, -9))["message"]["errorCode"] == -9);
  // As torchrun: no code 0, and the short form or what is not JSON is copied as it is.
  CHECK(error_file_with_code(worker, 0) == worker);
  CHECK(error_file_with_code(R"({"message": "short", "timestamp": 1})", 1) ==
        R"({"message": "short", "timestamp": 1})");
  CHECK(error_file_with_code("not json", 1) == "not json");

  auto signalled = nlohmann::json::parse(signal_error_file(4242, SIGTERM, 1700000000));
  CHECK(signalled["message"]["message"] == "SignalException: Process 4242 got signal: 15");
  CHECK(signalled["message"]["extraInfo"]["timestamp"] == "1700000000");
  CHECK_THAT(signalled["message"]["extraInfo"]["py_callstack"].get<std::string>(),
             Catch::Contains("SIGTERM"));
}
