#include <charconv>

#include "ddp/store/store_util.hpp"

namespace ddp::store {
namespace {

// isspace() in the C locale, which std::stoll skips before the number.
bool is_c_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

// PyTorch's servers run std::stoll(std::string(value)) and close the connection when it
// throws. stoll reads the C string, so parsing stops at the first NUL byte.
std::optional<std::int64_t> parse_counter(std::string_view text) {
  text = text.substr(0, text.find('\0'));
  std::size_t i = 0;
  while (i < text.size() && is_c_space(text[i])) ++i;
  const bool negative = i < text.size() && text[i] == '-';
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  std::size_t end = i;
  while (end < text.size() && is_digit(text[end])) ++end;
  if (end == i) return std::nullopt;  // stoll: invalid_argument
  // The sign goes with the digits, so that INT64_MIN parses.
  std::int64_t value = 0;
  std::string digits = (negative ? "-" : "") + std::string(text.substr(i, end - i));
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc()) return std::nullopt;  // stoll: out_of_range
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
