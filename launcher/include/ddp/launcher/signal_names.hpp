#pragma once
// Signal numbers <-> names ("SIGTERM"), as the CLI and the failure report spell them.

#include <optional>
#include <string>
#include <string_view>

namespace ddp::launcher {

// "SIGTERM" for 15; "SIG<n>" for a number without a name.
std::string signal_name(int signal);
// 15 for "SIGTERM"; nullopt for anything else (the SIG prefix is required, as in torchrun).
std::optional<int> signal_number(std::string_view name);

}  // namespace ddp::launcher
