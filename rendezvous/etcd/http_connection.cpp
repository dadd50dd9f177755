#include "http_connection.hpp"

#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

namespace ddp::etcd::detail {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Kind = EtcdError::Kind;

// The largest answer read whole (a range over many keys); watch streams have no limit.
constexpr std::uint64_t kMaxReplyBytes = 64u << 20;

bool is_ip_address(const std::string& host) {
  boost::system::error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

std::chrono::milliseconds left(Clock::time_point deadline) {
  auto d = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return d.count() < 0 ? std::chrono::milliseconds(0) : d;
}

HttpConnection::HttpConnection(asio::io_context& io, asio::ssl::context* tls, Endpoint endpoint,
                               std::string cacert)
    : io_(io), tls_context_(tls), endpoint_(std::move(endpoint)), cacert_(std::move(cacert)) {}

HttpConnection::~HttpConnection() { close(); }

std::string endpoint_name(const Endpoint& endpoint) {
  bool v6 = endpoint.host.find(':') != std::string::npos;
  return (v6 ? "[" + endpoint.host + "]" : endpoint.host) + ":" + std::to_string(endpoint.port);
}

std::string HttpConnection::name() const { return endpoint_name(endpoint_); }

// Runs io until the one operation start() began has completed. Every operation has the
// stream's expiry (or the resolver's run_for) as its bound, so this ends.
template <class Start>
boost::system::error_code HttpConnection::run(Start start) {
  boost::system::error_code result;
  bool done = false;
  start([&](boost::system::error_code ec, auto&&...) {
    result = ec;
    done = true;
  });
  io_.restart();
  while (!done) {
    if (io_.run_one() == 0) throw std::logic_error("etcd: an operation ended without its handler");
  }
  return result;
}

beast::tcp_stream& HttpConnection::tcp() {
  return secure_ ? beast::get_lowest_layer(*secure_) : *plain_;
}

void HttpConnection::set_deadline(Clock::time_point deadline) {
  tcp().expires_after(left(deadline));
}

void HttpConnection::connect(std::chrono::milliseconds timeout) {
  close();
  auto deadline = Clock::now() + timeout;
  tcp::resolver resolver(io_);
  tcp::resolver::results_type addresses;
  boost::system::error_code ec;
  bool resolved = false;
  resolver.async_resolve(endpoint_.host, std::to_string(endpoint_.port),
                         [&](boost::system::error_code e, tcp::resolver::results_type r) {
                           ec = e;
                           addresses = std::move(r);
                           resolved = true;
                         });
  io_.restart();
  io_.run_for(timeout);
  if (!resolved) {
    resolver.cancel();
    io_.restart();
    io_.run();
    throw MemberFailure(Kind::kUnreachable, "could not resolve the host name in time");
  }
  if (ec) throw MemberFailure(Kind::kUnreachable, "cannot resolve the host: " + ec.message());

  if (tls_context_) {
    secure_ = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(io_, *tls_context_);
  } else {
    plain_ = std::make_unique<beast::tcp_stream>(io_);
  }
  set_deadline(deadline);
  ec = run([&](auto handler) { tcp().async_connect(addresses, std::move(handler)); });
  if (ec == beast::error::timeout) {
    close();
    throw MemberFailure(Kind::kUnreachable,
                        "no connection within " + std::to_string(timeout.count()) + " ms");
  }
  if (ec) {
    close();
    throw MemberFailure(Kind::kUnreachable, ec.message());
  }
  if (secure_) {
    // The member's certificate must name the host we dialled (an IP SAN for an address).
    SSL* ssl = secure_->native_handle();
    if (is_ip_address(endpoint_.host)) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), endpoint_.host.c_str());
    } else {
      SSL_set_tlsext_host_name(ssl, endpoint_.host.c_str());
      SSL_set1_host(ssl, endpoint_.host.c_str());
    }
    ec = run([&](auto handler) {
      secure_->async_handshake(asio::ssl::stream_base::client, std::move(handler));
    });
    if (ec == beast::error::timeout) {
      close();
      throw MemberFailure(Kind::kUnreachable,
                          "no TLS handshake within " + std::to_string(timeout.count()) + " ms");
    }
    if (ec) {
      std::string why = tls_failure(ec);
      close();
      throw MemberFailure(Kind::kRefused, why);
    }
  }
  open_ = true;
  used_ = false;
}

std::string HttpConnection::tls_failure(boost::system::error_code ec) const {
  long verify = SSL_get_verify_result(secure_->native_handle());
  if (verify != X509_V_OK) {
    return std::string("TLS handshake failed: certificate verification failed: ") +
           X509_verify_cert_error_string(verify) + " (the member's certificate is not trusted " +
           "with cacert=" + cacert_ + " for host " + endpoint_.host + ")";
  }
  std::string text = ec.message();
  if (contains(text, "wrong version number") || contains(text, "packet length too long") ||
      contains(text, "record layer failure")) {
    text += " (the member seems to speak plain HTTP: use protocol=http, or its https address)";
  }
  return "TLS handshake failed: " + text;
}

