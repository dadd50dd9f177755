// Entrypoint resolution: .py under python3 -u, -m, direct executables, --no_python,
// --legacy-local-rank, and a missing entrypoint caught before any worker starts.
#include "ddp/launcher/worker_command.hpp"

#include <catch2/catch.hpp>
#include <fstream>
#include <map>

#include "ddp/launcher/cli.hpp"
#include "test_support.hpp"

using namespace ddp::launcher;

namespace {

EnvLookup env_of(std::map<std::string, std::string> env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    return it == env.end() ? std::nullopt : std::optional(it->second);
  };
}

LaunchConfig config_for(std::string entrypoint, std::vector<std::string> args = {},
                        EntrypointKind kind = EntrypointKind::kAuto) {
  LaunchConfig c;
  c.entrypoint = std::move(entrypoint);
  c.entrypoint_args = std::move(args);
  c.entrypoint_kind = kind;
  return c;
}

}  // namespace

TEST_CASE("a .py entrypoint runs under python3 -u or PYTHON_EXEC") {
  ddp::test::TempDir dir;
  std::string script = (dir.path() / "train.py").string();
  std::ofstream(script) << "print('hi')\n";
  WorkerCommand c = resolve_worker_command(config_for(script, {"--lr", "1"}),
                                           env_of({{"PATH", "/usr/bin:/bin"}}));
  CHECK(c.program == "/usr/bin/python3");
  CHECK(c.argv == std::vector<std::string>{"python3", "-u", script, "--lr", "1"});

  WorkerCommand d = resolve_worker_command(
      config_for(script), env_of({{"PATH", "/nowhere"}, {"PYTHON_EXEC", "/usr/bin/python3"}}));
  CHECK(d.program == "/usr/bin/python3");
  CHECK(d.argv == std::vector<std::string>{"/usr/bin/python3", "-u", script});
}

TEST_CASE("module entrypoints run python3 -u -m NAME and other files run directly") {
  auto path = env_of({{"PATH", "/usr/bin:/bin"}});
  WorkerCommand m =
      resolve_worker_command(config_for("pkg.train", {"a"}, EntrypointKind::kModule), path);
  // As torchrun: the interpreter's own -m (sys.path[0] the working directory, no frame of
  // ddprun's in tracebacks).
  CHECK(m.argv == std::vector<std::string>{"python3", "-u", "-m", "pkg.train", "a"});
  CHECK(m.args_begin == 4);

  WorkerCommand direct = resolve_worker_command(config_for("true", {"x"}), path);
  CHECK((direct.program == "/usr/bin/true" || direct.program == "/bin/true"));
  CHECK(direct.argv == std::vector<std::string>{"true", "x"});

  ddp::test::TempDir dir;
  std::string script = (dir.path() / "run.py").string();
  std::ofstream(script) << "#!/bin/sh\necho hi\n";
  CHECK_THROWS_AS(resolve_worker_command(config_for(script, {}, EntrypointKind::kDirect), path),
                  UsageError);  // not executable
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  WorkerCommand forced =
      resolve_worker_command(config_for(script, {}, EntrypointKind::kDirect), path);
  CHECK(forced.program == script);
  CHECK(forced.argv == std::vector<std::string>{script});
}

TEST_CASE("a missing entrypoint or interpreter is a UsageError") {
  auto path = env_of({{"PATH", "/usr/bin:/bin"}});
  CHECK_THROWS_WITH(resolve_worker_command(config_for("/no/such/train.py"), path),
                    Catch::Contains("/no/such/train.py"));
  CHECK_THROWS_WITH(resolve_worker_command(config_for("no-such-program-xyz"), path),
                    Catch::Contains("no-such-program-xyz"));
  CHECK_THROWS_WITH(resolve_worker_command(config_for("./nope"), path), Catch::Contains("./nope"));
  CHECK_THROWS_WITH(
      resolve_worker_command(config_for("m", {}, EntrypointKind::kModule),
                             env_of({{"PATH", "/usr/bin"}, {"PYTHON_EXEC", "/no/python"}})),
      Catch::Contains("/no/python"));
}

TEST_CASE("legacy local rank puts --local_rank=N after the entrypoint") {
  auto path = env_of({{"PATH", "/usr/bin:/bin"}});
  LaunchConfig c = config_for("true", {"a", "b"});
  WorkerCommand command = resolve_worker_command(c, path);
  CHECK(worker_argv(command, c, 1) == std::vector<std::string>{"true", "a", "b"});
  c.legacy_local_rank = true;
  CHECK(worker_argv(command, c, 1) == std::vector<std::string>{"true", "--local_rank=1", "a", "b"});
}

