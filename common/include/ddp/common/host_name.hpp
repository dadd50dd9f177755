#pragma once
// This machine's name: the one helper of launcher/ and runtime/ (a private, header-only
// include of both; not installed).

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <string>

namespace ddp {

// gethostname(), or "localhost" when it fails.
inline std::string host_name() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0 || name[0] == '\0') return "localhost";
  return name.data();
}

// The fully qualified name, as Python's socket.getfqdn() (what torchrun's failure report
// shows as `host`): the canonical name the resolver gives for host_name() when it has a
// dot, else host_name(). May consult the resolver: call it once, not in a loop.
inline std::string fully_qualified_host_name() {
  const std::string name = host_name();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_flags = AI_CANONNAME;
  addrinfo* result = nullptr;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &result) != 0) return name;
  std::string canonical = result && result->ai_canonname ? result->ai_canonname : "";
  ::freeaddrinfo(result);
  return canonical.find('.') != std::string::npos ? canonical : name;
}

}  // namespace ddp
