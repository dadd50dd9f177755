// Worker and spawn_process: real child processes, exits as events on an io_context.
#include "process/worker.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <fstream>

#include "test_support.hpp"

using namespace ddp::launcher;

namespace {

SpawnOptions shell(const std::string& script) {
  SpawnOptions options;
  options.program = "/bin/sh";
  options.argv = {"sh", "-c", script};
  options.env = {"PATH=/usr/bin:/bin"};
  return options;
}

// Runs one worker to its exit and returns it.
std::optional<WorkerExit> run_worker(const SpawnOptions& options) {
  boost::asio::io_context io;
  auto worker = std::make_shared<Worker>(io, 0);
  int calls = 0;
  worker->start(options, [&](Worker&) { ++calls; });
  worker->confirm_started();
  io.run();
  CHECK(calls == 1);
  CHECK_FALSE(worker->running());
  return worker->exit();
}

}  // namespace

TEST_CASE("a worker's exit code and signal arrive as one event each") {
  auto code = run_worker(shell("exit 3"));
  REQUIRE(code);
  CHECK(code->exit_code == 3);
  CHECK(code->signal == 0);
  CHECK(code->failed());

  auto killed = run_worker(shell("kill -SEGV $$"));
  REQUIRE(killed);
  CHECK(killed->signal == SIGSEGV);
  CHECK(killed->failed());

  auto ok = run_worker(shell("exit 0"));
  REQUIRE(ok);
  CHECK_FALSE(ok->failed());
}

TEST_CASE("a worker runs in its own process group with its output where we said") {
  ddp::test::TempDir dir;
  auto out_path = dir.path() / "out";
  UniqueFd out(::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  SpawnOptions options = shell("ps -o pgid= -p $$ | tr -d ' '; echo \"$MARK\"");
  options.env.push_back("MARK=env-ok");
  options.stdout_fd = out.get();
  boost::asio::io_context io;
  auto worker = std::make_shared<Worker>(io, 0);
  worker->start(options, nullptr);
  worker->confirm_started();
  const pid_t pid = worker->pid();
  io.run();
  std::ifstream in(out_path);
  std::string pgid, mark;
  in >> pgid >> mark;
  CHECK(pgid == std::to_string(pid));  // its own group, led by itself
  CHECK(mark == "env-ok");             // exactly the environment we gave
}

TEST_CASE("signal_group reaches the worker's children, and destruction kills and reaps") {
  boost::asio::io_context io;
  auto worker = std::make_shared<Worker>(io, 0);
  worker->start(shell("sleep 600 & wait"), nullptr);
  worker->confirm_started();
  worker->signal_group(SIGTERM);
  io.run();
  REQUIRE(worker->exit());
  CHECK(worker->exit()->signal == SIGTERM);

  pid_t pid = 0;
  {
    boost::asio::io_context io2;
    auto lingering = std::make_shared<Worker>(io2, 1);
    lingering->start(shell("sleep 600"), nullptr);
    lingering->confirm_started();
    pid = lingering->pid();
    CHECK(lingering->running());
  }  // the io_context and the worker go away with the process still running
  CHECK(::waitpid(pid, nullptr, WNOHANG) < 0);  // already reaped by the destructor
  CHECK(::kill(pid, 0) < 0);
}

TEST_CASE("an exec failure is a SpawnError naming the program and the reason") {
  SpawnOptions options;
  options.program = "/nonexistent/program";
  options.argv = {"program"};
  boost::asio::io_context io;
  auto worker = std::make_shared<Worker>(io, 0);
  worker->start(options, nullptr);
  CHECK_THROWS_WITH(worker->confirm_started(),
                    Catch::Contains("/nonexistent/program") && Catch::Contains("No such file"));
  io.run();  // the child exits 127 and is reaped as usual
  REQUIRE(worker->exit());
  CHECK(worker->exit()->exit_code == 127);
}

TEST_CASE("a worker given CPUs runs on those alone (--numa_binding)") {
  cpu_set_t mine;
  REQUIRE(::sched_getaffinity(0, sizeof mine, &mine) == 0);
  int last = -1;  // the highest CPU ddprun may use: the worker gets that one alone
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &mine)) last = cpu;
  }
  REQUIRE(last >= 0);
  ddp::test::TempDir dir;
  auto out_path = dir.path() / "out";
  UniqueFd out(::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  SpawnOptions options = shell("sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status");
  options.stdout_fd = out.get();
  options.cpus = {last};
  auto exit = run_worker(options);
  REQUIRE(exit);
  CHECK_FALSE(exit->failed());
  std::ifstream in(out_path);
  std::string allowed;
  in >> allowed;
  CHECK(allowed == std::to_string(last));
}
