#include "ddp/etcd/client.hpp"

#include <algorithm>
#include <boost/asio/ssl/context.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <thread>

#include "etcd_json.hpp"
#include "http_connection.hpp"
#include "tls_context.hpp"
#include "write_marker.hpp"

namespace ddp::etcd {
namespace {

using detail::Clock;
using detail::MemberFailure;
using nlohmann::json;
using Kind = EtcdError::Kind;

// Between two rounds over every member while none has a leader: etcd elects one within
// about its election timeout (1 s by default).
constexpr auto kElectionRetryInterval = std::chrono::milliseconds(100);

// gRPC status codes the gateway passes on.
constexpr int kGrpcUnknown = 2;
constexpr int kGrpcInvalidArgument = 3;
constexpr int kGrpcDeadlineExceeded = 4;
constexpr int kGrpcNotFound = 5;
constexpr int kGrpcPermissionDenied = 7;
constexpr int kGrpcFailedPrecondition = 9;
constexpr int kGrpcUnavailable = 14;
constexpr int kGrpcUnauthenticated = 16;

// Runs f, which reads an answer; a JSON type error in it (a field of another type than etcd
// sends) becomes EtcdError(kProtocol) naming what was asked.
template <class F>
auto reading(const std::string& what, F f) -> decltype(f()) {
  try {
    return f();
  } catch (const json::exception& e) {
    throw EtcdError(Kind::kProtocol, "etcd answered " + what +
                                         " with JSON this client cannot read (" + e.what() +
                                         "); is the endpoint an etcd v3 member (3.4 or later)?");
  }
}

// The JSON object of an answer: the first line (streamed answers send one object a line),
// unwrapped from a stream's {"result": ...}.
json parse_answer(const std::string& body, bool* ok) {
  json parsed = json::parse(body.substr(0, body.find('\n')), nullptr, false);
  *ok = !parsed.is_discarded() && parsed.is_object();
  return parsed;
}

}  // namespace

struct Client::Impl {
  explicit Impl(ClientOptions o)
      : options(std::move(o)), marker(detail::marker_key(options.write_marker_prefix)) {
    if (options.endpoints.empty()) throw std::invalid_argument("etcd client: no endpoint given");
    if (options.tls) tls = detail::make_tls_context(options);
  }

  std::string name(std::size_t i) const { return detail::endpoint_name(options.endpoints[i]); }

  // Runs attempt(member index) on the active member, then on each other one while it throws
  // MemberFailure. When all fail and some member runs without a leader (an election under
  // way after the leader died), all are tried again until request_timeout has passed. Then
  // EtcdError naming every member and what it said. Not idempotent (a write): a failure
  // that may have applied it is rethrown at once, to be settled by write().
  template <class Attempt>
  auto with_failover(const std::string& what, Attempt attempt, bool idempotent = true)
      -> decltype(attempt(0)) {
    auto deadline = Clock::now() + options.request_timeout;
    while (true) {
      std::string failures;
      int rank = -1;  // the most telling failure: unreachable < quorum < protocol < refused
      Kind kind = Kind::kUnreachable;
      std::size_t n = options.endpoints.size();
      for (std::size_t tried = 0; tried < n; ++tried) {
        std::size_t i = (active + tried) % n;
        try {
          auto result = attempt(i);
          active = i;
          used = true;
          return result;
        } catch (const MemberFailure& failure) {
          if (!idempotent && failure.maybe_applied()) {
            active = i;
            throw;
          }
          failures += (failures.empty() ? "" : "; ") + name(i) + ": " + failure.what();
          int r = failure_rank(failure.kind());
          if (r > rank) {
            rank = r;
            kind = failure.kind();
          }
        }
      }
      if (kind != Kind::kNoQuorum || Clock::now() + kElectionRetryInterval >= deadline) {
        throw EtcdError(kind, failure_headline(kind, what) + failures);
      }
      std::this_thread::sleep_for(kElectionRetryInterval);
    }
  }

  static int failure_rank(Kind kind) {
    switch (kind) {
      case Kind::kUnreachable:
        return 0;
      case Kind::kNoQuorum:
        return 1;
      case Kind::kProtocol:
        return 2;
      default:
        return 3;
    }
  }

