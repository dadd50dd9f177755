// ddprun end to end with real worker processes: the environment contract, failures and the
// report, signals, kill -9, restarts, logs. Workers are build/bin/ddp-sample-worker.
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "full_console.hpp"
#include "process_harness.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::test;
using nlohmann::json;

namespace {

// The run's directory under --log_dir: <log_dir>/<run_id>_<random> (as torchrun). Fails the
// test unless there is exactly one.
std::filesystem::path run_dir(const std::filesystem::path& log_dir,
                              const std::string& run_id = "") {  // "": any run id
  std::vector<std::filesystem::path> found;
  for (const auto& entry : std::filesystem::directory_iterator(log_dir)) {
    if (entry.is_directory() &&
        entry.path().filename().string().starts_with(run_id + (run_id.empty() ? "" : "_"))) {
      found.push_back(entry.path());
    }
  }
  REQUIRE(found.size() == 1);
  return found.front();
}

std::vector<std::string> ddprun(std::vector<std::string> options,
                                std::vector<std::string> worker_args) {
  std::vector<std::string> argv = {bin_path("ddprun").string()};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.push_back(bin_path("ddp-sample-worker").string());
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  INFO("reading " << path);
  REQUIRE(in.good());
  return json::parse(in);
}

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Waits until every pid has exited and nothing is left in its process group.
void check_no_process_left(const std::vector<pid_t>& groups) {
  for (pid_t pgid : groups) {
    INFO("process group " << pgid);
    CHECK(wait_for_process_exit(pgid));
    CHECK(wait_for_group_exit(pgid));  // the rest of the group dies a moment later
  }
}

}  // namespace

TEST_CASE("every worker gets torchrun's environment") {
  TempDir dir;
  const std::string logs = (dir.path() / "logs").string();
  ProcessResult r = run_process(
      ddprun({"--nproc_per_node=3", "--max_restarts=2", "--log_dir=" + logs},
             {"--env-json", (dir.path() / "env-{rank}.json").string()}),
      {{"DDP_TEST_MARKER", "kept"}}, {"OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  std::set<std::string> ports;
  for (int rank = 0; rank < 3; ++rank) {
    json env = read_json(dir.path() / ("env-" + std::to_string(rank) + ".json"));
    INFO("rank " << rank << ": " << env.dump(1));
    const std::string r_text = std::to_string(rank);
    CHECK(env["RANK"] == r_text);
    CHECK(env["LOCAL_RANK"] == r_text);
    CHECK(env["WORLD_SIZE"] == "3");
    CHECK(env["LOCAL_WORLD_SIZE"] == "3");
    CHECK(env["GROUP_RANK"] == "0");
    CHECK(env["GROUP_WORLD_SIZE"] == "1");
    CHECK(env["ROLE_RANK"] == r_text);
    CHECK(env["ROLE_NAME"] == "default");
    CHECK(env["ROLE_WORLD_SIZE"] == "3");
    CHECK(env["MASTER_ADDR"] == "127.0.0.1");
    int port = std::stoi(env["MASTER_PORT"].get<std::string>());
    CHECK((port > 0 && port < 65536));
    ports.insert(env["MASTER_PORT"]);
    CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "0");
    CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "2");
    // One node, no --master_port: a fresh UUID (torchrun 2.x), the log directory's name.
    const std::string run_id = env["TORCHELASTIC_RUN_ID"];
    CHECK(run_id.size() == 36);
    CHECK(run_dir(logs).filename().string().starts_with(run_id + "_"));
    CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "True");
    CHECK(env["TORCHELASTIC_ERROR_FILE"] ==
          (run_dir(logs) / "attempt_0" / r_text / "error.json").string());
    CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
    CHECK(env["OMP_NUM_THREADS"] == "1");
    CHECK(env["DDP_TEST_MARKER"] == "kept");
  }
  CHECK(ports.size() == 1);                       // one MASTER_PORT for the job
  CHECK(count(r.err, "OMP_NUM_THREADS=1") == 1);  // the notice, once
}

