#include "ddp/elastic/state_backend.hpp"

#include <utility>

namespace ddp::elastic {
namespace {

// compare_set with a non-empty expected value on a missing key stores nothing and returns
// that value: a read that never blocks, in one round trip. A state is JSON, never this text.
constexpr std::string_view kProbe = "<ddprun: no state>";

}  // namespace

StoreStateBackend::StoreStateBackend(store::Store& store, std::string key)
    : store_(store), key_(std::move(key)) {}

std::optional<StateBackend::Read> StoreStateBackend::get_state() {
  std::string value = store_.compare_set(key_, kProbe, kProbe);
  if (value == kProbe || value.empty()) return std::nullopt;
  return Read{value, value};
}

StateBackend::Write StoreStateBackend::set_state(const std::string& bytes,
                                                 const std::optional<std::string>& token) {
  std::string value = store_.compare_set(key_, token.value_or(std::string()), bytes);
  return Write{value, value, value == bytes};
}

}  // namespace ddp::elastic
