#pragma once
// Where a run's RoundState lives, read and written with compare-and-set, like PyTorch's
// RendezvousBackend, under one key of a store: a c10d store (static, c10d) or an EtcdStore
// (etcd), whose compare_set is a transaction that compares the key's revision.

#include <optional>
#include <string>

#include "ddp/store/store.hpp"

namespace ddp::elastic {

class StateBackend {
 public:
  virtual ~StateBackend() = default;

  // The state and a token for set_state; nullopt when no node wrote one yet.
  struct Read {
    std::string bytes;
    std::string token;
  };
  virtual std::optional<Read> get_state() = 0;

  // Writes bytes if the state is still the one `token` came with (nullopt: no state yet).
  // Returns the state after the attempt, its token, and whether this write won.
  struct Write {
    std::string bytes;
    std::string token;
    bool won = false;
  };
  virtual Write set_state(const std::string& bytes, const std::optional<std::string>& token) = 0;
};

// The state under one key of a c10d store ("/ddprun/<run_id>/state"); the token is the value
// itself, as compare_set compares values. Never blocks beyond one store round trip. Throws
// StoreError when the store does.
class StoreStateBackend : public StateBackend {
 public:
  // The store must outlive the backend.
  StoreStateBackend(store::Store& store, std::string key);

  std::optional<Read> get_state() override;
  Write set_state(const std::string& bytes, const std::optional<std::string>& token) override;

 private:
  store::Store& store_;
  std::string key_;
};

}  // namespace ddp::elastic