TEST_CASE("find_executable searches PATH in order") {
  CHECK(find_executable("sh", "/nonexistent:/bin") == std::optional<std::string>("/bin/sh"));
  CHECK_FALSE(find_executable("sh", "/nonexistent").has_value());
  CHECK_FALSE(find_executable("", "/bin").has_value());
  ddp::test::TempDir dir;
  auto plain = dir.path() / "plain";
  std::ofstream(plain) << "data\n";
  std::filesystem::permissions(
      plain, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  CHECK_FALSE(find_executable(plain.string(), "").has_value());  // not executable
}

namespace {

std::string write_file(const ddp::test::TempDir& dir, const std::string& name,
                       const std::string& text, bool executable) {
  std::string path = (dir.path() / name).string();
  std::ofstream(path) << text;
  using std::filesystem::perms;
  std::filesystem::permissions(
      path, executable ? perms::owner_all : perms::owner_read | perms::owner_write);
  return path;
}

}  // namespace

TEST_CASE("the entrypoint rule: programs run directly, Python scripts under PYTHON_EXEC -u") {
  ddp::test::TempDir dir;
  auto env = env_of({{"PATH", "/usr/bin:/bin"}, {"PYTHON_EXEC", "/usr/bin/python3"}});
  auto python_argv = [](const std::string& file) {
    return std::vector<std::string>{"/usr/bin/python3", "-u", file};
  };
  // An executable whose shebang names Python, in any of its spellings.
  for (const char* shebang :
       {"#!/usr/bin/python3\n", "#!/usr/bin/env python3\n", "#!/usr/bin/env -S python3.11 -X dev\n",
        "#! /opt/py/bin/python -u\n"}) {
    INFO(shebang);
    std::string script = write_file(dir, "train", std::string(shebang) + "print(1)\n", true);
    CHECK(resolve_worker_command(config_for(script), env).argv == python_argv(script));
  }
  // Other executables (a shell script, a binary) run directly.
  std::string shell = write_file(dir, "run.sh", "#!/bin/sh\necho hi\n", true);
  WorkerCommand direct = resolve_worker_command(config_for(shell, {"x"}), env);
  CHECK(direct.program == shell);
  CHECK(direct.argv == std::vector<std::string>{shell, "x"});
  WorkerCommand binary = resolve_worker_command(config_for("/bin/sh"), env);
  CHECK(binary.argv == std::vector<std::string>{"/bin/sh"});
  // A non-executable text file (no .py) is a Python script, as torchrun would run it.
  std::string plain = write_file(dir, "job", "print('hi')\n", false);
  CHECK(resolve_worker_command(config_for(plain), env).argv == python_argv(plain));
  // A non-executable binary cannot run.
  std::string blob = write_file(dir, "blob",
                                std::string("\x7f"
                                            "ELF\0\0\0",
                                            7),
                                false);
  CHECK_THROWS_WITH(resolve_worker_command(config_for(blob), env),
                    Catch::Contains("neither an executable file nor a text file"));
  // --no_python still runs an executable as itself whatever its shebang.
  std::string py = write_file(dir, "tool", "#!/usr/bin/env python3\n", true);
  CHECK(resolve_worker_command(config_for(py, {}, EntrypointKind::kDirect), env).argv ==
        std::vector<std::string>{py});
}

TEST_CASE("a missing entrypoint says no such file") {
  auto env = env_of({{"PATH", "/usr/bin:/bin"}});
  CHECK_THROWS_WITH(resolve_worker_command(config_for("/no/such/train.py"), env),
                    Catch::Contains("'/no/such/train.py': no such file"));
  CHECK_THROWS_WITH(resolve_worker_command(config_for("/no/such/prog"), env),
                    Catch::Contains("'/no/such/prog': no such file"));
  CHECK_THROWS_WITH(resolve_worker_command(config_for("no-such-program-xyz"), env),
                    Catch::Contains("no such file (nor a program on PATH)"));
  CHECK_THROWS_WITH(
      resolve_worker_command(config_for("/no/such/prog", {}, EntrypointKind::kDirect), env),
      Catch::Contains("no such file"));
}

TEST_CASE("run_path runs the script through ddprun's @record wrapper") {
  ddp::test::TempDir dir;
  std::string script = (dir.path() / "train.py").string();
  std::ofstream(script) << "raise SystemExit(0)\n";
  LaunchConfig c = config_for(script, {"--lr", "1"});
  c.run_path = true;
  WorkerCommand w = resolve_worker_command(c, env_of({{"PATH", "/usr/bin:/bin"}}));
  REQUIRE(w.argv.size() == 8);
  CHECK(w.argv[2] == "-c");
  CHECK(std::vector<std::string>(w.argv.begin() + 4, w.argv.end()) ==
        std::vector<std::string>{"--run_path", script, "--lr", "1"});
}