TEST_CASE(
    "standalone run with role and master endpoint from options and workers from "
    "PET_NPROC_PER_NODE") {
  TempDir dir;
  ProcessResult r = run_process(
      ddprun({"--standalone", "--role=trainer", "--master_port=29555", "--local_addr=127.0.0.3"},
             {"--env-json", (dir.path() / "env-{rank}.json").string()}),
      {{"PET_NPROC_PER_NODE", "2"}, {"OMP_NUM_THREADS", "3"}});
  INFO(r.err);
  REQUIRE(r.status == 0);
  json env0 = read_json(dir.path() / "env-0.json");
  json env1 = read_json(dir.path() / "env-1.json");
  CHECK(env1["WORLD_SIZE"] == "2");
  CHECK(env0["ROLE_NAME"] == "trainer");
  CHECK(env0["MASTER_PORT"] == "29555");
  CHECK(env0["MASTER_ADDR"] == "127.0.0.3");
  CHECK(env0["OMP_NUM_THREADS"] == "3");
  CHECK(r.err.find("OMP_NUM_THREADS") == std::string::npos);
  std::string run_id = env0["TORCHELASTIC_RUN_ID"];
  CHECK(std::regex_match(
      run_id, std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")));
  CHECK(env1["TORCHELASTIC_RUN_ID"] == run_id);
}

TEST_CASE("a failing rank gives its exit code and a report naming it") {
  ProcessResult r =
      run_process(ddprun({"--nproc_per_node=3"}, {"--if-rank", "1", "--exit", "3", "--wait"}));
  CHECK(r.status == 3);
  INFO(r.err);
  CHECK_THAT(r.err, Catch::Contains("ddp-sample-worker FAILED"));
  auto root = r.err.substr(r.err.find("Root Cause"));
  CHECK_THAT(root, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(root, Catch::Contains("exitcode  : 3 (pid: "));
  CHECK_THAT(root, Catch::Contains("exit      : exit code 3"));
  CHECK_THAT(root, Catch::Contains("host      : "));
  // The others were stopped by us, and are listed as torchrun 2.x lists them.
  const auto failures = r.err.find("\nFailures:\n");
  REQUIRE(failures != std::string::npos);
  const std::string others = r.err.substr(failures, r.err.find("Root Cause") - failures);
  for (const char* rank : {"rank      : 0 (local_rank: 0)", "rank      : 2 (local_rank: 2)"}) {
    CHECK_THAT(others, Catch::Contains(rank));
  }
  CHECK(std::regex_search(others, std::regex(R"(exitcode  : -15 \(pid: \d+\)  \(SIGTERM\)\n)")));
  CHECK_THAT(others, Catch::Contains("traceback : Signal 15 (SIGTERM) received by PID "));
  CHECK(others.find("rank      : 1 ") == std::string::npos);  // the root cause
}

TEST_CASE("workers that failed together: the first is the root cause and the other is listed") {
  ChildProcess run(ddprun({"--nproc_per_node=3"}, {"--ready", "--wait"}));
  auto ready = run.wait_for_stdout_lines("ready", 3);
  std::map<long, pid_t> pid_of;
  for (const auto& line : ready)
    pid_of[field_of(line, "rank")] = static_cast<pid_t>(field_of(line, "pid"));
  // Both fail while the agent is stopped, so that it sees them in one go when it resumes.
  run.signal(SIGSTOP);
  ::kill(pid_of[1], SIGKILL);
  ::kill(pid_of[2], SIGUSR1);  // (not SIGSEGV: ASan would turn it into SIGABRT)
  CHECK(wait_for_process_exit(pid_of[1]));
  CHECK(wait_for_process_exit(pid_of[2]));
  run.signal(SIGCONT);
  ProcessResult r = run.wait();
  INFO(r.err);
  CHECK((r.status == 128 + SIGKILL || r.status == 128 + SIGUSR1));
  // torchrun's order: the other failures, then the root cause.
  auto others = r.err.substr(r.err.find("\nFailures:\n"),
                             r.err.find("Root Cause") - r.err.find("\nFailures:\n"));
  auto root = r.err.substr(r.err.find("Root Cause"));
  const bool rank1_first = r.status == 128 + SIGKILL;
  CHECK_THAT(root, Catch::Contains(rank1_first ? "rank      : 1" : "rank      : 2"));
  CHECK_THAT(others, Catch::Contains(rank1_first ? "rank      : 2" : "rank      : 1"));
  CHECK_THAT(others, Catch::Contains(rank1_first ? "signal SIGUSR1" : "signal SIGKILL"));
  // Stopped by ddprun's SIGTERM: listed too, as torchrun 2.x does.
  CHECK_THAT(others, Catch::Contains("rank      : 0 (local_rank: 0)"));
  CHECK_THAT(others, Catch::Contains("signal SIGTERM"));
}

TEST_CASE("a rank that wrote its error file before the group was stopped is another failure") {
  TempDir dir;
  const std::string go = (dir.path() / "go").string();
  // Rank 0 fails (its error file written) but is slow to exit: the stop reaches it first.
  // Rank 1 fails once the test saw rank 0's file written.
  ChildProcess run(
      ddprun({"--nproc_per_node=3", "--log_dir", dir.path().string()},
             {"--if-rank", "0", "--error-file", "rank 0 broke too", "--ready", "--if-rank", "1",
              "--wait-for-file", go, "--if-rank", "1", "--error-file", "rank 1 broke", "--if-rank",
              "1", "--exit", "3", "--wait"}));
  run.wait_for_stdout_lines("ready", 3);
  REQUIRE(std::ofstream(go).good());
  ProcessResult r = run.wait();
  INFO(r.err);
  CHECK(r.status == 3);
  const auto failures = r.err.find("\nFailures:\n");
  const auto root_at = r.err.find("Root Cause");
  REQUIRE(failures != std::string::npos);
  REQUIRE(root_at != std::string::npos);
  const std::string others = r.err.substr(failures, root_at - failures);
  const std::string root = r.err.substr(root_at);
  CHECK_THAT(root, Catch::Contains("message   : RuntimeError: rank 1 broke"));
  CHECK_THAT(others, Catch::Contains("rank      : 0 (local_rank: 0)"));
  CHECK_THAT(others, Catch::Contains("message   : RuntimeError: rank 0 broke too"));
  CHECK_THAT(others, Catch::Contains("signal SIGTERM"));
  CHECK(others.find("<NO_OTHER_FAILURES>") == std::string::npos);
  CHECK_THAT(others, Catch::Contains("rank      : 2 (local_rank: 2)"));  // stopped by ddprun
}

TEST_CASE("a worker killed by a signal: 128+signal and the signal's name") {
  ProcessResult r = run_process(
      ddprun({"--nproc_per_node=2"}, {"--if-rank", "0", "--signal", "SIGKILL", "--wait"}));
  CHECK(r.status == 128 + SIGKILL);
  INFO(r.err);
  CHECK_THAT(r.err, Catch::Contains("rank      : 0 (local_rank: 0)"));
  CHECK_THAT(r.err, Catch::Contains("signal SIGKILL (9)"));
}

TEST_CASE("a worker's torchelastic error file is the report's message and traceback") {
  TempDir dir;
  ProcessResult r = run_process(ddprun(
      {"--nproc_per_node=2", "--log_dir", dir.path().string()},
      {"--if-rank", "1", "--error-file", "disk full", "--if-rank", "1", "--exit", "5", "--wait"}));
  CHECK(r.status == 5);
  INFO(r.err);
  CHECK_THAT(r.err, Catch::Contains("message   : RuntimeError: disk full"));
  CHECK_THAT(r.err, Catch::Contains("traceback : Traceback (most recent call last):"));
  const auto error_file = run_dir(dir.path()) / "attempt_0" / "1" / "error.json";
  CHECK_THAT(r.err, Catch::Contains("error_file: " + error_file.string()));
  CHECK(std::filesystem::exists(error_file));
}

TEST_CASE("ddprun started with TORCHELASTIC_ERROR_FILE gets the root cause's file copied there") {
  TempDir dir;
  const auto outer = dir.path() / "outer.json";  // as a scheduler wrapping torchrun sets it
  ProcessResult r = run_process(ddprun({"--nproc_per_node=2", "--log_dir", dir.path().string()},
                                       {"--if-rank", "1", "--error-file", "disk full", "--if-rank",
                                        "1", "--exit", "5", "--wait"}),
                                {{"TORCHELASTIC_ERROR_FILE", outer.string()}});
  CHECK(r.status == 5);
  INFO(r.err);
  const auto error_file = run_dir(dir.path()) / "attempt_0" / "1" / "error.json";
  REQUIRE(std::filesystem::exists(outer));
  json copied = read_json(outer);
  const json original = read_json(error_file);
  CHECK(copied["message"]["errorCode"] == 5);  // torchrun's: the worker's exit code
  copied["message"].erase("errorCode");
  CHECK(copied == original);
}

TEST_CASE("exit status: torchrun's 1 by default, the root cause's with --exit_code=root_cause") {
  // The tests' PET_EXIT_CODE=root_cause (catch_main.cpp) yields to the option.
  const std::vector<std::string> failing = {"--if-rank", "1", "--exit", "3", "--wait"};
  CHECK(run_process(ddprun({"--nproc_per_node=2", "--exit_code=torchrun"}, failing)).status == 1);
  CHECK(run_process(ddprun({"--nproc_per_node=2", "--exit_code=root_cause"}, failing)).status == 3);
  const std::vector<std::string> killed = {"--if-rank", "0", "--signal", "SIGKILL", "--wait"};
  CHECK(run_process(ddprun({"--nproc_per_node=2", "--exit_code=torchrun"}, killed)).status == 1);
  CHECK(
      run_process(ddprun({"--nproc_per_node=2"}, {"--exit", "0"}), {{"PET_EXIT_CODE", "torchrun"}})
          .status == 0);
  // Bad input as torchrun: 2 where its argparse stops, 1 for a value it refuses later.
  ProcessResult unknown = run_process(ddprun({"--no_such_option"}, {"--exit", "0"}));
  CHECK(unknown.status == 2);
  CHECK_THAT(unknown.err, Catch::Contains("unknown option --no_such_option"));
  CHECK(run_process(ddprun({"--max_restarts=abc"}, {"--exit", "0"})).status == 2);
  ProcessResult bad_value = run_process(ddprun({"--nproc_per_node=abc"}, {"--exit", "0"}));
  CHECK(bad_value.status == 1);
  CHECK_THAT(bad_value.err, Catch::Contains("ddprun: error: --nproc_per_node=abc"));
  CHECK(run_process(ddprun({"--exit_code=sometimes"}, {"--exit", "0"})).status == 1);
}

TEST_CASE("restarts increment TORCHELASTIC_RESTART_COUNT and stop at --max_restarts") {
  TempDir dir;
  auto env_file = (dir.path() / "env-{rank}-{restart}.json").string();
  // Rank 1 fails once rank 0 has written its file, so that both files exist every attempt.
  ProcessResult r = run_process(ddprun(
      {"--nproc_per_node=2", "--max_restarts=2"},
      {"--env-json", env_file, "--if-rank", "1", "--wait-for-file",
       (dir.path() / "env-0-{restart}.json").string(), "--if-rank", "1", "--exit", "4", "--wait"}));
  CHECK(r.status == 4);
  INFO(r.err);
  CHECK(count(r.err, "restarting it") == 2);
  for (int restart = 0; restart <= 2; ++restart) {
    for (int rank = 0; rank < 2; ++rank) {
      auto path =
          dir.path() / ("env-" + std::to_string(rank) + "-" + std::to_string(restart) + ".json");
      CHECK(read_json(path)["TORCHELASTIC_RESTART_COUNT"] == std::to_string(restart));
    }
  }
  CHECK_FALSE(std::filesystem::exists(dir.path() / "env-1-3.json"));

  // A group that succeeds on its second attempt: exit 0.
  ProcessResult ok =
      run_process(ddprun({"--nproc_per_node=2", "--max_restarts=3"},
                         {"--if-restart-below", "1", "--exit", "1", "--print", "done"}));
  CHECK(ok.status == 0);
  CHECK(count(ok.err, "restarting it") == 1);
  CHECK(count(ok.out, "done") == 2);
}

TEST_CASE(
    "restart policy none: a failed rank stops no other, and the job ends once every worker has "
    "exited, with the report") {
  TempDir dir;
  const std::string go = (dir.path() / "go").string();
  // Ranks 0-2 run on until the test has seen ddprun take rank 3's failure; a signal from ddprun
  // would end them before their second "ready" line.
  ChildProcess run(ddprun({"--nproc_per_node=4", "--restart_policy=none"},
                          {"--ready", "--if-rank", "3", "--exit", "5", "--wait-for-file", go,
                           "--ready", "--exit", "0"}));
  run.wait_for_stderr(
      "rank 3 failed (exit code 5); --restart_policy=none: the 3 other worker(s) here go on");
  std::ofstream(go).put('\n');
  const ProcessResult r = run.wait();
  INFO(r.err);
  CHECK(r.status == 5);  // the tests' PET_EXIT_CODE=root_cause
  for (const std::string rank : {"0", "1", "2"}) {
    CHECK(count(r.out, "ready rank=" + rank + " ") == 2);
  }
  CHECK(count(r.out, "ready rank=3 ") == 1);
  CHECK_THAT(r.err, !Catch::Contains("stopping the workers"));
  CHECK_THAT(r.err, Catch::Contains("rank      : 3 (local_rank: 3)"));
  CHECK_THAT(r.err, Catch::Contains("exitcode  : 5"));
}

namespace {

// ddprun --restart_policy=none running /bin/sh -c SCRIPT as each of `workers` workers.
std::vector<std::string> ddprun_sh(int workers, const std::string& script,
                                   std::vector<std::string> options = {}) {
  std::vector<std::string> argv = {bin_path("ddprun").string(),
                                   "--nproc_per_node=" + std::to_string(workers),
                                   "--restart_policy=none", "--no_python"};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), {"/bin/sh", "-c", script});
  return argv;
}

// A worker that starts a daemon in a session of its own (setsid, as a double fork leaves it),
// prints "daemon pid=P" and exits; the daemon runs `daemon_script`.
std::string worker_with_daemon(const std::string& daemon_script) {
  return "setsid sh -c 'echo daemon pid=$$; " + daemon_script + "' & exit 0";
}

}  // namespace

TEST_CASE(
    "restart policy none: a daemon a worker left in a session of its own is waited for before "
    "the job ends") {
  TempDir dir;
  const std::string go = (dir.path() / "go").string();
  ChildProcess run(ddprun_sh(
      1, worker_with_daemon("while [ ! -e " + go + " ]; do sleep 0.05; done; echo daemon done")));
  const pid_t daemon =
      static_cast<pid_t>(field_of(run.wait_for_stdout_lines("daemon pid=", 1).at(0), "pid"));
  run.wait_for_stderr("for 1 process(es) the workers left running: pid " + std::to_string(daemon));
  std::ofstream(go).put('\n');
  const ProcessResult r = run.wait();
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("daemon done"));
  CHECK(wait_for_process_exit(daemon));  // and reaped: no zombie left of it
}

