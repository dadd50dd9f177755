#pragma once
// A client of etcd's v3 API through its HTTP/JSON gateway (/v3/kv/range, /v3/kv/put,
// /v3/kv/txn, /v3/kv/deleterange, /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke,
// /v3/watch), over Boost.Beast, with TLS (Boost.Asio SSL on OpenSSL) and etcd's user/password
// auth. Keys and values are bytes (base64 on the wire, as the gateway wants them).
//
// Several members' endpoints may be given: a member that does not answer (connect refused,
// timeout, TLS failure) is skipped for the next, and the client stays on the one that
// answered. When every member fails, the request throws EtcdError naming each endpoint and
// what it said. One Client is used by one thread at a time.
//
// Reads are sent again anywhere after any failure. Every write (put, put_if, remove) applies
// exactly once: it is never simply sent again once it may have reached a member. Each write
// is a transaction guarded by a marker key of this client's own (write_marker.hpp); after a
// lost answer the client learns from the marker whether the write applied, and sends it
// again only when it is sure the first copy never will. The marker key lives at
// ClientOptions::write_marker_prefix + a random id, one per Client (a few bytes left in
// etcd). An answer etcd's JSON cannot explain is EtcdError(kProtocol), never another
// exception type.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/store/store.hpp"

namespace ddp::etcd {

struct Endpoint {
  std::string host;
  int port = 2379;
};

// "h1:p1,h2:p2" (a port-less host gets 2379; [v6]:port accepted). Throws
// std::invalid_argument naming the bad entry.
std::vector<Endpoint> parse_endpoints(const std::string& text);

inline constexpr std::chrono::milliseconds kDefaultConnectTimeout = std::chrono::seconds(2);
inline constexpr std::chrono::milliseconds kDefaultRequestTimeout = std::chrono::seconds(5);

struct ClientOptions {
  std::vector<Endpoint> endpoints;
  bool tls = false;    // protocol=https
  std::string cacert;  // PEM: the CA that signed the members' certificates (TLS)
  std::string cert;    // PEM: this client's certificate (TLS client auth), with key
  std::string key;
  std::string user;  // etcd auth: a token is fetched with /v3/auth/authenticate
  std::string password;
  std::chrono::milliseconds connect_timeout = kDefaultConnectTimeout;  // per member
  std::chrono::milliseconds request_timeout = kDefaultRequestTimeout;  // per request
  std::string write_marker_prefix = "/ddprun/.writes/";  // where this client's marker key lives
};

// Every failure: a StoreError, so that code written against store::Store handles it too.
class EtcdError : public store::StoreError {
 public:
  enum class Kind {
    kUnreachable,   // no member answered (each endpoint and its error are in what())
    kNoQuorum,      // members answer but cannot serve (no leader, request timed out)
    kRefused,       // TLS handshake or certificate failed, auth failed, permission denied
    kLeaseExpired,  // keep_alive on a lease etcd no longer has
    kProtocol,      // an answer we could not understand
  };
  EtcdError(Kind kind, const std::string& what) : store::StoreError(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  std::int64_t count = 0;     // keys in the range (also with keys_only / count_only)
  std::int64_t revision = 0;  // the store's revision when read (header.revision)
};

struct TxnResult {
  bool succeeded = false;           // the compare held and the put was made
  std::int64_t revision = 0;        // header.revision after the transaction
  std::optional<KeyValue> current;  // when it did not: the key as it is now (empty: missing)
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete: key and mod_revision only
};

class Client {
 public:
  // Connects lazily (the first request). Throws EtcdError(kRefused) at once for unreadable
  // PEM files, naming the file.
  explicit Client(ClientOptions options);
  // Deletes this client's write marker (best effort, at most a second): see client.cpp.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // One key, or every key starting with `key` when prefix.
  RangeResult range(const std::string& key, bool prefix = false, bool keys_only = false);
  // Returns the revision of the put (or a later one, when its answer was lost). lease 0:
  // none.
  std::int64_t put(const std::string& key, const std::string& value, std::int64_t lease = 0);
  // Puts when the key's mod_revision is still `mod_revision` (0: the key must not exist), in
  // one transaction that otherwise reads the key.
  TxnResult put_if(const std::string& key, const std::string& value, std::int64_t mod_revision,
                   std::int64_t lease = 0);
  // Number of keys deleted (when the answer was lost and the marker told the outcome: 1 if
  // any was).
  std::int64_t remove(const std::string& key, bool prefix = false);

  // Grants a lease of ttl (etcd may raise it to its minimum); returns {id, granted ttl}.
  struct Lease {
    std::int64_t id = 0;
    std::chrono::seconds ttl{0};
  };
  Lease grant_lease(std::chrono::seconds ttl);
  // Renews the lease once. Throws EtcdError(kLeaseExpired) when etcd no longer has it.
  void keep_alive(std::int64_t lease);
  void revoke(std::int64_t lease);  // best effort on a lease already gone: no throw

  // Watches `key` (or the prefix) from start_revision until at least one event arrives or
  // timeout passes (then: empty). Events come in revision order.
  std::vector<WatchEvent> watch(const std::string& key, bool prefix, std::int64_t start_revision,
                                std::chrono::milliseconds timeout);

  // "host:port" of the member last used (empty before the first request).
  std::string active_endpoint() const;
  // "h1:p1,h2:p2", for messages.
  std::string endpoints_text() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::etcd
