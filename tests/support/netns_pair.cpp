#include "netns_pair.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>
#include <sstream>
#include <stdexcept>

namespace ddp::test {
namespace {

constexpr int kIpTimeoutSeconds = 20;  // one `ip` command, which normally takes milliseconds

std::size_t index_of(NetnsPair::Side side) { return side == NetnsPair::Side::kA ? 0 : 1; }

// Runs an `ip ...` command; throws naming it and its output when it fails.
void ip(const std::string& arguments) {
  ShellResult result = run_shell("ip " + arguments, kIpTimeoutSeconds);
  if (result.status != 0) {
    throw std::runtime_error("`ip " + arguments + "` failed (status " +
                             std::to_string(result.status) + "): " + result.output);
  }
}

// The pid in "ddpA-<pid>-<hex>".
pid_t pid_in_name(const std::string& name) { return std::stoi(name.substr(5)); }

// Deletes pairs whose test process is gone (killed, crashed) before its destructor ran.
void remove_stale_pairs() {
  ShellResult list = run_shell("ip netns list", kIpTimeoutSeconds);
  std::istringstream lines(list.output);
  for (std::string line; std::getline(lines, line);) {
    std::string name = line.substr(0, line.find(' '));  // "ddpA-1-ab (id: 3)"
    if (!is_netns_pair_name(name)) continue;
    pid_t pid = pid_in_name(name);
    if (::kill(pid, 0) != 0 && errno == ESRCH) run_shell("ip netns del " + name, kIpTimeoutSeconds);
  }
}

}  // namespace

bool is_netns_pair_name(const std::string& name) {
  if (name.size() < 8 || name.rfind("ddp", 0) != 0 || (name[3] != 'A' && name[3] != 'B') ||
      name[4] != '-') {
    return false;
  }
  std::size_t dash = name.find('-', 5);
  if (dash == std::string::npos || dash == 5 || dash + 1 == name.size()) return false;
  for (std::size_t i = 5; i < dash; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  return name.find_first_not_of("0123456789abcdef", dash + 1) == std::string::npos;
}

std::optional<std::string> NetnsPair::unavailable_reason() {
  if (::geteuid() != 0) {
    return "network namespaces need root (ip netns add); this test runs as uid " +
           std::to_string(::geteuid());
  }
  if (run_shell("command -v ip", kIpTimeoutSeconds).status != 0) {
    return "iproute2's `ip` is not installed (scripts/setup installs it)";
  }
  try {
    NetnsPair probe;
  } catch (const std::exception& e) {
    return std::string("cannot make two network namespaces with a veth pair here: ") + e.what();
  }
  return std::nullopt;
}

NetnsPair::NetnsPair() {
  std::random_device random;
  char tag[16];
  std::snprintf(tag, sizeof tag, "%06x", random() & 0xffffffu);
  std::string suffix = "-" + std::to_string(::getpid()) + "-" + tag;
  names_[0] = "ddpA" + suffix;
  names_[1] = "ddpB" + suffix;
  std::string subnet = "10.77." + std::to_string(1 + random() % 254) + ".";
  addresses_[0] = subnet + "1";
  addresses_[1] = subnet + "2";
  ShellResult where = run_shell("command -v ip", kIpTimeoutSeconds);
  if (where.status != 0) throw std::runtime_error("iproute2's `ip` is not installed");
  ip_path_ = where.output.substr(0, where.output.find('\n'));
  remove_stale_pairs();
  try {
    create();
  } catch (...) {
    remove();
    throw;
  }
}

NetnsPair::~NetnsPair() { remove(); }

void NetnsPair::create() {
  const std::string& a = names_[0];
  const std::string& b = names_[1];
  ip("netns add " + a);
  ip("netns add " + b);
  // Made inside the namespaces, so the link names never meet the host's own.
  ip("link add veth-a netns " + a + " type veth peer name veth-b netns " + b);
  ip("-n " + a + " addr add " + addresses_[0] + "/24 dev veth-a");
  ip("-n " + b + " addr add " + addresses_[1] + "/24 dev veth-b");
  for (const auto& [ns, link] : {std::pair{a, "veth-a"}, std::pair{b, "veth-b"}}) {
    ip("-n " + ns + " link set lo up");
    ip("-n " + ns + " link set " + link + " up");
  }
}

void NetnsPair::remove() noexcept {
  for (const std::string& name : names_) {
    try {
      run_shell("ip netns del " + name + " 2>/dev/null", kIpTimeoutSeconds);
    } catch (...) {  // popen failed: nothing more can be done from a destructor
    }
  }
}

const std::string& NetnsPair::name(Side side) const { return names_[index_of(side)]; }

const std::string& NetnsPair::address(Side side) const { return addresses_[index_of(side)]; }

std::vector<std::string> NetnsPair::command_in(Side side,
                                               const std::vector<std::string>& argv) const {
  std::vector<std::string> full{ip_path_, "netns", "exec", name(side)};
  full.insert(full.end(), argv.begin(), argv.end());
  return full;
}

ShellResult NetnsPair::run_in(Side side, const std::string& shell_command,
                              int timeout_seconds) const {
  // run_shell quotes for sh -c; the inner sh runs the command inside the namespace.
  std::string quoted = "'";
  for (char c : shell_command) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  return run_shell("ip netns exec " + name(side) + " sh -c " + quoted, timeout_seconds);
}

}  // namespace ddp::test