TEST_CASE(
    "restart policy none: a daemon that does not exit gets SIGTERM after the wait, and kill -9 "
    "of ddprun leaves none") {
  {
    ChildProcess run(ddprun_sh(1, worker_with_daemon("exec sleep 1000"), {"--shutdown_timeout=1"}));
    const pid_t daemon =
        static_cast<pid_t>(field_of(run.wait_for_stdout_lines("daemon pid=", 1).at(0), "pid"));
    const ProcessResult r = run.wait();
    INFO(r.err);
    CHECK(r.status == 0);
    CHECK_THAT(r.err, Catch::Contains("still running after the wait: pid " +
                                      std::to_string(daemon) + " (sleep); sending SIGTERM"));
    CHECK(wait_for_process_exit(daemon));
  }
  ChildProcess run(ddprun_sh(1, worker_with_daemon("exec sleep 1000")));
  const pid_t daemon =
      static_cast<pid_t>(field_of(run.wait_for_stdout_lines("daemon pid=", 1).at(0), "pid"));
  run.wait_for_stderr("the workers left running: pid " + std::to_string(daemon));
  run.signal(SIGKILL);
  CHECK(run.wait().status == 128 + SIGKILL);
  const bool gone = wait_for_process_exit(daemon, std::chrono::seconds(10));
  if (!gone) ::kill(daemon, SIGKILL);
  CHECK(gone);
}

