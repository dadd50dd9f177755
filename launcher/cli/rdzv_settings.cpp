#include "ddp/launcher/rdzv_settings.hpp"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "ddp/launcher/cli.hpp"

namespace ddp::launcher {
namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

UsageError bad_pair(const std::string& key, const std::string& value, const std::string& want) {
  return UsageError("--rdzv_conf " + key + "=" + value + ": expected " + want);
}

std::chrono::milliseconds seconds_value(const std::string& key, const std::string& value) {
  char* end = nullptr;
  double seconds = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !std::isfinite(seconds) || seconds <= 0 || seconds > 1e7) {
    throw bad_pair(key, value, "a number of seconds above 0");
  }
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0));
}

int count_value(const std::string& key, const std::string& value) {
  char* end = nullptr;
  long count = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || count < 1 || count > 1000000) {
    throw bad_pair(key, value, "a whole number above 0");
  }
  return static_cast<int>(count);
}

bool bool_value(const std::string& key, const std::string& value) {
  static const std::set<std::string> yes = {"1", "true", "t", "yes", "y"};
  static const std::set<std::string> no = {"0", "false", "f", "no", "n"};
  if (yes.contains(lower(value))) return true;
  if (no.contains(lower(value))) return false;
  throw bad_pair(key, value, "1 or 0 (true/false, yes/no)");
}

// A PEM file named by --rdzv_conf: it must be a readable file.
std::string pem_path(const std::string& key, const std::string& value) {
  std::error_code error;
  if (value.empty() || !std::filesystem::is_regular_file(value, error) ||
      ::access(value.c_str(), R_OK) != 0) {
    throw bad_pair(key, value, "a readable PEM file");
  }
  return value;
}

// The addresses of this machine's interfaces, as text.
std::set<std::string> interface_addresses() {
  std::set<std::string> addresses;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return addresses;
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr) continue;
    const int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text[NI_MAXHOST] = {};
    const socklen_t size = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(it->ifa_addr, size, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0) {
      std::string address = text;
      addresses.insert(address.substr(0, address.find('%')));  // fe80::1%eth0
    }
  }
  ::freeifaddrs(list);
  return addresses;
}

bool is_etcd(const std::string& backend) { return backend == "etcd" || backend == "etcd-v2"; }

// "a:1,b:2" -> {"a:1", "b:2"}; empty entries are dropped.
std::vector<std::string> split_endpoints(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    if (comma > start) out.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

}  // namespace

RdzvConf parse_rdzv_conf(const std::map<std::string, std::string>& conf) {
  RdzvConf out;
  elastic::RendezvousTimeouts& t = out.timeouts;
  for (const auto& [key, value] : conf) {
    if (key == "join_timeout") {
      t.join = seconds_value(key, value);
    } else if (key == "timeout") {
      if (!conf.contains("join_timeout")) t.join = seconds_value(key, value);
    } else if (key == "last_call_timeout") {
      t.last_call = seconds_value(key, value);
    } else if (key == "close_timeout") {
      t.close = seconds_value(key, value);
    } else if (key == "keep_alive_interval") {
      t.keep_alive = seconds_value(key, value);
    } else if (key == "keep_alive_max_attempt") {
      t.keep_alive_max_attempt = count_value(key, value);
    } else if (key == "read_timeout") {
      t.read = seconds_value(key, value);
    } else if (key == "is_host") {
      out.is_host = bool_value(key, value);
    } else if (key == "protocol") {
      if (lower(value) != "http" && lower(value) != "https")
        throw bad_pair(key, value, "http or https");
      out.etcd.tls = lower(value) == "https";
    } else if (key == "cacert" || key == "cert" || key == "key") {
      std::string& path = key == "cacert" ? out.etcd.cacert
                          : key == "cert" ? out.etcd.cert
                                          : out.etcd.key;
      path = pem_path(key, value);
    } else if (key == "user") {
      out.etcd.user = value;
    } else if (key == "password") {
      out.etcd.password = value;
    } else {
      out.unknown_keys.push_back(key);
    }
  }
  return out;
}

std::string unknown_rdzv_conf_warning(const std::string& key) {
  return "ddprun: warning: --rdzv_conf " + key +
         ": unknown key, ignored (known: join_timeout, last_call_timeout, close_timeout, "
         "keep_alive_interval, keep_alive_max_attempt, read_timeout, timeout, is_host; for etcd: "
         "protocol, cacert, cert, key, user, password)";
}

bool is_multi_node(const LaunchConfig& config) { return config.max_nodes > 1; }

