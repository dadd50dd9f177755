#pragma once
// Paths and scratch space shared by the tests.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddp::test {

// build/bin/<name>
std::filesystem::path bin_path(const std::string& name);
// <source tree>/<relative>
std::filesystem::path source_path(const std::string& relative);
// The whole text of a file ("" when it cannot be read).
std::string read_file(const std::filesystem::path& path);
// The interpreter with PyTorch that the interop and parity tests run: the environment variable
// DDP_TEST_PYTHON when set (CTest sets it for the second run of the [torch] tests, against
// DDP_TEST_PYTHON2), else the CMake cache variable DDP_TEST_PYTHON (default Debian's
// /usr/bin/python3 with python3-torch 1.13; a virtualenv's or conda env's python tests against
// another PyTorch). Tag a test case that depends on it "[torch]" so that it runs against both.
std::string torch_python();
// True when torch_python() can import torch with Gloo.
bool torch_available();

// The major and minor version of a PyTorch ("2.11.0+cu128": 2 and 11).
struct TorchVersion {
  int major = 0;
  int minor = 0;
};
// The version of the PyTorch that torch_python() imports, read once per process (the tests
// check what that version does: its store dialect, its keys); nullopt when it imports none.
std::optional<TorchVersion> torch_version();
// How PyTorch's torchrun is started with torch_python(): scripts/torchrun-py311, which is
// torchrun itself on 2.x and fixes 1.13's --redirects/--tee parser on Python 3.11.
std::vector<std::string> torchrun_argv();

// A short timeout for a test, derived from the build: `base` in a normal build, a multiple
// of it under sanitizers (slower code, and `ctest -j` shares the cores), so a wait meant to
// succeed does not time out there by accident. The environment variable DDP_TEST_TIME_FACTOR
// (a whole number >= 1) multiplies it again: scripts/gpu-check sets it for the runs under
// compute-sanitizer, which slows the same binaries down tenfold or more.
std::chrono::milliseconds build_timeout(std::chrono::milliseconds base);
// True in the AddressSanitizer + UndefinedBehaviorSanitizer build of the tests.
bool sanitized_build();

// The exit status (or -1 when killed) and the stdout + stderr of a shell command.
struct ShellResult {
  int status = -1;
  std::string output;
};

// Runs command through /bin/sh, bounded by coreutils `timeout` (killed after
// timeout_seconds, status then 124), and collects its stdout and stderr.
ShellResult run_shell(const std::string& command, int timeout_seconds);

// A TCP port for a server that a test starts at a port it names (ddprun's --master_port or
// --rdzv_endpoint, a store): free on every address when picked; below the kernel's ephemeral
// range, so that no outgoing connection of a concurrent test takes it as its own end before the
// server binds it (a port from bind(0) can be); clear of torchrun's defaults 29400 and 29500;
// and reserved against every other test process for the rest of this one, by a lock file
// under the temp dir (tests/launcher/cli/slurm/run_slurm_test.sh takes the same locks).
// Throws std::runtime_error when no port is left.
int reserve_port();

// A TCP socket listening on 127.0.0.1 at a port the kernel picked, that never accepts or
// answers: the kernel completes connections to it and nobody reads. Stands for a port in
// use, or a server that hangs. Closed on destruction.
class SilentListener {
 public:
  SilentListener();
  ~SilentListener();
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
  std::uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

// Sets environment variables of this process for its lifetime, then puts back what was there
// (the value, or nothing). With clear_prefix, every variable whose name starts with it is
// removed first (and put back after), so that the test sees only `vars` of that kind.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(const std::map<std::string, std::string>& vars,
                             const std::string& clear_prefix = "");
  ~ScopedEnvironment();
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  void save(const std::string& name);
  std::map<std::string, std::optional<std::string>> saved_;  // by name: the value before
};

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace ddp::test