TEST_CASE("SIGTERM to ddprun is forwarded and leaves no process in any worker group") {
  ChildProcess run(ddprun({"--nproc_per_node=2"}, {"--spawn-child", "--ready", "--wait"}));
  auto ready = run.wait_for_stdout_lines("ready", 2);
  auto children = run.wait_for_stdout_lines("child pid=", 2);
  std::vector<pid_t> groups;
  for (const auto& line : ready) groups.push_back(static_cast<pid_t>(field_of(line, "pid")));
  for (pid_t pgid : groups) CHECK(live_processes_in_group(pgid).size() == 2);  // worker + child
  run.signal(SIGTERM);
  ProcessResult r = run.wait();
  CHECK(r.status == 128 + SIGTERM);
  check_no_process_left(groups);
  for (const auto& line : children) {
    CHECK(wait_for_process_exit(static_cast<pid_t>(field_of(line, "pid"))));
  }
}

TEST_CASE("workers that ignore the signal are killed after --shutdown_timeout") {
  ChildProcess run(ddprun({"--nproc_per_node=2", "--shutdown_timeout=0.2"},
                          {"--ignore", "SIGTERM", "--ready", "--wait"}));
  auto ready = run.wait_for_stdout_lines("ready", 2);
  run.signal(SIGTERM);
  ProcessResult r = run.wait();
  CHECK(r.status == 128 + SIGTERM);
  std::vector<pid_t> groups;
  for (const auto& line : ready) groups.push_back(static_cast<pid_t>(field_of(line, "pid")));
  check_no_process_left(groups);
  // The SIGKILL is announced, naming each worker that outlived the timeout.
  INFO(r.err);
  CHECK_THAT(r.err, Catch::Contains("2 workers did not stop within --shutdown_timeout=0.2s after "
                                    "SIGTERM: sending SIGKILL to rank 0 (local_rank 0, pid "));
  CHECK_THAT(r.err, Catch::Contains("pid " + std::to_string(groups[0])));
  CHECK_THAT(r.err, Catch::Contains("pid " + std::to_string(groups[1])));
}

