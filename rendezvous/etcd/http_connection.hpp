#pragma once
// One HTTP/1.1 connection (plain or TLS) to one etcd member, over Boost.Beast: POST a JSON
// request and read the whole answer, or read a streamed answer piece by piece (watch).
// Every operation is bounded by a deadline. Used by one thread at a time, on the io_context
// it was given (which nothing else runs concurrently).

#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "ddp/etcd/client.hpp"

namespace ddp::etcd::detail {

using Clock = std::chrono::steady_clock;

// Talking to one member failed in a way another member may not: the caller tries the next.
// maybe_applied: the whole request was sent and its answer was lost or unreadable (or said
// that etcd gave up waiting for its own commit): a write may have been applied, so it must
// not simply be sent again.
class MemberFailure : public std::runtime_error {
 public:
  MemberFailure(EtcdError::Kind kind, const std::string& what, bool maybe_applied = false)
      : std::runtime_error(what), kind_(kind), maybe_applied_(maybe_applied) {}
  EtcdError::Kind kind() const { return kind_; }
  bool maybe_applied() const { return maybe_applied_; }

 private:
  EtcdError::Kind kind_;
  bool maybe_applied_;
};

struct HttpReply {
  int status = 0;
  std::string body;
};

class HttpConnection {
 public:
  // tls: null for plain HTTP. cacert: the CA file's path, for messages only.
  HttpConnection(boost::asio::io_context& io, boost::asio::ssl::context* tls, Endpoint endpoint,
                 std::string cacert);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // TCP connect (and TLS handshake) within timeout. Throws MemberFailure.
  void connect(std::chrono::milliseconds timeout);
  bool is_open() const { return open_; }
  // Whether a request has been answered on this connection (it is a reused keep-alive one).
  bool used() const { return used_; }
  void close();

  // POSTs body (JSON) to target and reads the whole answer by deadline. token: etcd's auth
  // token, or empty. Throws MemberFailure (maybe_applied once the request was all written);
  // after it the connection is closed.
  HttpReply post(const std::string& target, const std::string& body, const std::string& token,
                 Clock::time_point deadline);

  // Streamed answers: POSTs and reads the status line and headers by deadline (the status).
  int start_stream(const std::string& target, const std::string& body, const std::string& token,
                   Clock::time_point deadline);
  // The next piece of the streamed body; nullopt when deadline passed first. Throws
  // MemberFailure when the stream ends or breaks.
  std::optional<std::string> read_stream(Clock::time_point deadline);

  const Endpoint& endpoint() const { return endpoint_; }
  std::string name() const;  // "host:port"

 private:
  template <class Start>
  boost::system::error_code run(Start start);
  boost::beast::tcp_stream& tcp();
  void set_deadline(Clock::time_point deadline);
  void write_request(const std::string& target, const std::string& body, const std::string& token,
                     Clock::time_point deadline);
  // Closes and throws the MemberFailure that ec means while `doing`; sent: the request was
  // all written (the failure is maybe_applied).
  [[noreturn]] void fail(boost::system::error_code ec, const std::string& doing, bool sent = false);
  std::string tls_failure(boost::system::error_code ec) const;

  boost::asio::io_context& io_;
  boost::asio::ssl::context* tls_context_;
  Endpoint endpoint_;
  std::string cacert_;
  std::unique_ptr<boost::beast::tcp_stream> plain_;
  std::unique_ptr<boost::beast::ssl_stream<boost::beast::tcp_stream>> secure_;
  boost::beast::flat_buffer buffer_;
  std::unique_ptr<boost::beast::http::response_parser<boost::beast::http::buffer_body>> stream_;
  bool open_ = false;
  bool used_ = false;
};

// "host:port" ("[v6]:port").
std::string endpoint_name(const Endpoint& endpoint);

// ms left until deadline (0 when passed).
std::chrono::milliseconds left(Clock::time_point deadline);

}  // namespace ddp::etcd::detail
