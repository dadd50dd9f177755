#pragma once
// Makes every write of one etcd Client verifiable, so that it applies exactly once however
// its answers get lost. The client owns a marker key (prefix + a random id) that only it
// writes. Each write is a transaction that holds only while the marker still has the value
// the client's last write gave it, and that sets it to a fresh token: of all the copies of
// transactions compared against one marker value, at most one can ever apply, and the
// marker's value then names the one that did.
//
// After an answer was lost the client sends a fence: a transaction on the marker alone with
// the same compare. If the fence applies, the lost write never can (its compare no longer
// holds), so it is sent again; if not, the marker names the transaction that applied: the
// lost write (done, with its outcome) or a copy of the fence (send again).
//
// A write whose outcome the caller must learn too (a delete: was a key there?) nests a
// transaction (outcome_txn) whose branches give the marker token + ":1" or token + ":0".
// Not thread-safe: one writer at a time, like the Client. Its I/O is the caller's send.

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace ddp::etcd::detail {

// What a write did: its answer (or, when that was lost, the answer that settled it), whether
// its transaction's compare held, and the marker's outcome suffix (outcome_txn; "" for the
// write's own answer).
struct Written {
  nlohmann::json answer;
  bool succeeded = false;
  std::string outcome;
};

// Sends one transaction; throws EtcdError when no member took it. resend_ok false: sent
// once, over any member, and MemberFailure (http_connection.hpp) when it may have applied;
// true: sent again after any failure, like a read.
using SendTxn = std::function<nlohmann::json(const nlohmann::json& txn, bool resend_ok)>;

class WriteMarker {
 public:
  // key: the marker's key, unique to this client (marker_key() makes one).
  explicit WriteMarker(std::string key);

  const std::string& key() const { return key_; }

  // Applies the transaction build(token) exactly once through send: after a lost answer it
  // sends a fence (again after any failure) and learns from the marker whether the write
  // applied; sends the write again only when it never will (at most 3 times in all). When
  // the fence gets no answer: EtcdError saying the outcome is unknown. what: for messages
  // ("a put of 'k'").
  Written apply(const std::string& what,
                const std::function<nlohmann::json(const std::string&)>& build,
                const SendTxn& send);

  // A token no earlier transaction of this client carried.
  std::string next_token();

  // txn (compare, success, failure) guarded by the marker: its compare added, and a read of
  // the marker appended to the failure branch. The success branch must set the marker
  // (put(token), or an outcome_txn).
  nlohmann::json guard(nlohmann::json txn) const;
  // The request op that sets the marker to value.
  nlohmann::json put(const std::string& value) const;
  // A nested transaction: when compare holds, ops and the marker set to token + ":1";
  // otherwise the marker set to token + ":0".
  nlohmann::json outcome_txn(const nlohmann::json& compare, nlohmann::json ops,
                             const std::string& token) const;
  // A guarded transaction that only sets the marker to token.
  nlohmann::json fence(const std::string& token) const;

  // The marker's value after a guarded transaction carrying token succeeded (its answer).
  static std::string value_after(const nlohmann::json& answer, const std::string& token);
  // The marker's value that a failed guarded transaction read (nullopt: no marker yet).
  std::optional<std::string> value_in(const nlohmann::json& answer) const;
  // Whether the marker value was written by the transaction carrying token; *outcome: what
  // follows "token:" ("" for a plain put).
  static bool carries(const std::string& value, const std::string& token, std::string* outcome);
  // What the marker holds now, as far as this client knows (nullopt: no marker yet).
  const std::optional<std::string>& last() const { return last_; }
  // The marker now holds value (a guarded transaction applied).
  void advance(std::string value) { last_ = std::move(value); }

 private:
  // After the answer to the write carrying token was lost (lost: why): its outcome, or
  // nullopt once a fence made sure it never applies.
  std::optional<Written> settle(const std::string& what, const std::string& token,
                                const std::string& lost, const SendTxn& send);

  std::string key_;
  std::string key_b64_;
  std::optional<std::string> last_;
  std::uint64_t sequence_ = 0;
};

// prefix + 32 random hex digits.
std::string marker_key(const std::string& prefix);

}  // namespace ddp::etcd::detail