TEST_CASE("a second Ctrl-C does not kill: SIGKILL only after --shutdown_timeout") {
  ChildProcess run(ddprun({"--nproc_per_node=2", "--shutdown_timeout=1"},
                          {"--ignore", "SIGINT", "--ready", "--wait"}));
  run.wait_for_stdout_lines("ready", 2);
  run.signal(SIGINT);
  run.wait_for_stderr("got SIGINT");
  run.signal(SIGINT);
  run.wait_for_stderr("SIGINT again: the workers have it already");
  ProcessResult r = run.wait(std::chrono::seconds(20));
  CHECK(r.status == 128 + SIGINT);
  CHECK_THAT(r.err, Catch::Contains("did not stop within --shutdown_timeout=1s after SIGINT: "
                                    "sending SIGKILL"));
}

TEST_CASE("each handled signal is forwarded and gives 128+signal") {
  for (int signal : {SIGHUP, SIGINT}) {  // (SIGQUIT too, but it would dump cores)
    ChildProcess run(ddprun({"--nproc_per_node=2"}, {"--ready", "--wait"}));
    run.wait_for_stdout_lines("ready", 2);
    run.signal(signal);
    CHECK(run.wait().status == 128 + signal);
  }
  // --signals_to_handle replaces the list: SIGUSR1 is forwarded (and ends the workers).
  ChildProcess run(
      ddprun({"--nproc_per_node=2", "--signals_to_handle=SIGUSR1"}, {"--ready", "--wait"}));
  run.wait_for_stdout_lines("ready", 2);
  run.signal(SIGUSR1);
  ProcessResult r = run.wait();
  CHECK(r.status == 128 + SIGUSR1);
  CHECK_THAT(r.err, Catch::Contains("got SIGUSR1"));
}

TEST_CASE("kill -9 of ddprun leaves no worker") {
  ChildProcess run(ddprun({"--nproc_per_node=2"}, {"--ready", "--wait"}));
  auto ready = run.wait_for_stdout_lines("ready", 2);
  run.signal(SIGKILL);
  ProcessResult r = run.wait();
  CHECK(r.status == 128 + SIGKILL);
  std::vector<pid_t> groups;
  for (const auto& line : ready) groups.push_back(static_cast<pid_t>(field_of(line, "pid")));
  check_no_process_left(groups);
}

TEST_CASE("kill -9 of ddprun leaves no child process of a worker either") {
  // The workers die by their parent-death signal; their own children have none, and only
  // a process outside ddprun can still signal their groups.
  ChildProcess run(ddprun({"--nproc_per_node=2"}, {"--spawn-child", "--ready", "--wait"}));
  auto ready = run.wait_for_stdout_lines("ready", 2);
  auto children = run.wait_for_stdout_lines("child pid=", 2);
  run.signal(SIGKILL);
  CHECK(run.wait().status == 128 + SIGKILL);
  std::vector<pid_t> groups;
  for (const auto& line : ready) groups.push_back(static_cast<pid_t>(field_of(line, "pid")));
  check_no_process_left(groups);
  for (const auto& line : children) {
    const auto pid = static_cast<pid_t>(field_of(line, "pid"));
    INFO("child " << pid);
    const bool gone = wait_for_process_exit(pid, std::chrono::seconds(10));
    if (!gone) ::kill(pid, SIGKILL);
    CHECK(gone);
  }
}

TEST_CASE("tee gives prefixed whole lines on the console and plain files in the log layout") {
  TempDir dir;
  const int lines = 3000;
  ProcessResult r = run_process(ddprun(
      {"--nproc_per_node=2", "--tee=3", "--role=w", "--log_dir=" + dir.path().string(),
       "--rdzv_id=job1"},
      {"--lines", std::to_string(lines), "--eprint", "to stderr", "--partial", "no newline"}));
  REQUIRE(r.status == 0);
  std::map<int, int> next_line = {{0, 0}, {1, 0}};
  for (const auto& line : lines_of(r.out)) {
    std::smatch m;
    if (std::regex_match(line, m, std::regex(R"(\[w([01])\]:rank \1 line (\d+))"))) {
      int rank = std::stoi(m[1]);
      CHECK(std::stoi(m[2]) == next_line[rank]++);  // in order, none cut or merged
    } else {
      CHECK_THAT(line, Catch::Matches(R"(\[w[01]\]:no newline)"));
    }
  }
  CHECK(next_line[0] == lines);
  CHECK(next_line[1] == lines);
  CHECK(count(r.err, "[w0]:to stderr\n") == 1);
  CHECK(count(r.err, "[w1]:to stderr\n") == 1);
  for (int rank = 0; rank < 2; ++rank) {
    auto base = run_dir(dir.path(), "job1") / "attempt_0" / std::to_string(rank);
    std::ifstream out(base / "stdout.log");
    std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
    CHECK(text.starts_with("rank " + std::to_string(rank) + " line 0\n"));
    CHECK(text.ends_with("line " + std::to_string(lines - 1) + "\nno newline"));
    std::ifstream err(base / "stderr.log");
    CHECK(std::string(std::istreambuf_iterator<char>(err), {}) == "to stderr\n");
  }
}

