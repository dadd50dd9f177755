#include "test_support.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <vector>

extern char** environ;

namespace ddp::test {
namespace {

// command with each ' written as '\'' so that it survives inside '...'.
std::string quote_for_sh(const std::string& command) {
  std::string out;
  for (char c : command) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out;
}

// The lowest port the kernel hands out for bind(0) and outgoing connections.
int ephemeral_low() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  range >> low;
  return low;
}

// True when a server could listen at port on every address now (SO_REUSEADDR, as ddprun's
// stores and PyTorch's TCPStore set it).
bool can_listen(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

int reserve_port() {
  constexpr int kLowest = 10000;
  const int highest = ephemeral_low() - 1;
  if (highest - kLowest < 1000) {
    throw std::runtime_error("reserve_port: the kernel's ephemeral ports start at " +
                             std::to_string(highest + 1) + ", leaving too few below for tests");
  }
  const auto locks = std::filesystem::temp_directory_path() / "ddp-test-ports";
  std::error_code ec;
  std::filesystem::create_directories(locks, ec);
  std::random_device rd;
  std::uniform_int_distribution<int> pick(kLowest, highest);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = pick(rd);
    if (port >= 29400 && port <= 29600) continue;
    const std::string lock = (locks / (std::to_string(port) + ".lock")).string();
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0 || !can_listen(port)) {
      ::close(fd);
      continue;
    }
    return port;  // fd stays open: the lock holds until this process exits
  }
  throw std::runtime_error("reserve_port: no free port found between " + std::to_string(kLowest) +
                           " and " + std::to_string(highest));
}

std::filesystem::path bin_path(const std::string& name) {
  return std::filesystem::path(DDP_BIN_DIR) / name;
}

std::filesystem::path source_path(const std::string& relative) {
  return std::filesystem::path(DDP_SOURCE_DIR) / relative;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string torch_python() {
  const char* chosen = std::getenv("DDP_TEST_PYTHON");
  return chosen && *chosen ? chosen : DDP_TORCH_PYTHON;
}

ScopedEnvironment::ScopedEnvironment(const std::map<std::string, std::string>& vars,
                                     const std::string& clear_prefix) {
  if (!clear_prefix.empty()) {
    std::vector<std::string> names;
    for (char** e = environ; *e; ++e) {
      std::string entry(*e);
      if (entry.starts_with(clear_prefix)) names.push_back(entry.substr(0, entry.find('=')));
    }
    for (const std::string& name : names) {
      save(name);
      ::unsetenv(name.c_str());
    }
  }
  for (const auto& [name, value] : vars) {
    save(name);
    ::setenv(name.c_str(), value.c_str(), 1);
  }
}

ScopedEnvironment::~ScopedEnvironment() {
  for (const auto& [name, value] : saved_) {
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
}

void ScopedEnvironment::save(const std::string& name) {
  if (saved_.contains(name)) return;
  const char* value = std::getenv(name.c_str());
  saved_[name] = value ? std::optional<std::string>(value) : std::nullopt;
}

bool sanitized_build() { return DDP_TEST_TIME_FACTOR > 1; }

std::chrono::milliseconds build_timeout(std::chrono::milliseconds base) {
  static const int run_factor = [] {
    const char* value = std::getenv("DDP_TEST_TIME_FACTOR");
    const int factor = value ? std::atoi(value) : 1;
    return factor >= 1 ? factor : 1;
  }();
  return base * DDP_TEST_TIME_FACTOR * run_factor;
}

namespace {

// What torch_python() imports, asked once per process (one interpreter start: importing
// torch takes seconds on a loaded machine).
struct TorchProbe {
  std::optional<TorchVersion> version;  // nullopt: no torch
  bool gloo = false;                    // torch.distributed with Gloo
};

const TorchProbe& torch_probe() {
  static const TorchProbe probe = [] {
    TorchProbe p;
    const ShellResult result =
        run_shell(torch_python() +
                      " -c 'import torch; import torch.distributed as d;"
                      " print(int(d.is_available() and d.is_gloo_available()), torch.__version__)'"
                      " 2>/dev/null",
                  120);
    TorchVersion v;
    int gloo = 0;
    if (result.status == 0 &&
        std::sscanf(result.output.c_str(), "%d %d.%d", &gloo, &v.major, &v.minor) == 3) {
      p.version = v;
      p.gloo = gloo == 1;
    }
    return p;
  }();
  return probe;
}

}  // namespace

bool torch_available() { return torch_probe().gloo; }

std::optional<TorchVersion> torch_version() { return torch_probe().version; }

std::vector<std::string> torchrun_argv() {
  return {torch_python(), source_path("scripts/torchrun-py311").string()};
}

ShellResult run_shell(const std::string& command, int timeout_seconds) {
  const std::string full =
      "timeout " + std::to_string(timeout_seconds) + " sh -c '" + quote_for_sh(command) + "' 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(full.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("popen failed for: " + command);
  ShellResult result;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe.get())) > 0;) {
    result.output.append(buffer, n);
  }
  const int raw = pclose(pipe.release());
  result.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return result;
}

SilentListener::SilentListener() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(fd_, 16) != 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::system_error(errno, std::generic_category(), "SilentListener on 127.0.0.1");
  }
  port_ = ntohs(addr.sin_port);
}

SilentListener::~SilentListener() {
  if (fd_ >= 0) ::close(fd_);
}

TempDir::TempDir() {
  std::random_device rd;
  auto base = std::filesystem::temp_directory_path();
  for (;;) {
    path_ = base / ("ddp-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    if (std::filesystem::create_directory(path_)) break;
  }
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace ddp::test
