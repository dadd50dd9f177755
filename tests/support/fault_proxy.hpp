#pragma once
// A fault-injecting HTTP proxy on loopback, in front of one etcd member (or any HTTP/1.1
// server that answers each request with one whole response): tests point a client at
// endpoint() and arm faults for the requests to come. Each client connection gets its own
// thread and its own connection upstream; requests are read whole and forwarded one at a
// time. A streamed answer (a /v3/watch) is piped through unchanged for the rest of its
// connection and never faulted.
//
//   FaultProxy proxy(cluster.endpoint(0));
//   proxy.arm(Fault::kDropAfterForward, "/v3/kv/txn");  // the next txn applies, its answer is lost
//
// Thread-safe. The destructor shuts every connection down and joins every thread.

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ddp::test {

enum class Fault {
  kDropAfterForward,  // forward the request, wait for the whole answer, then close the
                      // client's connection without sending it: the request did apply
  kGarbage,           // forward, then answer HTTP 200 with a body that is not JSON
  kMalformedJson,     // forward, then answer HTTP 200 with JSON of etcd's field names whose
                      // types are wrong ({"error":{"grpc_code":"x","message":12}})
};

class FaultProxy {
 public:
  // upstream: "host:port". Listens on 127.0.0.1, a free port.
  explicit FaultProxy(const std::string& upstream);
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  // "127.0.0.1:port", to give a client instead of the member's address.
  std::string endpoint() const;

  // After `skip` more requests whose target is `target` (a path such as "/v3/kv/txn"; empty:
  // any) passed, the next `times` get `fault`. Rules apply one after the other, in the order
  // armed; requests no rule is at pass through.
  void arm(Fault fault, std::string target = "", int times = 1, int skip = 0);
  // Forgets every armed fault not used yet.
  void disarm();
  // Armed faults not used yet.
  int armed() const;
  // Requests forwarded so far (faulted or not), by any connection.
  int forwarded() const { return forwarded_.load(); }

 private:
  struct Rule {
    Fault fault;
    std::string target;
    int times;
    int skip;
  };

  // The fault for the next request to target, if one is armed (and uses it up).
  bool take_fault(const std::string& target, Fault* fault);
  void accept_loop();
  void serve(int client_fd);

  std::string upstream_host_;
  std::string upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> forwarded_{0};
  mutable std::mutex mutex_;
  std::deque<Rule> rules_;
  std::vector<int> open_fds_;  // every client and upstream socket, shut down on destruction
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

}  // namespace ddp::test
