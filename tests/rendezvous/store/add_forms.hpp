#pragma once
// The stored values ADD meets and what PyTorch's servers (std::stoll) make of them: shared by
// the tests against our server and against PyTorch's own.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::test {

struct AddForm {
  std::string stored;                 // the value SET under the key before ADD(key, 1)
  std::optional<std::int64_t> after;  // ADD's answer; nullopt: the server closes the connection
};

inline std::vector<AddForm> add_forms() {
  using namespace std::string_literals;
  return {
      {"41", 42},
      {"  41", 42},          // leading spaces
      {"\t\n\v\f\r41", 42},  // every C-locale space
      {"+41", 42},           // a plus sign
      {"-43", -42},
      {"41abc", 42},  // trailing non-digits
      {"41 7", 42},
      {"0x10", 1},  // base 10: stops at the x
      {"007", 8},
      {"41"s + '\0' + "99", 42},  // stoll reads a C string: stops at NUL
      {"-9223372036854775808", -9223372036854775807LL},
      {""s, std::nullopt},  // no digits
      {"abc", std::nullopt},
      {"-", std::nullopt},
      {"+-1", std::nullopt},
      {"  ", std::nullopt},
      {'\0' + "41"s, std::nullopt},
      {"99999999999999999999", std::nullopt},  // out of range
  };
}

}  // namespace ddp::test
