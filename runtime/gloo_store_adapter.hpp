#pragma once
// Lets Gloo's rendezvous (connectFullMesh) run over our store.

#include <gloo/rendezvous/store.h>

#include <map>
#include <memory>

#include "ddp/store/store.hpp"

namespace ddp::detail {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  // `store` must outlive the adapter; `timeout` bounds every wait Gloo asks for without one.
  GlooStoreAdapter(store::Store& store, std::chrono::milliseconds timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The values Gloo read, by key (its mesh's addresses: key "<rank>", every pair's address
  // of that rank).
  const std::map<std::string, std::vector<char>>& got() const { return got_; }

 private:
  store::Store& store_;
  std::chrono::milliseconds timeout_;
  std::map<std::string, std::vector<char>> got_;
};

}  // namespace ddp::detail