  std::string failure_headline(Kind kind, const std::string& what) const {
    std::string members = " (members " + endpoints_text() + "): ";
    switch (kind) {
      case Kind::kNoQuorum:
        return "etcd lost its quorum: no member could serve " + what +
               ", a majority of the members must run" + members;
      case Kind::kRefused:
        return "etcd refused " + what + members;
      case Kind::kProtocol:
        return "etcd answered " + what + " with something this client cannot read" + members;
      default:
        return "etcd unreachable: no member answered " + what +
               "; check that etcd runs there (--rdzv_endpoint)" + members;
    }
  }

  std::string endpoints_text() const {
    std::string text;
    for (std::size_t i = 0; i < options.endpoints.size(); ++i) {
      text += (i ? "," : "") + name(i);
    }
    return text;
  }

  detail::HttpConnection& connection_to(std::size_t i) {
    if (connection && connection_index == i && connection->is_open()) return *connection;
    connection = std::make_unique<detail::HttpConnection>(io, tls.get(), options.endpoints[i],
                                                          options.cacert);
    connection_index = i;
    connection->connect(options.connect_timeout);
    return *connection;
  }

  // POST path on member i (the kept-alive connection, or a new one), authenticated.
  // idempotent: may be sent again after it was all written.
  json call_member(std::size_t i, const std::string& path, const std::string& body,
                   bool idempotent) {
    auto deadline = Clock::now() + options.request_timeout;
    detail::HttpConnection* c = &connection_to(i);
    bool reused = c->used();
    try {
      return post_authenticated(*c, path, body, deadline);
    } catch (const MemberFailure& failure) {
      if (!reused || failure.kind() != Kind::kUnreachable) throw;
      if (!idempotent && failure.maybe_applied()) throw;
    }
    // The member closed the kept-alive connection meanwhile: once more on a new one.
    c = &connection_to(i);
    return post_authenticated(*c, path, body, deadline);
  }

  // A read (or an idempotent request): sent again anywhere after any failure.
  json call(const std::string& path, const json& body) {
    std::string text = body.dump();
    return with_failover(path, [&](std::size_t i) { return call_member(i, path, text, true); });
  }

  // One transaction, never sent twice: throws MemberFailure when it may have applied.
  json send_txn(const json& txn) {
    std::string text = txn.dump();
    return with_failover(
        "/v3/kv/txn", [&](std::size_t i) { return call_member(i, "/v3/kv/txn", text, false); },
        false);
  }

  // Applies the transaction build(token) exactly once (write_marker.hpp); what: for messages.
  detail::Written write(const std::string& what,
                        const std::function<json(const std::string&)>& build) {
    return marker.apply(what, build, [this](const json& txn, bool resend_ok) {
      return resend_ok ? call("/v3/kv/txn", txn) : send_txn(txn);
    });
  }

  json post_authenticated(detail::HttpConnection& c, const std::string& path,
                          const std::string& body, Clock::time_point deadline) {
    if (needs_token()) authenticate(c, deadline);
    try {
      return answer_of(c, c.post(path, body, token, deadline), path);
    } catch (const EtcdError& e) {
      if (token.empty() || e.kind() != Kind::kRefused || !expired_token) throw;
    }
    // The token expired (etcd drops simple tokens after a while): fetch a new one, once.
    expired_token = false;
    token.clear();
    authenticate(c, deadline);
    return answer_of(c, c.post(path, body, token, deadline), path);
  }

  bool needs_token() const { return !options.user.empty() && token.empty() && !auth_disabled; }

  void authenticate(detail::HttpConnection& c, Clock::time_point deadline) {
    json request = {{"name", options.user}, {"password", options.password}};
    try {
      json answer = answer_of(c, c.post("/v3/auth/authenticate", request.dump(), "", deadline),
                              "/v3/auth/authenticate");
      token = answer.value("token", "");
    } catch (const EtcdError& e) {
      if (std::string(e.what()).find("authentication is not enabled") == std::string::npos) throw;
      auth_disabled = true;  // the cluster does not check users: nothing to send
    }
  }

