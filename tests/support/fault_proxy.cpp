#include "fault_proxy.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <stdexcept>

namespace ddp::test {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr const char* kGarbageBody = "<html>proxy: not etcd's JSON</html>";
constexpr const char* kMalformedBody = R"({"error":{"grpc_code":"x","message":12}})";

}  // namespace

FaultProxy::FaultProxy(const std::string& upstream) {
  auto colon = upstream.rfind(':');
  if (colon == std::string::npos) throw std::invalid_argument("FaultProxy: no port in " + upstream);
  upstream_host_ = upstream.substr(0, colon);
  upstream_port_ = upstream.substr(colon + 1);
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listen_fd_, 64) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (listen_fd_ >= 0) ::close(listen_fd_);
    throw std::runtime_error("FaultProxy: cannot listen on 127.0.0.1");
  }
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

FaultProxy::~FaultProxy() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  acceptor_.join();
  {
    std::lock_guard lock(mutex_);
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);  // wakes each blocked read
  }
  for (auto& thread : threads_) thread.join();
  ::close(listen_fd_);
}

std::string FaultProxy::endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

void FaultProxy::arm(Fault fault, std::string target, int times, int skip) {
  std::lock_guard lock(mutex_);
  rules_.push_back(Rule{fault, std::move(target), times, skip});
}

void FaultProxy::disarm() {
  std::lock_guard lock(mutex_);
  rules_.clear();
}

int FaultProxy::armed() const {
  std::lock_guard lock(mutex_);
  int n = 0;
  for (const auto& rule : rules_) n += rule.times;
  return n;
}

bool FaultProxy::take_fault(const std::string& target, Fault* fault) {
  std::lock_guard lock(mutex_);
  if (rules_.empty()) return false;
  Rule& rule = rules_.front();
  if (!rule.target.empty() && rule.target != target) return false;
  if (rule.skip > 0) {
    --rule.skip;
    return false;
  }
  *fault = rule.fault;
  if (--rule.times <= 0) rules_.pop_front();
  return true;
}

void FaultProxy::accept_loop() {
  while (!stopping_) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_) return;
      continue;
    }
    std::lock_guard lock(mutex_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    open_fds_.push_back(fd);
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

// One client connection: requests read whole, forwarded upstream, answered (or faulted).
// Every blocking call here ends when the destructor shuts the sockets down.
void FaultProxy::serve(int client_fd) {
  asio::io_context io;
  tcp::socket client(io);
  tcp::socket upstream(io);
  boost::system::error_code ec;
  client.assign(tcp::v4(), client_fd, ec);
  tcp::resolver resolver(io);
  auto addresses = resolver.resolve(upstream_host_, upstream_port_, ec);
  if (!ec) asio::connect(upstream, addresses, ec);
  if (!ec) {
    std::lock_guard lock(mutex_);
    if (stopping_) ec = asio::error::operation_aborted;
    open_fds_.push_back(upstream.native_handle());
  }
  beast::flat_buffer from_client;
  beast::flat_buffer from_upstream;
  while (!ec && !stopping_) {
    http::request<http::string_body> request;
    http::read(client, from_client, request, ec);
    if (ec) break;
    std::string target(request.target());
    if (target == "/v3/watch") {  // streamed: pipe the answer through as it comes
      http::write(upstream, request, ec);
      char piece[8192];
      while (!ec) {
        std::size_t n = upstream.read_some(asio::buffer(piece), ec);
        if (!ec) asio::write(client, asio::buffer(piece, n), ec);
      }
      break;
    }
    Fault fault{};
    bool faulted = take_fault(target, &fault);
    http::write(upstream, request, ec);
    if (ec) break;
    http::response<http::string_body> response;
    http::read(upstream, from_upstream, response, ec);
    if (ec) break;
    ++forwarded_;
    if (faulted && fault == Fault::kDropAfterForward) break;
    if (faulted) {
      response.result(http::status::ok);
      response.body() = fault == Fault::kGarbage ? kGarbageBody : kMalformedBody;
      response.prepare_payload();
    }
    http::write(client, response, ec);
  }
  {
    std::lock_guard lock(mutex_);
    std::erase(open_fds_, client_fd);
    if (upstream.is_open()) std::erase(open_fds_, upstream.native_handle());
  }
  client.close(ec);
  upstream.close(ec);
}

}  // namespace ddp::test
