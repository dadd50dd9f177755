#pragma once
// Small helpers shared by the store implementations.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::store {

// Parses the decimal text ADD keeps under a key ("-12", "0"); nullopt when it is not one.
std::optional<std::int64_t> parse_counter(std::string_view text);

// "k1, k2 (and 3 more)": keys for an error message, cut after a few.
std::string describe_keys(const std::vector<std::string>& keys, std::size_t max_shown = 8);

}  // namespace ddp::store