TEST_CASE("redirects and per-rank maps and the local ranks filter") {
  TempDir dir;
  ProcessResult r = run_process(
      ddprun({"--nproc_per_node=2", "-r", "0:1", "-t", "1:3", "--log_dir", dir.path().string()},
             {"--print", "out", "--eprint", "err"}));
  REQUIRE(r.status == 0);
  const auto base = run_dir(dir.path()) / "attempt_0";
  // rank 0: stdout to its file only, stderr to the console as is; rank 1: both teed.
  CHECK(std::string(
            std::istreambuf_iterator<char>(std::ifstream(base / "0" / "stdout.log").rdbuf()), {}) ==
        "out\n");
  CHECK_FALSE(std::filesystem::exists(base / "0" / "stderr.log"));
  CHECK(lines_of(r.out) == std::vector<std::string>{"[default1]:out"});
  CHECK(count(r.err, "[default1]:err\n") == 1);
  CHECK(count(r.err, "err\n") == 2);

  TempDir dir2;
  ProcessResult f = run_process(ddprun({"--nproc_per_node=3", "--tee=3", "--local_ranks_filter=1",
                                        "--log_dir", dir2.path().string()},
                                       {"--print", "hello"}));
  REQUIRE(f.status == 0);
  CHECK(lines_of(f.out) == std::vector<std::string>{"[default1]:hello"});
  for (int rank = 0; rank < 3; ++rank) {  // the files keep every rank
    auto path = run_dir(dir2.path()) / "attempt_0" / std::to_string(rank) / "stdout.log";
    CHECK(std::string(std::istreambuf_iterator<char>(std::ifstream(path).rdbuf()), {}) ==
          "hello\n");
  }
}

TEST_CASE("two runs with the same log_dir and run id write to two fresh directories") {
  TempDir dir;
  for (int run = 0; run < 2; ++run) {
    ProcessResult r = run_process(
        ddprun({"--nproc_per_node=1", "-r3", "--rdzv_id=job", "--log_dir", dir.path().string()},
               {"--print", "run " + std::to_string(run)}));
    REQUIRE(r.status == 0);
  }
  std::vector<std::string> outputs;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    CHECK(entry.path().filename().string().starts_with("job_"));
    std::ifstream out(entry.path() / "attempt_0" / "0" / "stdout.log");
    outputs.emplace_back(std::istreambuf_iterator<char>(out), std::istreambuf_iterator<char>());
  }
  std::sort(outputs.begin(), outputs.end());
  CHECK(outputs == std::vector<std::string>{"run 0\n", "run 1\n"});
}

TEST_CASE("restarts write each attempt's logs in its own directory") {
  TempDir dir;
  ProcessResult r = run_process(
      ddprun({"--nproc_per_node=1", "--max_restarts=1", "-r3", "--log_dir", dir.path().string()},
             {"--hello", "--if-restart-below", "1", "--exit", "2"}));
  CHECK(r.status == 0);
  for (const char* attempt : {"attempt_0", "attempt_1"}) {
    auto path = run_dir(dir.path()) / attempt / "0" / "stdout.log";
    std::string text(std::istreambuf_iterator<char>(std::ifstream(path).rdbuf()), {});
    CHECK_THAT(text, Catch::Contains("hello from rank 0"));
  }
}

TEST_CASE("workers inherit no descriptor of the agent but their streams and record page") {
  // The agent's store socket (and its clients' connections) must not leak into workers, as
  // torchrun's subprocess(close_fds=True) guarantees; nor must the tee pipes of other ranks.
  // Each gets its own collective record page (DDPRUN_RECORD_FD), and nothing else.
  TempDir dir;
  ProcessResult r = run_process(
      ddprun({"--nproc_per_node=2", "--tee=3", "--log_dir", dir.path().string()}, {"--fds"}));
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto lines = lines_of(r.out);
  REQUIRE(lines.size() == 2);
  for (const auto& line : lines) {
    INFO(line);
    CHECK(std::regex_match(line, std::regex(R"(\[default[01]\]:fds rank=[01]: 0 1 2 record:\d+)")));
  }
}

