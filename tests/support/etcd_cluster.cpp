#include "etcd_cluster.hpp"

#include <unistd.h>

#include <csignal>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "test_support.hpp"

extern char** environ;

namespace ddp::test {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Raft timing for tests: a leader within a second of start, a lost member noticed quickly.
constexpr const char* kHeartbeatMs = "50";
constexpr const char* kElectionMs = "500";
// Between two health probes of a starting member.
constexpr auto kProbeInterval = 50ms;
// Attempts at starting the cluster when a port picked as free was taken meanwhile.
constexpr int kStartAttempts = 3;

std::string url(bool tls, int port) {
  return std::string(tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(port);
}

// Runs openssl with args; throws with its output when it fails.
void openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  ProcessResult result = run_process(argv, {}, {}, 30s);
  if (result.status != 0) {
    std::string line;
    for (const auto& a : argv) line += a + " ";
    throw std::runtime_error("etcd test cluster: `" + line + "` failed: " + result.err);
  }
}

// The value of "name":"value" in JSON text (etcd's int64 fields are strings), or empty.
std::string string_field(const std::string& json, const std::string& name) {
  std::string needle = "\"" + name + "\":\"";
  auto start = json.find(needle);
  if (start == std::string::npos) return "";
  start += needle.size();
  auto end = json.find('"', start);
  return end == std::string::npos ? "" : json.substr(start, end - start);
}

}  // namespace

bool EtcdCluster::available() { return ::access(kBinary, X_OK) == 0; }

EtcdCluster::EtcdCluster(EtcdClusterOptions options) : options_(options) {
  if (options_.tls) make_certificates();
  for (int attempt = 1;; ++attempt) {
    members_.clear();                                    // kills what an earlier attempt started
    std::vector<std::unique_ptr<SilentListener>> ports;  // held so that all differ
    for (int i = 0; i < 2 * options_.members; ++i) {
      ports.push_back(std::make_unique<SilentListener>());
    }
    initial_cluster_.clear();
    std::string run = std::to_string(attempt);
    for (int i = 0; i < options_.members; ++i) {
      Member m;
      m.name = "m" + std::to_string(i);
      m.client_port = ports[2 * i]->port();
      m.peer_port = ports[2 * i + 1]->port();
      m.data_dir = dir() / ("data-" + m.name + "-" + run);
      m.log = dir() / (m.name + "-" + run + ".log");
      initial_cluster_ += (i ? "," : "") + m.name + "=" + url(false, m.peer_port);
      members_.push_back(std::move(m));
    }
    ports.clear();
    for (auto& m : members_) start(m);
    std::vector<int> all;
    for (int i = 0; i < size(); ++i) all.push_back(i);
    try {
      wait_healthy(all);
      return;
    } catch (const std::runtime_error&) {
      bool port_taken = logs().find("address already in use") != std::string::npos;
      if (!port_taken || attempt == kStartAttempts) throw;
    }
  }
}

EtcdCluster::~EtcdCluster() { members_.clear(); }

std::string EtcdCluster::endpoint(int i) const {
  return "127.0.0.1:" + std::to_string(members_.at(static_cast<std::size_t>(i)).client_port);
}

std::string EtcdCluster::endpoints() const {
  std::string text;
  for (int i = 0; i < size(); ++i) text += (i ? "," : "") + endpoint(i);
  return text;
}

void EtcdCluster::make_certificates() {
  auto path = [&](const std::string& name) { return (dir() / name).string(); };
  auto make_ca = [&](const std::string& name) {
    openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", path(name + ".key"), "-out", path(name + ".pem"), "-days", "2", "-subj",
             "/CN=ddprun test " + name, "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
             "keyUsage=critical,keyCertSign,cRLSign"});
  };
  auto make_cert = [&](const std::string& name, const std::string& extensions) {
    std::ofstream(path(name + ".ext")) << extensions << "\n";
    openssl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", path(name + ".key"), "-out", path(name + ".csr"), "-subj",
             "/CN=ddprun test " + name});
    openssl({"x509", "-req", "-in", path(name + ".csr"), "-CA", path("ca.pem"), "-CAkey",
             path("ca.key"), "-CAcreateserial", "-out", path(name + ".pem"), "-days", "2",
             "-extfile", path(name + ".ext")});
  };
  make_ca("ca");
  make_ca("other-ca");
  make_cert("server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth");
  make_cert("client", "extendedKeyUsage=clientAuth");
  tls_.ca = path("ca.pem");
  tls_.client_cert = path("client.pem");
  tls_.client_key = path("client.key");
  tls_.other_ca = path("other-ca.pem");
}