void HttpConnection::close() {
  boost::system::error_code ignored;
  if (plain_) plain_->socket().close(ignored);
  if (secure_) beast::get_lowest_layer(*secure_).socket().close(ignored);
  stream_.reset();
  plain_.reset();
  secure_.reset();
  buffer_.clear();
  open_ = false;
}

void HttpConnection::write_request(const std::string& target, const std::string& body,
                                   const std::string& token, Clock::time_point deadline) {
  http::request<http::string_body> request{http::verb::post, target, 11};
  request.set(http::field::host, name());
  request.set(http::field::content_type, "application/json");
  // gRPC metadata "hasleader": a member that has lost its leader answers "no leader" at once
  // instead of letting the request time out.
  request.set("Grpc-Metadata-hasleader", "true");
  if (!token.empty()) request.set(http::field::authorization, token);
  request.keep_alive(true);
  request.body() = body;
  request.prepare_payload();
  set_deadline(deadline);
  auto ec = run([&](auto handler) {
    if (secure_) {
      http::async_write(*secure_, request, std::move(handler));
    } else {
      http::async_write(*plain_, request, std::move(handler));
    }
  });
  if (ec) fail(ec, "sending " + target);
}

void HttpConnection::fail(boost::system::error_code ec, const std::string& doing, bool sent) {
  bool tls = secure_ != nullptr;
  bool fresh = !used_;
  close();
  if (ec == beast::error::timeout) {
    throw MemberFailure(Kind::kNoQuorum,
                        doing +
                            ": connected, but no answer in time (the member "
                            "runs but cannot serve: has etcd lost its quorum?)",
                        sent);
  }
  if (ec.category() == asio::error::get_ssl_category() ||
      ec == asio::ssl::error::stream_truncated) {
    std::string text = ec.message();
    if (contains(text, "certificate")) {
      text += " (the member wants a client certificate it trusts: check cert= and key=)";
    }
    throw MemberFailure(Kind::kRefused, doing + ": TLS: " + text, sent);
  }
  if (ec.category() == make_error_code(http::error::end_of_stream).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message) {
    throw MemberFailure(Kind::kProtocol, doing + ": not an HTTP answer: " + ec.message(), sent);
  }
  std::string text = doing + ": the member closed the connection (" + ec.message() + ")";
  if (tls && fresh) {
    // TLS 1.3 ends the client's handshake before the member has checked its certificate.
    throw MemberFailure(Kind::kRefused,
                        text +
                            " right after the TLS handshake: it did not accept "
                            "this client's certificate? (check cert= and key=)",
                        sent);
  }
  if (!tls) text += "; if the member serves only TLS, use protocol=https with cacert=";
  throw MemberFailure(Kind::kUnreachable, text, sent);
}

HttpReply HttpConnection::post(const std::string& target, const std::string& body,
                               const std::string& token, Clock::time_point deadline) {
  write_request(target, body, token, deadline);
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxReplyBytes);
  set_deadline(deadline);
  auto ec = run([&](auto handler) {
    if (secure_) {
      http::async_read(*secure_, buffer_, parser, std::move(handler));
    } else {
      http::async_read(*plain_, buffer_, parser, std::move(handler));
    }
  });
  if (ec) fail(ec, "reading the answer to " + target, true);
  used_ = true;
  auto& response = parser.get();
  HttpReply reply{static_cast<int>(response.result_int()), std::move(response.body())};
  if (!response.keep_alive()) close();
  return reply;
}

int HttpConnection::start_stream(const std::string& target, const std::string& body,
                                 const std::string& token, Clock::time_point deadline) {
  write_request(target, body, token, deadline);
  stream_ = std::make_unique<http::response_parser<http::buffer_body>>();
  stream_->body_limit(boost::none);
  set_deadline(deadline);
  auto ec = run([&](auto handler) {
    if (secure_) {
      http::async_read_header(*secure_, buffer_, *stream_, std::move(handler));
    } else {
      http::async_read_header(*plain_, buffer_, *stream_, std::move(handler));
    }
  });
  if (ec) fail(ec, "reading the answer to " + target);
  used_ = true;
  return static_cast<int>(stream_->get().result_int());
}

std::optional<std::string> HttpConnection::read_stream(Clock::time_point deadline) {
  if (!stream_ || stream_->is_done()) {
    close();
    throw MemberFailure(Kind::kUnreachable, "the member ended the stream");
  }
  char piece[8192];
  stream_->get().body().data = piece;
  stream_->get().body().size = sizeof piece;
  set_deadline(deadline);
  auto ec = run([&](auto handler) {
    if (secure_) {
      http::async_read_some(*secure_, buffer_, *stream_, std::move(handler));
    } else {
      http::async_read_some(*plain_, buffer_, *stream_, std::move(handler));
    }
  });
  if (ec == http::error::need_buffer) ec = {};
  if (ec == beast::error::timeout) {
    close();
    return std::nullopt;
  }
  if (ec) fail(ec, "reading the stream");
  return std::string(piece, sizeof piece - stream_->get().body().size);
}

}  // namespace ddp::etcd::detail