TEST_CASE("a worker can read the terminal ddprun runs in: input() or pdb") {
  // ddprun in its own session on a pseudo-terminal, as in an interactive shell. A worker in
  // a background process group of that terminal would be stopped by SIGTTIN when it reads;
  // under torchrun the workers read the terminal (same group, or their own session).
  int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  REQUIRE(master >= 0);
  REQUIRE(::grantpt(master) == 0);
  REQUIRE(::unlockpt(master) == 0);
  const std::string slave_name = ::ptsname(master);
  auto argv = ddprun({"--nproc_per_node=1"}, {"--read-line", "--print", "done"});
  std::vector<char*> c_argv;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setsid();
    int slave = ::open(slave_name.c_str(), O_RDWR);  // becomes the controlling terminal
    if (slave < 0) ::_exit(126);
    for (int fd = 0; fd < 3; ++fd) ::dup2(slave, fd);
    ::execv(c_argv[0], c_argv.data());
    ::_exit(127);
  }
  const std::string input = "hello\n";
  REQUIRE(::write(master, input.data(), input.size()) == static_cast<ssize_t>(input.size()));
  std::string seen;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (seen.find("done") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buffer[4096];
    ssize_t n = ::read(master, buffer, sizeof buffer);
    if (n <= 0) break;
    seen.append(buffer, static_cast<std::size_t>(n));
  }
  INFO(seen);
  CHECK_THAT(seen, Catch::Contains("got hello"));
  CHECK_THAT(seen, Catch::Contains("done"));
  ::kill(-pid, SIGKILL);  // ddprun's session (its workers have their own groups)
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ::close(master);
}

TEST_CASE("a console that stops reading does not stall the agent: SIGTERM is still forwarded") {
  // ddprun's stdout is a pipe that is full before ddprun starts and that nobody reads until
  // the end. The worker's teed stdout is far larger than its own pipe to ddprun, so the
  // worker only gets to print "ready" (on stderr, not teed) once ddprun has taken, and tried
  // to write to the console, most of it: an agent that wrote the console itself would hang
  // there.
  FullConsoleProcess agent(ddprun({"--nproc_per_node=1", "--tee=1"},
                                  {"--lines", "30000", "--eprint", "ready", "--wait"}),
                           FullConsoleProcess::Full::kStdout);
  const pid_t pid = agent.pid();
  agent.read_stderr_until("ready");

  // The worker: ddprun's child that runs ddp-sample-worker (another one is its reaper).
  std::ifstream children("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) +
                         "/children");
  pid_t worker = 0;
  for (pid_t child; children >> child;) {
    std::ifstream cmdline("/proc/" + std::to_string(child) + "/cmdline");
    std::string command;
    std::getline(cmdline, command, '\0');
    if (command.find("ddp-sample-worker") != std::string::npos) worker = child;
  }
  REQUIRE(worker > 0);
  ::kill(pid, SIGTERM);
  CHECK(wait_for_process_exit(worker));  // forwarded while the console is still full

  const int status = agent.wait();
  const std::string out_text = agent.stdout_text();
  const std::string err_text = agent.stderr_text();
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
  CHECK_THAT(err_text, Catch::Contains("ddprun: got SIGTERM: forwarding it to the workers"));
  // Every teed line arrives, in order, after the filler.
  const auto lines = lines_of(out_text.substr(out_text.find("[default0]:")));
  REQUIRE(lines.size() == 30000);
  CHECK(lines.front() == "[default0]:rank 0 line 0");
  CHECK(lines.back() == "[default0]:rank 0 line 29999");
}

TEST_CASE("a line prefix template renders each teed line's prefix, as torchrun 2.x") {
  ProcessResult r = run_process(
      ddprun({"--nproc_per_node=2", "--tee=3", "--role=trainer",
              "--log_line_prefix_template=${role_name}|${rank}|$local_rank|${hostname}|${x}: "},
             {"--print", "out", "--eprint", "err"}));
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  char name[256] = {};
  REQUIRE(::gethostname(name, sizeof name - 1) == 0);
  const std::string host = name;  // torchrun's ${hostname}: socket.gethostname()
  for (const char* rank : {"0", "1"}) {
    const std::string prefix = std::string("trainer|") + rank + "|" + rank + "|" + host + "|${x}: ";
    CHECK_THAT(r.out, Catch::Contains(prefix + "out\n"));
    CHECK_THAT(r.err, Catch::Contains(prefix + "err\n"));
  }
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE when the option is not given.
  ProcessResult v = run_process(ddprun({"--tee=1"}, {"--print", "out"}),
                                {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "<${rank}> "}});
  CHECK(v.status == 0);
  CHECK_THAT(v.out, Catch::Contains("<0> out\n"));
}

TEST_CASE("duplicate filters copy the matching teed lines to attempt_<n>/filtered_*.log") {
  TempDir dir;
  ProcessResult r = run_process(
      ddprun({"--nproc_per_node=2", "--tee=3", "--log_dir", dir.path().string(),
              "--duplicate_stdout_filters=apple,or,,ange", "--duplicate-stderr-filters", "loss"},
             {"--print", "apple pie", "--print", "pear", "--print", "or,ange", "--print", "orange",
              "--eprint", "loss 0.1", "--eprint", "warning"}));
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  const auto attempt = run_dir(dir.path()) / "attempt_0";
  std::ifstream out_file(attempt / "filtered_stdout.log");
  std::ifstream err_file(attempt / "filtered_stderr.log");
  REQUIRE(out_file.good());
  REQUIRE(err_file.good());
  std::multiset<std::string> out_lines, err_lines;
  for (std::string line; std::getline(out_file, line);) out_lines.insert(line);
  for (std::string line; std::getline(err_file, line);) err_lines.insert(line);
  CHECK(out_lines == std::multiset<std::string>{"[default0]:apple pie", "[default0]:or,ange",
                                                "[default1]:apple pie", "[default1]:or,ange"});
  CHECK(err_lines == std::multiset<std::string>{"[default0]:loss 0.1", "[default1]:loss 0.1"});
  CHECK(count(r.out, "pear") == 2);  // the console has every line
}

