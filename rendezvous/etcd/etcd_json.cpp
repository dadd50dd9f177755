#include "etcd_json.hpp"

#include <openssl/evp.h>

namespace ddp::etcd::detail {

std::string base64_encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::string base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) {
    throw EtcdError(EtcdError::Kind::kProtocol, "etcd sent a key or value that is not base64");
  }
  std::string out(3 * (text.size() / 4) + 1, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0) {
    throw EtcdError(EtcdError::Kind::kProtocol, "etcd sent a key or value that is not base64");
  }
  // EVP_DecodeBlock counts the '=' padding as zero bytes.
  std::size_t padding = 0;
  if (!text.empty() && text.back() == '=') ++padding;
  if (text.size() > 1 && text[text.size() - 2] == '=') ++padding;
  out.resize(static_cast<std::size_t>(n) - padding);
  return out;
}

std::string prefix_range_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

std::int64_t int64_field(const nlohmann::json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return 0;
  try {
    if (it->is_string()) return std::stoll(it->get<std::string>());
    if (it->is_number()) return it->get<std::int64_t>();
  } catch (const std::exception&) {
  }
  throw EtcdError(EtcdError::Kind::kProtocol, std::string("etcd sent field '") + name +
                                                  "' that is not an integer: " + it->dump());
}

KeyValue key_value_from_json(const nlohmann::json& kv) {
  KeyValue out;
  out.key = base64_decode(kv.value("key", ""));
  out.value = base64_decode(kv.value("value", ""));
  out.create_revision = int64_field(kv, "create_revision");
  out.mod_revision = int64_field(kv, "mod_revision");
  out.version = int64_field(kv, "version");
  out.lease = int64_field(kv, "lease");
  return out;
}

}  // namespace ddp::etcd::detail