  // The JSON of a successful answer; throws MemberFailure (another member may serve) or
  // EtcdError (none would) for an error.
  json answer_of(detail::HttpConnection& c, const detail::HttpReply& reply,
                 const std::string& path) {
    bool ok = false;
    json answer = parse_answer(reply.body, &ok);
    if (!ok) {
      std::string text = reply.body.substr(0, 200);
      if (text.find("HTTPS server") != std::string::npos) {
        throw MemberFailure(Kind::kRefused, "the member serves only TLS (" + text +
                                                "): use protocol=https with cacert=");
      }
      throw MemberFailure(
          Kind::kProtocol,
          "HTTP " + std::to_string(reply.status) + " with a body that is not etcd's JSON: " + text,
          true);
    }
    if (reply.status == 200 && !answer.contains("error")) {
      return answer.contains("result") ? answer["result"] : answer;
    }
    try {
      throw_error(c, reply.status, answer, path);
    } catch (const json::exception& e) {  // an error whose fields are not etcd's types
      throw MemberFailure(Kind::kProtocol,
                          "HTTP " + std::to_string(reply.status) +
                              " with an error this client cannot read (" + e.what() +
                              "): " + reply.body.substr(0, 200),
                          true);
    }
  }

  [[noreturn]] void throw_error(detail::HttpConnection& c, int status, const json& answer,
                                const std::string& path) {
    int code = 0;
    std::string message;
    const json& error = answer.contains("error") ? answer["error"] : json();
    if (error.is_object()) {  // a stream's {"error":{"grpc_code":..,"message":..}}
      code = error.value("grpc_code", 0);
      message = error.value("message", "");
    } else {
      code = answer.value("code", 0);
      message = answer.value("message", error.is_string() ? error.get<std::string>() : "");
    }
    std::string where = "etcd at " + c.name() + " answered " + path + ": " + message;
    if (code == kGrpcUnavailable || status == 503 || code == kGrpcDeadlineExceeded ||
        (code == kGrpcUnknown && message.find("deadline exceeded") != std::string::npos)) {
      // "no leader" refuses before proposing; a timeout may still commit what it proposed.
      bool refused = message.find("no leader") != std::string::npos;
      throw MemberFailure(Kind::kNoQuorum, message, !refused);
    }
    if (code == kGrpcUnauthenticated) {
      expired_token = message.find("invalid auth token") != std::string::npos;
      throw EtcdError(Kind::kRefused, where + " (check user= and password=)");
    }
    if (code == kGrpcPermissionDenied) {
      throw EtcdError(Kind::kRefused, where + " (the user '" + options.user +
                                          "' lacks a role that may use these keys)");
    }
    if (code == kGrpcInvalidArgument &&
        message.find("authentication failed") != std::string::npos) {
      throw EtcdError(Kind::kRefused, where + " (check user= and password=)");
    }
    if (code == kGrpcInvalidArgument && message.find("user name is empty") != std::string::npos) {
      throw EtcdError(Kind::kRefused, where + " (etcd checks users: give user= and password=)");
    }
    if (code == kGrpcNotFound && message.find("lease not found") != std::string::npos) {
      throw EtcdError(Kind::kLeaseExpired, where);
    }
    if (code == kGrpcFailedPrecondition) throw EtcdError(Kind::kProtocol, where);
    throw EtcdError(Kind::kProtocol, where + " (HTTP " + std::to_string(status) + ", code " +
                                         std::to_string(code) + ")");
  }

  std::vector<WatchEvent> watch_member(std::size_t i, const std::string& body,
                                       Clock::time_point deadline);
  std::vector<WatchEvent> watch_line(detail::HttpConnection& c, const std::string& line);

