// libFuzzer target for the store's request parser: any bytes, in any fragmentation, in
// either dialect or sniffed, must never crash it, never make it hold more than the limits
// allow, and every request it completes must re-encode to bytes that parse the same.
//
// Built and run by scripts/fuzz-store (clang only).

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ddp/store/wire_codec.hpp"

using namespace ddp::store;

namespace {

[[noreturn]] void broken(const char* what) {
  __builtin_trap();
  (void)what;
}

void same_request(const Request& a, const Request& b) {
  if (a.command != b.command || a.key_count != b.key_count || a.value_count != b.value_count ||
      a.delta != b.delta || a.u32 != b.u32) {
    broken("re-encoded request differs");
  }
  for (std::size_t i = 0; i < a.key_count; ++i) {
    if (a.key(i) != b.key(i)) broken("key differs");
  }
  for (std::size_t i = 0; i < a.value_count; ++i) {
    if (a.value(i) != b.value(i)) broken("value differs");
  }
}

// Re-encodes a parsed request and parses it again in one piece.
void round_trip(Dialect dialect, const Request& request, const Limits& limits) {
  std::string wire;
  encode_request(dialect, request, wire);
  RequestParser again(limits, dialect);
  auto r = again.feed(wire);
  if (r.status != RequestParser::Status::Complete || r.consumed != wire.size()) {
    broken("re-encoded request does not parse");
  }
  same_request(request, again.request());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  // First byte: dialect choice and small limits; second: fragment size.
  const std::uint8_t mode = data[0];
  const std::size_t chunk = 1 + data[1] % 32;
  std::string_view input(reinterpret_cast<const char*>(data + 2), size - 2);

  Limits limits;
  if (mode & 4) {
    limits.max_key_bytes = 16;
    limits.max_value_bytes = 32;
    limits.max_keys_per_request = 4;
    limits.max_request_bytes = 128;
  }
  std::optional<Dialect> dialect;
  if ((mode & 3) == 1) dialect = Dialect::V1;
  if ((mode & 3) == 2) dialect = Dialect::V2;

  RequestParser parser(limits, dialect);
  while (!input.empty()) {
    std::string_view piece = input.substr(0, chunk);
    auto r = parser.feed(piece);
    if (r.consumed > piece.size()) broken("consumed more than given");
    input.remove_prefix(r.consumed);
    if (r.status == RequestParser::Status::Error) {
      if (parser.error().empty()) broken("error without a reason");
      if (parser.feed("x").status != RequestParser::Status::Error) broken("recovered after error");
      break;
    }
    if (r.status == RequestParser::Status::Complete) {
      const Request& request = parser.request();
      if (request.key_count > limits.max_keys_per_request * 2 + 1) broken("too many keys");
      for (std::size_t i = 0; i < request.key_count; ++i) {
        if (request.key(i).size() > limits.max_key_bytes) broken("key over the limit");
      }
      for (std::size_t i = 0; i < request.value_count; ++i) {
        if (request.value(i).size() > limits.max_value_bytes) broken("value over the limit");
      }
      round_trip(*parser.dialect(), request, limits);
    } else if (r.consumed < piece.size()) {
      broken("needs more but left input unread");
    }
  }
  return 0;
}
