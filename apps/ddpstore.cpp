// ddpstore: the c10d-compatible TCP store server alone, in the foreground.
//   ddpstore --host 127.0.0.1 --port 0     # prints "listening on 127.0.0.1:<port>"
// Runs until SIGINT or SIGTERM, then exits 0 (with --stats, after a line of counts).

#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <exception>
#include <iostream>

#include "ddp/store/server.hpp"

namespace {

// Every client is a socket: allow as many as the system lets this process have.
void raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  rlimit wanted = limit;
  wanted.rlim_cur = wanted.rlim_max = 1 << 20;
  if (::setrlimit(RLIMIT_NOFILE, &wanted) == 0) return;
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
}

}  // namespace

int main(int argc, char** argv) {
  ddp::store::ServerOptions options;
  options.port = 29500;
  CLI::App app("ddpstore: a c10d-compatible TCP store (PyTorch TCPStore 1.x and 2.x clients)");
  app.add_option("--host", options.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", options.port, "Port to listen on (0 picks a free one)")
      ->capture_default_str();
  app.add_option("--max-key-bytes", options.limits.max_key_bytes, "Largest key")
      ->capture_default_str();
  app.add_option("--max-value-bytes", options.limits.max_value_bytes, "Largest value")
      ->capture_default_str();
  app.add_option("--max-keys-per-request", options.limits.max_keys_per_request,
                 "Most keys in one CHECK/WAIT/MULTI_GET/MULTI_SET")
      ->capture_default_str();
  app.add_option("--max-request-bytes", options.limits.max_request_bytes, "Largest request")
      ->capture_default_str();
  app.add_option("--max-reply-bytes", options.limits.max_reply_bytes, "Largest MULTI_GET reply")
      ->capture_default_str();
  app.add_option("--max-waits-per-connection", options.max_waits_per_connection,
                 "Most WAITs pending on one connection; one more closes it")
      ->capture_default_str();
  app.add_option("--max-stored-bytes", options.max_stored_bytes,
                 "Budget for keys and values of the whole store; a request past it closes its "
                 "connection")
      ->capture_default_str();
  app.add_option("--max-queued-reply-bytes", options.max_queued_reply_bytes,
                 "Budget for replies queued for all clients; the client that takes it past is "
                 "closed")
      ->capture_default_str();
  bool stats = false;
  app.add_flag("--stats", stats,
               "At exit, print the requests handled and the connections accepted (one line)");
  CLI11_PARSE(app, argc, argv);

  raise_open_file_limit();
  boost::asio::io_context io(1);
  try {
    ddp::store::Server server(io, options);
    // Before the first line: whoever reads it may signal at once.
    boost::asio::signal_set signals(io, SIGINT, SIGTERM);
    std::cout << "listening on " << options.host << ":" << server.port() << std::endl;
    signals.async_wait([&](const boost::system::error_code&, int) {
      if (stats) {
        auto now = server.stats();
        std::cout << "requests " << now.requests << ", connections accepted " << now.accepted
                  << ", keys " << now.keys << ", stored bytes " << now.stored_bytes << std::endl;
      }
      server.close();
      io.stop();
    });
    io.run();
  } catch (const std::exception& e) {  // StoreError (port in use, bad host) or out of memory
    std::cerr << "ddpstore: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
