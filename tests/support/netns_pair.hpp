#pragma once
// Two "hosts" on one machine for multi-node tests: network namespaces A and B joined by a veth
// pair, A at 10.77.N.1/24 and B at 10.77.N.2/24, each with its loopback up. The addresses
// exist only inside the two namespaces, so nothing a test sends to them leaves the pair.
// Needs root (CI runs as root) and iproute2's `ip`; where that is missing, tests skip with
// unavailable_reason().

#include <optional>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace ddp::test {

class NetnsPair {
 public:
  enum class Side { kA, kB };

  // Why a pair cannot be made here (not root, no `ip`, namespaces or veth refused), or
  // nullopt when it can: tries to make one and removes it again.
  static std::optional<std::string> unavailable_reason();

  // Creates both namespaces with names unique to this pair ("ddpA-<pid>-<hex>"), the veth
  // pair and the addresses, after removing pairs left by test processes that died before
  // their destructor ran. Throws std::runtime_error naming the `ip` command that failed and
  // what it printed; whatever was already made is removed first.
  NetnsPair();
  // Deletes both namespaces, which removes the veth pair. Processes still inside keep their
  // namespace until they exit: stop them first.
  ~NetnsPair();
  NetnsPair(const NetnsPair&) = delete;
  NetnsPair& operator=(const NetnsPair&) = delete;

  const std::string& name(Side side) const;     // the namespace: "ddpA-1234-9f3a01"
  const std::string& address(Side side) const;  // "10.77.N.1" (A) or "10.77.N.2" (B)

  // argv, run inside side's namespace: {"/usr/sbin/ip", "netns", "exec", name, argv...} (ip
  // by its full path, for execve). `ip netns exec` replaces itself with the command, so the
  // child's pid is the command's; argv[0] is looked up on PATH.
  std::vector<std::string> command_in(Side side, const std::vector<std::string>& argv) const;
  // A shell command run inside side's namespace, bounded as run_shell.
  ShellResult run_in(Side side, const std::string& shell_command, int timeout_seconds) const;

 private:
  void create();
  void remove() noexcept;

  std::string ip_path_;  // where `ip` is, for command_in
  std::string names_[2];
  std::string addresses_[2];
};

// "ddpA-1234-9f3a01": names of pairs this helper made; the pid is the test process's.
bool is_netns_pair_name(const std::string& name);

}  // namespace ddp::test
