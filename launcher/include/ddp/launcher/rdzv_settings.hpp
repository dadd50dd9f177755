#pragma once
// From torchrun's rendezvous options (--nnodes, --node_rank, --rdzv_backend, --rdzv_endpoint,
// --rdzv_id, --rdzv_conf, --master_addr, --master_port) to the settings of the rendezvous
// engine (ddp/elastic/rendezvous.hpp), and who hosts the rendezvous store.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/elastic/rendezvous.hpp"
#include "ddp/launcher/launch_config.hpp"

namespace ddp::launcher {

inline constexpr int kDefaultMasterPort = 29500;  // torchrun's --master_port default
inline constexpr int kDefaultC10dPort = 29400;    // torchrun's c10d --rdzv_endpoint port
inline constexpr int kDefaultEtcdPort = 2379;     // etcd's client port

// --rdzv_conf, parsed.
struct RdzvConf {
  elastic::RendezvousTimeouts timeouts;
  std::optional<bool> is_host;            // is_host=1|0: host the c10d store or not
  elastic::EtcdSettings etcd;             // protocol, cacert, cert, key, user, password
  std::vector<std::string> unknown_keys;  // warned about, otherwise ignored
};

// Reads the keys join_timeout, last_call_timeout, close_timeout, keep_alive_interval,
// read_timeout, timeout (seconds; timeout is join_timeout when that is not given),
// keep_alive_max_attempt (a count), is_host (1/0, true/false, yes/no), and for etcd protocol
// (http or https), cacert, cert, key (PEM files that must exist), user and password. Throws
// UsageError naming --rdzv_conf and the pair for a value it cannot read.
RdzvConf parse_rdzv_conf(const std::map<std::string, std::string>& conf);
// The warning printed for each unknown key.
std::string unknown_rdzv_conf_warning(const std::string& key);

// True when the job spans more than one node (the rendezvous is then a store engine; a
// single node runs a LocalRendezvous).
bool is_multi_node(const LaunchConfig& config);

struct HostPort {
  std::string host;
  int port = 0;
};
// "host:port", "[v6]:port", "host" (then default_port), "v6" bare. Throws UsageError naming
// option for a port that is not a number in 0-65535.
HostPort parse_host_port(const std::string& option, const std::string& text, int default_port);

// The engine's settings. static: the store at --rdzv_endpoint or --master_addr:--master_port
// (default 29500), min = max = --nnodes, fixed group rank --node_rank. c10d: the store at
// --rdzv_endpoint (default port 29400; required), MIN:MAX from --nnodes. etcd, etcd-v2: the
// members at --rdzv_endpoint=HOST:PORT[,HOST:PORT...] (default port 2379; required), MIN:MAX
// from --nnodes, TLS and auth from --rdzv_conf. Throws UsageError.
elastic::RendezvousSettings rendezvous_settings(const LaunchConfig& config, const RdzvConf& conf,
                                                elastic::NodeInfo self);

// Whether this agent serves the rendezvous store: static: node rank 0; c10d: is_host when
// given, else when the endpoint's host is this machine (is_local_host); etcd: never.
bool hosts_rendezvous_store(const LaunchConfig& config, const RdzvConf& conf,
                            const elastic::RendezvousSettings& settings,
                            const std::function<bool(const std::string&)>& is_local_host);

// True when host names this machine: localhost, a loopback address, the host name, or a name
// or address that resolves to an address of one of its interfaces.
bool is_local_host(const std::string& host);

}  // namespace ddp::launcher