  ClientOptions options;
  boost::asio::io_context io{1};
  std::unique_ptr<boost::asio::ssl::context> tls;
  std::unique_ptr<detail::HttpConnection> connection;  // to members[connection_index]
  std::size_t connection_index = 0;
  std::size_t active = 0;  // the member that answered last
  bool used = false;
  detail::WriteMarker marker;  // guards every write (write_marker.hpp)
  std::string token;           // etcd auth token (user/password)
  bool auth_disabled = false;
  bool expired_token = false;
};

std::vector<WatchEvent> Client::Impl::watch_member(std::size_t i, const std::string& body,
                                                   Clock::time_point deadline) {
  detail::HttpConnection c(io, tls.get(), options.endpoints[i], options.cacert);
  c.connect(options.connect_timeout);
  auto setup_deadline = Clock::now() + options.request_timeout;
  if (needs_token()) authenticate(c, setup_deadline);
  int status = c.start_stream("/v3/watch", body, token, setup_deadline);
  std::string pending;
  if (status != 200) {
    try {
      while (auto piece = c.read_stream(setup_deadline)) pending += *piece;
    } catch (const MemberFailure&) {  // the end of the error's body
    }
    answer_of(c, detail::HttpReply{status, pending}, "/v3/watch");
    throw MemberFailure(Kind::kProtocol, "HTTP " + std::to_string(status) + " to /v3/watch");
  }
  while (true) {
    auto piece = c.read_stream(deadline);
    if (!piece) return {};  // nothing happened in time
    pending += *piece;
    for (auto nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n')) {
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      auto events = watch_line(c, line);
      if (!events.empty()) return events;
    }
  }
}

// One message of a watch stream: its events (none for "created" and progress messages).
std::vector<WatchEvent> Client::Impl::watch_line(detail::HttpConnection& c,
                                                 const std::string& line) {
  json result = answer_of(c, detail::HttpReply{200, line}, "/v3/watch");
  if (result.value("canceled", false)) {
    throw EtcdError(Kind::kProtocol,
                    "etcd at " + c.name() + " canceled the watch: " +
                        result.value("cancel_reason", std::string()) + " (compact revision " +
                        std::to_string(detail::int64_field(result, "compact_revision")) + ")");
  }
  std::vector<WatchEvent> events;
  for (const json& e : result.value("events", json::array())) {
    WatchEvent event;
    event.type =
        e.value("type", "PUT") == "DELETE" ? WatchEvent::Type::kDelete : WatchEvent::Type::kPut;
    event.kv = detail::key_value_from_json(e.value("kv", json::object()));
    events.push_back(std::move(event));
  }
  return events;
}

Client::Client(ClientOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

// The write marker is this client's alone (write_marker.hpp): it goes with the client, so
// that a job leaves no key behind. Best effort and bounded: one request over the connection
// still open to the member that answered last, at most kMarkerCleanupTimeout; a client that
// lost etcd (no open connection) or was killed leaves its marker (one small key).
Client::~Client() {
  constexpr std::chrono::milliseconds kMarkerCleanupTimeout{1000};
  if (!impl_ || !impl_->marker.last() || !impl_->connection || !impl_->connection->is_open()) {
    return;
  }
  try {
    impl_->options.request_timeout =
        std::min(impl_->options.request_timeout, kMarkerCleanupTimeout);
    json request = {{"key", detail::base64_encode(impl_->marker.key())}};
    impl_->call_member(impl_->connection_index, "/v3/kv/deleterange", request.dump(), true);
  } catch (const std::exception&) {  // etcd went away meanwhile: the marker stays
  }
}

namespace {

json key_request(const std::string& key, bool prefix) {
  // The empty key stands for "from the first key" only with a range end.
  json request = {
      {"key", detail::base64_encode(key.empty() && prefix ? std::string(1, '\0') : key)}};
  if (prefix) request["range_end"] = detail::base64_encode(detail::prefix_range_end(key));
  return request;
}

std::int64_t header_revision(const json& answer) {
  return detail::int64_field(answer.value("header", json::object()), "revision");
}

}  // namespace

RangeResult Client::range(const std::string& key, bool prefix, bool keys_only) {
  json request = key_request(key, prefix);
  if (keys_only) request["keys_only"] = true;
  return reading("/v3/kv/range of '" + key + "'", [&] {
    json answer = impl_->call("/v3/kv/range", request);
    RangeResult result;
    for (const json& kv : answer.value("kvs", json::array())) {
      result.kvs.push_back(detail::key_value_from_json(kv));
    }
    result.count = detail::int64_field(answer, "count");
    result.revision = header_revision(answer);
    return result;
  });
}

namespace {

json put_request(const std::string& key, const std::string& value, std::int64_t lease) {
  json put = {{"key", detail::base64_encode(key)}, {"value", detail::base64_encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  return {{"request_put", put}};
}

}  // namespace

std::int64_t Client::put(const std::string& key, const std::string& value, std::int64_t lease) {
  std::string what = "a put of '" + key + "'";
  return reading(what, [&] {
    auto written = impl_->write(what, [&](const std::string& token) {
      return json{
          {"success", json::array({put_request(key, value, lease), impl_->marker.put(token)})}};
    });
    return header_revision(written.answer);
  });
}

TxnResult Client::put_if(const std::string& key, const std::string& value,
                         std::int64_t mod_revision, std::int64_t lease) {
  std::string k = detail::base64_encode(key);
  json compare = {{"key", k}, {"result", "EQUAL"}};
  if (mod_revision == 0) {
    compare["target"] = "CREATE";
    compare["create_revision"] = "0";
  } else {
    compare["target"] = "MOD";
    compare["mod_revision"] = std::to_string(mod_revision);
  }
  std::string what = "a transaction on '" + key + "'";
  return reading(what, [&] {
    auto written = impl_->write(what, [&](const std::string& token) {
      return json{
          {"compare", json::array({compare})},
          {"success", json::array({put_request(key, value, lease), impl_->marker.put(token)})},
          {"failure", json::array({{{"request_range", {{"key", k}}}}})}};
    });
    TxnResult result;
    result.succeeded = written.succeeded;
    result.revision = header_revision(written.answer);
    if (!result.succeeded) {
      for (const json& response : written.answer.value("responses", json::array())) {
        json range = response.value("response_range", json::object());
        for (const json& kv : range.value("kvs", json::array())) {
          KeyValue read = detail::key_value_from_json(kv);
          if (read.key == key) result.current = std::move(read);
        }
      }
    }
    return result;
  });
}

std::int64_t Client::remove(const std::string& key, bool prefix) {
  std::string what = "a delete of '" + key + "'" + (prefix ? " (prefix)" : "");
  json request = key_request(key, prefix);
  // Holds when a key is there to delete (for a prefix: any key under it).
  json exists = {{"key", request["key"]},
                 {"target", "CREATE"},
                 {"result", "GREATER"},
                 {"create_revision", "0"}};
  if (prefix) exists["range_end"] = request["range_end"];
  return reading(what, [&] {
    auto written = impl_->write(what, [&](const std::string& token) {
      json ops = json::array({{{"request_delete_range", request}}});
      return json{{"success", json::array({impl_->marker.outcome_txn(exists, ops, token)})}};
    });
    if (written.outcome == "0") return std::int64_t{0};
    if (written.outcome == "1") return std::int64_t{1};  // settled after a lost answer
    // This answer's own count: success -> response_txn -> responses[0] -> the delete.
    json nested = written.answer["responses"][0]["response_txn"];
    if (!nested.value("succeeded", false)) return std::int64_t{0};
    return detail::int64_field(nested["responses"][0]["response_delete_range"], "deleted");
  });
}

Client::Lease Client::grant_lease(std::chrono::seconds ttl) {
  json answer = impl_->call("/v3/lease/grant", {{"TTL", std::to_string(ttl.count())}});
  return reading("/v3/lease/grant", [&] {
    std::string error = answer.value("error", "");
    if (!error.empty()) {
      throw EtcdError(Kind::kProtocol, "etcd did not grant a lease of " +
                                           std::to_string(ttl.count()) + " s: " + error);
    }
    Lease lease;
    lease.id = detail::int64_field(answer, "ID");
    lease.ttl = std::chrono::seconds(detail::int64_field(answer, "TTL"));
    return lease;
  });
}

void Client::keep_alive(std::int64_t lease) {
  json answer = reading("/v3/lease/keepalive", [&] {
    return impl_->call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}});
  });
  if (detail::int64_field(answer, "TTL") <= 0) {
    throw EtcdError(Kind::kLeaseExpired, "etcd no longer has lease " + std::to_string(lease) +
                                             ": it expired (not renewed within its TTL)");
  }
}

void Client::revoke(std::int64_t lease) {
  try {
    reading("/v3/lease/revoke", [&] {
      return impl_->call("/v3/lease/revoke", {{"ID", std::to_string(lease)}});
    });
  } catch (const EtcdError& e) {
    if (e.kind() != Kind::kLeaseExpired) throw;
  }
}

std::vector<WatchEvent> Client::watch(const std::string& key, bool prefix,
                                      std::int64_t start_revision,
                                      std::chrono::milliseconds timeout) {
  json create = key_request(key, prefix);
  create["start_revision"] = std::to_string(start_revision);
  std::string body = json{{"create_request", create}}.dump();
  auto deadline = Clock::now() + timeout;
  std::string what = "/v3/watch of '" + key + "'";
  return reading(what, [&] {
    return impl_->with_failover(
        what, [&](std::size_t i) { return impl_->watch_member(i, body, deadline); });
  });
}

std::string Client::active_endpoint() const {
  return impl_->used ? impl_->name(impl_->active) : "";
}

std::string Client::endpoints_text() const { return impl_->endpoints_text(); }

}  // namespace ddp::etcd
