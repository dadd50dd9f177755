#include "ddp/launcher/signal_names.hpp"

#include <csignal>
#include <cstring>

namespace ddp::launcher {

std::string signal_name(int signal) {
  const char* abbrev = signal > 0 && signal < NSIG ? ::sigabbrev_np(signal) : nullptr;
  return abbrev ? "SIG" + std::string(abbrev) : "SIG" + std::to_string(signal);
}

std::optional<int> signal_number(std::string_view name) {
  if (!name.starts_with("SIG")) return std::nullopt;
  name.remove_prefix(3);
  for (int s = 1; s < NSIG; ++s) {
    const char* abbrev = ::sigabbrev_np(s);
    if (abbrev && name == abbrev) return s;
  }
  return std::nullopt;
}

}  // namespace ddp::launcher