std::vector<std::string> EtcdCluster::command(const Member& m) const {
  std::string client_url = url(options_.tls, m.client_port);
  std::vector<std::string> argv = {kBinary,
                                   "--name=" + m.name,
                                   "--data-dir=" + m.data_dir.string(),
                                   "--listen-client-urls=" + client_url,
                                   "--advertise-client-urls=" + client_url,
                                   "--listen-peer-urls=" + url(false, m.peer_port),
                                   "--initial-advertise-peer-urls=" + url(false, m.peer_port),
                                   "--initial-cluster=" + initial_cluster_,
                                   "--initial-cluster-state=new",
                                   "--initial-cluster-token=" + dir().filename().string(),
                                   std::string("--heartbeat-interval=") + kHeartbeatMs,
                                   std::string("--election-timeout=") + kElectionMs,
                                   "--logger=zap",
                                   "--log-level=error",
                                   "--log-outputs=" + m.log.string()};
  if (options_.tls) {
    argv.push_back("--cert-file=" + (dir() / "server.pem").string());
    argv.push_back("--key-file=" + (dir() / "server.key").string());
    argv.push_back("--trusted-ca-file=" + tls_.ca.string());
    argv.push_back("--client-cert-auth");
  }
  return argv;
}

// etcd reads every ETCD_* variable as a flag: the test's own flags only.
void EtcdCluster::start(Member& m) {
  std::vector<std::string> unset;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    if (entry.starts_with("ETCD_")) unset.push_back(entry.substr(0, entry.find('=')));
  }
  m.process =
      std::make_unique<ChildProcess>(command(m), std::map<std::string, std::string>{}, unset);
}

std::string EtcdCluster::curl(const Member& m, const std::string& path,
                              const std::string& post_body) const {
  std::vector<std::string> argv = {"/usr/bin/curl", "-s", "--max-time", "1"};
  if (options_.tls) {
    argv.insert(argv.end(), {"--cacert", tls_.ca.string(), "--cert", tls_.client_cert.string(),
                             "--key", tls_.client_key.string()});
  }
  if (!post_body.empty()) argv.insert(argv.end(), {"-X", "POST", "-d", post_body});
  argv.push_back(url(options_.tls, m.client_port) + path);
  ProcessResult result = run_process(argv, {}, {}, 5s);
  return result.status == 0 ? result.out : "";
}

bool EtcdCluster::healthy(const Member& m) const {
  return curl(m, "/health", "").find("\"health\":\"true\"") != std::string::npos;
}

int EtcdCluster::leader() const {
  for (int i = 0; i < size(); ++i) {
    const Member& m = members_[static_cast<std::size_t>(i)];
    if (!m.process) continue;
    std::string status = curl(m, "/v3/maintenance/status", "{}");
    std::string id = string_field(status, "member_id");
    if (!id.empty() && id == string_field(status, "leader")) return i;
  }
  return -1;
}

// Probes each member's /health until all say true. There is no event to wait on: a member
// becomes healthy when its cluster has elected a leader.
void EtcdCluster::wait_healthy(const std::vector<int>& which) {
  auto deadline = Clock::now() + options_.start_timeout;
  for (int i : which) {
    while (!healthy(members_[static_cast<std::size_t>(i)])) {
      if (Clock::now() > deadline || wait_for_process_exit(members_[i].process->pid(), 0ms)) {
        throw std::runtime_error("etcd test cluster: member " + std::to_string(i) +
                                 " not healthy within " +
                                 std::to_string(options_.start_timeout.count()) + " ms\n" + logs());
      }
      std::this_thread::sleep_for(kProbeInterval);
    }
  }
}

std::string EtcdCluster::logs() const {
  std::string text;
  for (const auto& m : members_) text += "--- " + m.log.string() + ":\n" + read_file(m.log);
  return text;
}

void EtcdCluster::kill_member(int i) {
  Member& m = members_.at(static_cast<std::size_t>(i));
  if (!m.process) return;
  m.process->signal(SIGKILL);
  m.process->wait();
  m.process.reset();
}

void EtcdCluster::restart_member(int i) {
  kill_member(i);
  start(members_.at(static_cast<std::size_t>(i)));
  wait_healthy({i});
}

}  // namespace ddp::test
