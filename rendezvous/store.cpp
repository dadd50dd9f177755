#include <charconv>

#include "ddp/store/store_util.hpp"

namespace ddp::store {

std::optional<std::int64_t> parse_counter(std::string_view text) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

std::string describe_keys(const std::vector<std::string>& keys, std::size_t max_shown) {
  std::string out;
  for (std::size_t i = 0; i < keys.size() && i < max_shown; ++i) {
    if (i > 0) out += ", ";
    out += "'" + keys[i] + "'";
  }
  if (keys.size() > max_shown) out += " (and " + std::to_string(keys.size() - max_shown) + " more)";
  return out;
}

}  // namespace ddp::store
