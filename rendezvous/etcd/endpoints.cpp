// parse_endpoints() of client.hpp: the --rdzv_endpoint list.
#include <stdexcept>

#include "ddp/etcd/client.hpp"

namespace ddp::etcd {
namespace {

Endpoint parse_one_endpoint(const std::string& entry) {
  auto bad = [&](const std::string& why) {
    return std::invalid_argument("etcd endpoint '" + entry + "': " + why +
                                 " (expected HOST:PORT, HOST or [IPv6]:PORT)");
  };
  Endpoint endpoint;
  std::string port;
  if (entry.starts_with('[')) {
    auto close = entry.find(']');
    if (close == std::string::npos) throw bad("no ']'");
    endpoint.host = entry.substr(1, close - 1);
    std::string rest = entry.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') throw bad("text after ']'");
      port = rest.substr(1);
    }
  } else {
    auto colon = entry.rfind(':');
    endpoint.host = entry.substr(0, colon);
    if (colon != std::string::npos) port = entry.substr(colon + 1);
    if (endpoint.host.find(':') != std::string::npos) throw bad("put an IPv6 address in [ ]");
  }
  if (endpoint.host.empty()) throw bad("no host");
  if (port.empty()) return endpoint;
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5) {
    throw bad("port is not a number");
  }
  endpoint.port = std::stoi(port);
  if (endpoint.port < 1 || endpoint.port > 65535) throw bad("port out of range");
  return endpoint;
}

std::string trimmed(const std::string& text) {
  auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

}  // namespace

std::vector<Endpoint> parse_endpoints(const std::string& text) {
  std::vector<Endpoint> endpoints;
  std::size_t start = 0;
  while (start <= text.size()) {
    auto comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string entry = trimmed(text.substr(start, comma - start));
    if (!entry.empty()) endpoints.push_back(parse_one_endpoint(entry));
    start = comma + 1;
  }
  if (endpoints.empty()) throw std::invalid_argument("no etcd endpoint given in '" + text + "'");
  return endpoints;
}

}  // namespace ddp::etcd