HostPort parse_host_port(const std::string& option, const std::string& text, int default_port) {
  HostPort out{text, default_port};
  std::string port;
  if (text.starts_with("[")) {
    const std::size_t close = text.find(']');
    out.host = text.substr(1, close == std::string::npos ? std::string::npos : close - 1);
    if (close != std::string::npos && close + 1 < text.size() && text[close + 1] == ':') {
      port = text.substr(close + 2);
    }
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    out.host = text.substr(0, text.find(':'));
    port = text.substr(text.find(':') + 1);
  }
  if (!port.empty()) {
    char* end = nullptr;
    long number = std::strtol(port.c_str(), &end, 10);
    if (*end != '\0' || number < 0 || number > 65535) {
      throw UsageError(option + "=" + text + ": expected HOST[:PORT] with a port in 0-65535");
    }
    out.port = static_cast<int>(number);
  }
  return out;
}

elastic::RendezvousSettings rendezvous_settings(const LaunchConfig& config, const RdzvConf& conf,
                                                elastic::NodeInfo self) {
  elastic::RendezvousSettings settings;
  settings.backend = config.rdzv_backend;
  settings.run_id = config.rdzv_id;
  settings.timeouts = conf.timeouts;
  settings.min_nodes = config.min_nodes;
  settings.max_nodes = config.max_nodes;
  HostPort store;
  if (config.rdzv_backend == "static") {
    if (config.min_nodes != config.max_nodes) {
      throw UsageError("--nnodes=" + std::to_string(config.min_nodes) + ":" +
                       std::to_string(config.max_nodes) +
                       ": the static rendezvous needs a fixed number of nodes (use "
                       "--rdzv_backend=c10d or --rdzv_backend=etcd for MIN:MAX)");
    }
    const int port = config.master_port.value_or(kDefaultMasterPort);
    store = config.rdzv_endpoint.empty()
                ? HostPort{config.master_addr, port}
                : parse_host_port("--rdzv_endpoint", config.rdzv_endpoint, port);
    self.fixed_group_rank = config.node_rank;
  } else if (is_etcd(config.rdzv_backend)) {
    if (config.rdzv_endpoint.empty()) {
      throw UsageError("--rdzv_backend=" + config.rdzv_backend +
                       " needs --rdzv_endpoint=HOST:PORT[,HOST:PORT...], the client addresses "
                       "of the etcd members");
    }
    std::string endpoints;
    for (const std::string& text : split_endpoints(config.rdzv_endpoint)) {
      HostPort member = parse_host_port("--rdzv_endpoint", text, kDefaultEtcdPort);
      if (member.host.empty() || member.port == 0) {
        throw UsageError("--rdzv_endpoint=" + config.rdzv_endpoint + ": '" + text +
                         "' is not an etcd member's HOST:PORT");
      }
      if (store.host.empty()) store = member;
      const bool v6 = member.host.find(':') != std::string::npos;
      endpoints += (endpoints.empty() ? "" : ",") + (v6 ? "[" + member.host + "]" : member.host) +
                   ":" + std::to_string(member.port);
    }
    settings.etcd = conf.etcd;
    settings.etcd.endpoints = endpoints;
    if (!settings.etcd.tls && (!conf.etcd.cacert.empty() || !conf.etcd.cert.empty())) {
      settings.etcd.tls = true;  // certificates given: the members speak https
    }
    if (conf.etcd.cert.empty() != conf.etcd.key.empty()) {
      throw UsageError(
          "--rdzv_conf: cert and key go together (the client certificate and its "
          "private key)");
    }
  } else {
    if (config.rdzv_endpoint.empty()) {
      throw UsageError(
          "--rdzv_backend=c10d with more than one node needs --rdzv_endpoint="
          "HOST[:PORT], the host whose agent serves the rendezvous");
    }
    store = parse_host_port("--rdzv_endpoint", config.rdzv_endpoint, kDefaultC10dPort);
  }
  if (store.port == 0) {
    throw UsageError(
        "the rendezvous of a multi-node job needs a port other nodes can reach "
        "(--master_port or --rdzv_endpoint=HOST:PORT); port 0 picks one per node");
  }
  settings.store_host = store.host;
  settings.store_port = store.port;
  settings.self = std::move(self);
  return settings;
}

bool hosts_rendezvous_store(const LaunchConfig& config, const RdzvConf& conf,
                            const elastic::RendezvousSettings& settings,
                            const std::function<bool(const std::string&)>& is_local) {
  if (config.rdzv_backend == "static") return config.node_rank == 0;
  if (is_etcd(config.rdzv_backend)) return false;  // etcd keeps the state
  if (conf.is_host) return *conf.is_host;
  return is_local(settings.store_host);
}

bool is_local_host(const std::string& host) {
  if (host.empty() || host == "localhost" || host == "::1" || host == "0.0.0.0" ||
      host.starts_with("127.")) {
    return true;
  }
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && host == name) return true;
  const std::set<std::string> local = interface_addresses();
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool matches = false;
  for (addrinfo* it = found; it && !matches; it = it->ai_next) {
    char text[NI_MAXHOST] = {};
    if (::getnameinfo(it->ai_addr, it->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST) ==
        0) {
      matches = local.contains(text) || std::string(text).starts_with("127.");
    }
  }
  ::freeaddrinfo(found);
  return matches;
}

}  // namespace ddp::launcher
