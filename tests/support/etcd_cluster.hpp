#pragma once
// A real etcd cluster for tests: N members of Debian's etcd-server (/usr/bin/etcd) on free
// loopback ports, each with its own data directory under a temporary directory that goes
// away with the cluster. Members are killed and reaped on destruction, never orphaned.
// Optionally TLS-only client URLs with certificates the harness makes with `openssl`.
//
//   if (!EtcdCluster::available()) return ddp::test::skip(EtcdCluster::kMissing);
//   EtcdCluster cluster;                  // 3 members, healthy when the constructor returns
//   options.endpoints = parse_endpoints(cluster.endpoints());

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "process_harness.hpp"
#include "test_support.hpp"

namespace ddp::test {

// How long a test waits for members to become healthy.
inline constexpr std::chrono::milliseconds kEtcdStartTimeout{30000};

struct EtcdClusterOptions {
  int members = 3;
  bool tls = false;  // https client URLs with client-certificate auth (peers stay plain http)
  std::chrono::milliseconds start_timeout = kEtcdStartTimeout;
};

// PEM files made for a TLS cluster, under the cluster's temporary directory.
struct EtcdTlsFiles {
  std::filesystem::path ca;           // signed every certificate below
  std::filesystem::path client_cert;  // a client certificate the members accept
  std::filesystem::path client_key;
  std::filesystem::path other_ca;  // an unrelated CA: trusting it instead must fail
};

class EtcdCluster {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";
  static constexpr const char* kMissing =
      "etcd is not installed (/usr/bin/etcd; scripts/setup installs etcd-server)";
  static bool available();

  // Starts the members and waits until each one reports healthy. Throws std::runtime_error
  // with the members' logs when they do not within options.start_timeout.
  explicit EtcdCluster(EtcdClusterOptions options = {});
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  // "127.0.0.1:p1,127.0.0.1:p2,..." (client addresses).
  std::string endpoints() const;
  std::string endpoint(int i) const;
  const EtcdTlsFiles& tls_files() const { return tls_; }
  const std::filesystem::path& dir() const { return dir_.path(); }

  // The member that is the Raft leader now (as the running members report it), or -1.
  int leader() const;

  // SIGKILL member i and reap it.
  void kill_member(int i);
  // Starts member i again on its data directory and waits until it is healthy.
  void restart_member(int i);

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    std::filesystem::path data_dir;
    std::filesystem::path log;
    std::unique_ptr<ChildProcess> process;
  };

  void make_certificates();
  void start(Member& member);
  std::vector<std::string> command(const Member& member) const;
  // curl's output for path on the member (a POST of post_body when not empty); empty when
  // it failed.
  std::string curl(const Member& member, const std::string& path,
                   const std::string& post_body) const;
  bool healthy(const Member& member) const;
  void wait_healthy(const std::vector<int>& which);
  std::string logs() const;

  TempDir dir_;  // first: removed after every member is gone
  EtcdClusterOptions options_;
  EtcdTlsFiles tls_;
  std::string initial_cluster_;
  std::vector<Member> members_;
};

}  // namespace ddp::test