TEST_CASE("virtual local ranks: LOCAL_RANK 0 and one device each from CUDA_VISIBLE_DEVICES") {
  TempDir dir;
  const std::string env_json = (dir.path() / "env-{rank}.json").string();
  ProcessResult r =
      run_process(ddprun({"--nproc_per_node=2", "--virtual_local_rank"}, {"--env-json", env_json}),
                  {{"CUDA_VISIBLE_DEVICES", "3, 5"}});
  INFO(r.err);
  REQUIRE(r.status == 0);
  for (int rank : {0, 1}) {
    json env = read_json(dir.path() / ("env-" + std::to_string(rank) + ".json"));
    CHECK(env["LOCAL_RANK"] == "0");
    CHECK(env["RANK"] == std::to_string(rank));
    CHECK(env["CUDA_VISIBLE_DEVICES"] == (rank == 0 ? "3" : "5"));
  }
  ProcessResult few =
      run_process(ddprun({"--nproc_per_node=2", "--virtual-local-rank"}, {"--exit", "0"}),
                  {{"CUDA_VISIBLE_DEVICES", "3"}});
  CHECK(few.status == 1);
  CHECK_THAT(few.err, Catch::Contains("local rank 1 has no GPU in CUDA_VISIBLE_DEVICES=3"));
}

TEST_CASE("the console event handler: torchrun's events as JSON lines on stderr") {
  ProcessResult r = run_process(ddprun({"--nproc_per_node=2", "--event_log_handler=console"},
                                       {"--if-rank", "1", "--exit", "3", "--wait"}));
  INFO(r.err);
  CHECK(r.status == 3);
  std::vector<json> events;
  std::istringstream lines(r.err);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("{\"name\": \"torchelastic.worker.status.")) {
      events.push_back(json::parse(line));
    }
  }
  std::vector<std::string> names;
  for (const json& e : events) names.push_back(e["name"].get<std::string>().substr(27));
  REQUIRE(names.size() == 7);
  CHECK(names[0] == "RENDEZVOUS");
  CHECK(names[1] == "ASSIGN_WORKER_RANKS");
  CHECK(names[2] == "START");
  CHECK(names[3] == "START");
  CHECK(names[6] == "FAILED");
  CHECK(events[6]["source"] == "AGENT");
  for (int i : {4, 5}) {  // the workers' ends: rank 1's exit, rank 0 stopped by SIGTERM
    const json& m = events[static_cast<std::size_t>(i)]["metadata"];
    CHECK(events[static_cast<std::size_t>(i)]["source"] == "WORKER");
    CHECK(m["state"] == "FAILED");
    json inner = json::parse(m["metadata"].get<std::string>());
    CHECK(inner["exit_code"][0] == (m["global_rank"] == 1 ? 3 : -SIGTERM));
    CHECK(inner["role_world_size"][0] == 2);
  }
  CHECK(events[2]["metadata"]["worker_id"] != events[3]["metadata"]["worker_id"]);
  CHECK(events[0]["metadata"]["run_id"].get<std::string>().size() == 36);  // a fresh UUID
}

TEST_CASE("NUMA binding without a GPU says so and starts nothing") {
  ProcessResult r = run_process(ddprun({"--numa_binding=node"}, {"--print", "ran"}));
  if (r.status == 0) return skip("a GPU is visible here: the binding ran (" + r.err + ")");
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("--numa_binding=node: no GPU found"));
  CHECK(r.out.find("ran") == std::string::npos);
}

TEST_CASE(
    "workers get ddprun's NCCL profiler plugin in NCCL_PROFILER_PLUGIN unless the user "
    "named one") {
  TempDir dir;
  const std::string env_json = (dir.path() / "env-{rank}.json").string();
  const auto plugin =
      std::filesystem::weakly_canonical(bin_path("ddprun")).parent_path().parent_path() / "lib" /
      "libddprun-nccl-profiler.so";
  SECTION("ddprun's plugin") {
    ProcessResult r = run_process(ddprun({"--nproc_per_node=2"}, {"--env-json", env_json}), {},
                                  {"NCCL_PROFILER_PLUGIN", "DDPRUN_NCCL_PROFILER"});
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK(r.err.find("NCCL profiler plugin") == std::string::npos);  // no notice
    for (int rank = 0; rank < 2; ++rank) {
      json env = read_json(dir.path() / ("env-" + std::to_string(rank) + ".json"));
      REQUIRE(env.contains("NCCL_PROFILER_PLUGIN"));
      CHECK(std::filesystem::weakly_canonical(env["NCCL_PROFILER_PLUGIN"].get<std::string>()) ==
            plugin);
    }
  }
  SECTION("the user's choice is kept") {
    ProcessResult r = run_process(ddprun({"--nproc_per_node=1"}, {"--env-json", env_json}),
                                  {{"NCCL_PROFILER_PLUGIN", "none"}});
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK(read_json(dir.path() / "env-0.json")["NCCL_PROFILER_PLUGIN"] == "none");
  }
  SECTION("DDPRUN_NCCL_PROFILER=0 turns it off") {
    ProcessResult r = run_process(ddprun({"--nproc_per_node=1"}, {"--env-json", env_json}),
                                  {{"DDPRUN_NCCL_PROFILER", "0"}}, {"NCCL_PROFILER_PLUGIN"});
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK_FALSE(read_json(dir.path() / "env-0.json").contains("NCCL_PROFILER_PLUGIN"));
  }
}
