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
  WorkerCommand m = resolve_worker_command(
      config_for("pkg.train", {"a"}, EntrypointKind::kModule), path);
  CHECK(m.argv == std::vector<std::string>{"python3", "-u", "-m", "pkg.train", "a"});

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
  std::filesystem::permissions(plain, std::filesystem::perms::owner_read |
                                          std::filesystem::perms::owner_write);
  CHECK_FALSE(find_executable(plain.string(), "").has_value());  // not executable
}
