#pragma once
// Small helpers shared by the store implementations.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::store {

// Parses the value under a key that ADD adds to exactly as PyTorch's servers do (std::stoll):
// leading C-locale whitespace, an optional '+' or '-', at least one decimal digit, and
// anything after the digits (or from the first NUL byte on) ignored: " +12abc" is 12.
// nullopt where stoll throws: no digits ("", "abc", "-") or a number outside int64.
std::optional<std::int64_t> parse_counter(std::string_view text);

// "k1, k2 (and 3 more)": keys for an error message, cut after a few.
std::string describe_keys(const std::vector<std::string>& keys, std::size_t max_shown = 8);

}  // namespace ddp::store
