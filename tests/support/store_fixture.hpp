#pragma once
// Shared by the store tests (and runtime_process_test): the one "server on its own
// event-loop thread" of the tests, and a condition helper. Child processes: ChildProcess in
// support/process_harness.hpp.

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/store/client.hpp"
#include "ddp/store/server.hpp"

namespace ddp::test {

// A Server on 127.0.0.1 (port picked), run by its own thread; its log lines are kept.
class TestServer {
 public:
  explicit TestServer(store::Limits limits = {}) : TestServer(options_with(limits)) {}
  // options.host, port and logger are replaced.
  explicit TestServer(store::ServerOptions options) {
    options.host = "127.0.0.1";
    options.port = 0;
    options.logger = [this](std::string_view line) {
      std::lock_guard lock(mutex_);
      log_.emplace_back(line);
    };
    server_ = std::make_unique<store::Server>(io_, options);
    thread_ = std::thread([this] { io_.run(); });
  }
  ~TestServer() {
    boost::asio::post(io_, [this] {
      server_->close();
      io_.stop();
    });
    thread_.join();
    server_.reset();
  }
  std::uint16_t port() const { return server_->port(); }
  store::ServerStats stats() const { return server_->stats(); }
  // Server::clear_keys on the server's thread; returns once it ran.
  void clear_keys() {
    std::promise<void> done;
    boost::asio::post(io_, [&] {
      server_->clear_keys();
      done.set_value();
    });
    done.get_future().wait();
  }
  // Server::set_admission on the server's thread; returns once it ran.
  void set_admission(store::Admission admission) {
    std::promise<void> done;
    boost::asio::post(io_, [&] {
      server_->set_admission(std::move(admission));
      done.set_value();
    });
    done.get_future().wait();
  }
  // Blocks the server's loop, as a host busy with a thousand agents would: the kernel still
  // accepts connections, nothing is answered. Returns once the loop is held; the loop goes on
  // when the returned handle is dropped.
  std::shared_ptr<void> hold() {
    auto release = std::make_shared<std::promise<void>>();
    std::shared_future<void> released = release->get_future().share();
    std::promise<void> held;
    boost::asio::post(io_, [&held, released] {
      held.set_value();
      released.wait();
    });
    held.get_future().wait();
    return std::shared_ptr<void>(nullptr, [release](void*) { release->set_value(); });
  }
  std::vector<std::string> log() const {
    std::lock_guard lock(mutex_);
    return log_;
  }
  store::ClientOptions client_options(store::Dialect dialect = store::Dialect::V2) const {
    store::ClientOptions options;
    options.host = "127.0.0.1";
    options.port = port();
    options.dialect = dialect;
    options.connect_timeout = std::chrono::seconds(10);
    options.timeout = std::chrono::seconds(10);
    return options;
  }

 private:
  static store::ServerOptions options_with(store::Limits limits) {
    store::ServerOptions options;
    options.limits = limits;
    return options;
  }

  boost::asio::io_context io_{1};
  std::unique_ptr<store::Server> server_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::vector<std::string> log_;
};

// Waits until condition() holds, checking it every millisecond, for at most timeout.
inline bool eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace ddp::test
