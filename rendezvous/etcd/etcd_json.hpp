#pragma once
// The gateway's JSON: keys and values in base64, int64 fields as strings, key ranges as
// [key, range_end).

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ddp/etcd/client.hpp"

namespace ddp::etcd::detail {

std::string base64_encode(std::string_view bytes);
// Throws EtcdError(kProtocol) on text that is not base64.
std::string base64_decode(std::string_view text);

// The end of the range of every key starting with prefix ("\0" for the empty prefix: all).
std::string prefix_range_end(const std::string& prefix);

// An int64 field: "12" (the gateway's form), 12, or absent (0).
std::int64_t int64_field(const nlohmann::json& object, const char* name);

// A mvccpb.KeyValue object.
KeyValue key_value_from_json(const nlohmann::json& kv);

}  // namespace ddp::etcd::detail
