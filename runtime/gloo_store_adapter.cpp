#include "gloo_store_adapter.hpp"

namespace ddp::detail {

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_.set(key, std::string_view(data.data(), data.size()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  store_.wait({key}, timeout_);
  const std::string value = store_.get(key);
  std::vector<char> bytes(value.begin(), value.end());
  got_[key] = bytes;
  return bytes;
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { store_.wait(keys, timeout_); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  store_.wait(keys, timeout);
}

}  // namespace ddp::detail
