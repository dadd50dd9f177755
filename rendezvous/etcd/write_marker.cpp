#include "write_marker.hpp"

#include <cstdio>
#include <random>

#include "etcd_json.hpp"
#include "http_connection.hpp"

namespace ddp::etcd::detail {

using nlohmann::json;
using Kind = EtcdError::Kind;

// How often a write is sent whose answer got lost and that then did not apply.
constexpr int kMaxSends = 3;

WriteMarker::WriteMarker(std::string key) : key_(std::move(key)), key_b64_(base64_encode(key_)) {}

std::string WriteMarker::next_token() { return std::to_string(++sequence_); }

json WriteMarker::guard(json txn) const {
  json compare = {{"key", key_b64_}, {"result", "EQUAL"}};
  if (last_) {
    compare["target"] = "VALUE";
    compare["value"] = base64_encode(*last_);
  } else {
    compare["target"] = "CREATE";
    compare["create_revision"] = "0";
  }
  if (!txn.contains("compare")) txn["compare"] = json::array();
  if (!txn.contains("failure")) txn["failure"] = json::array();
  txn["compare"].push_back(compare);
  txn["failure"].push_back({{"request_range", {{"key", key_b64_}}}});
  return txn;
}

json WriteMarker::put(const std::string& value) const {
  return {{"request_put", {{"key", key_b64_}, {"value", base64_encode(value)}}}};
}

json WriteMarker::outcome_txn(const json& compare, json ops, const std::string& token) const {
  ops.push_back(put(token + ":1"));
  return {{"request_txn",
           {{"compare", json::array({compare})},
            {"success", std::move(ops)},
            {"failure", json::array({put(token + ":0")})}}}};
}

json WriteMarker::fence(const std::string& token) const {
  return guard({{"success", json::array({put(token)})}});
}

std::string WriteMarker::value_after(const json& answer, const std::string& token) {
  const json responses = answer.value("responses", json::array());
  if (!responses.empty() && responses.front().contains("response_txn")) {
    bool held = responses.front()["response_txn"].value("succeeded", false);
    return token + (held ? ":1" : ":0");
  }
  return token;
}

std::optional<std::string> WriteMarker::value_in(const json& answer) const {
  for (const json& response : answer.value("responses", json::array())) {
    const json range = response.value("response_range", json::object());
    for (const json& kv : range.value("kvs", json::array())) {
      KeyValue read = key_value_from_json(kv);
      if (read.key == key_) return read.value;
    }
  }
  return std::nullopt;
}

bool WriteMarker::carries(const std::string& value, const std::string& token,
                          std::string* outcome) {
  if (value == token) {
    outcome->clear();
    return true;
  }
  if (value.size() > token.size() && value.compare(0, token.size(), token) == 0 &&
      value[token.size()] == ':') {
    *outcome = value.substr(token.size() + 1);
    return true;
  }
  return false;
}

Written WriteMarker::apply(const std::string& what,
                           const std::function<json(const std::string&)>& build,
                           const SendTxn& send) {
  for (int attempt = 0;; ++attempt) {
    std::string token = next_token();
    json answer;
    try {
      answer = send(guard(build(token)), false);
    } catch (const MemberFailure& failure) {  // sent, and it may have applied
      if (auto written = settle(what, token, failure.what(), send)) return *written;
      if (attempt + 1 >= kMaxSends) {
        throw EtcdError(failure.kind(),
                        "etcd lost the answer to " + what + " " + std::to_string(kMaxSends) +
                            " times; it did not apply (last: " + failure.what() + ")");
      }
      continue;  // the fence applied first: this write never will; send it again
    }
    if (answer.value("succeeded", false)) {
      advance(value_after(answer, token));
      return {answer, true, ""};
    }
    auto value = value_in(answer);
    if (value == last_) return {answer, false, ""};  // the caller's compare failed
    // The marker moved on without this client knowing: a write whose outcome was reported
    // unknown applied after all. Take its value and send this one again.
    if (!value || attempt + 1 >= kMaxSends) {
      throw EtcdError(Kind::kProtocol, "etcd: the write marker " + key_ +
                                           " of this client changed under it while writing " +
                                           what + "; does another client use its key?");
    }
    advance(*value);
  }
}

std::optional<Written> WriteMarker::settle(const std::string& what, const std::string& token,
                                           const std::string& lost, const SendTxn& send) {
  // Every copy of the fence carries one token and compares the same value: it may be sent
  // again anywhere (at most one copy applies), so it rides out an election like a read.
  std::string fence = next_token();
  json answer;
  try {
    answer = send(this->fence(fence), true);
  } catch (const EtcdError& e) {
    throw EtcdError(e.kind(), "etcd's answer to " + what + " was lost (" + lost +
                                  "), and whether it applied could not be learnt: " + e.what());
  }
  if (answer.value("succeeded", false)) {
    advance(fence);
    return std::nullopt;
  }
  auto value = value_in(answer);
  std::string outcome;
  if (value && carries(*value, token, &outcome)) {
    advance(*value);
    return Written{answer, true, outcome};
  }
  if (value && *value == fence) {  // an earlier copy of the fence applied
    advance(*value);
    return std::nullopt;
  }
  throw EtcdError(Kind::kProtocol, "etcd: the write marker " + key_ +
                                       " of this client holds a value it never wrote while "
                                       "settling " +
                                       what + "; does another client use its key?");
}

std::string marker_key(const std::string& prefix) {
  std::random_device device;
  std::string key = prefix;
  for (int i = 0; i < 4; ++i) {
    char part[9];
    std::snprintf(part, sizeof part, "%08x", static_cast<unsigned>(device()));
    key += part;
  }
  return key;
}

}  // namespace ddp::etcd::detail
