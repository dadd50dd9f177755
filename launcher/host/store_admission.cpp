#include "host/store_admission.hpp"

#include <ifaddrs.h>
#include <netinet/in.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <string>

namespace ddp::launcher {
namespace {

using boost::asio::ip::address;

// addr as one address, or every address its name resolves to (none when it does not).
std::vector<address> addresses_of(const std::string& addr) {
  boost::system::error_code ec;
  address numeric = boost::asio::ip::make_address(addr, ec);
  if (!ec) return {numeric};
  boost::asio::io_context io;
  boost::asio::ip::tcp::resolver resolver(io);
  auto results = resolver.resolve(addr, "", ec);
  std::vector<address> out;
  if (ec) return out;
  for (const auto& entry : results) out.push_back(entry.endpoint().address());
  return out;
}

}  // namespace

store::Admission admit_round_pending() {
  return store::Admission::pending(store::Network::loopback());
}

store::Admission admit_members(const std::vector<elastic::Member>& members) {
  std::vector<store::Network> networks;
  for (const elastic::Member& member : members) {
    for (const address& a : addresses_of(member.addr)) networks.push_back(store::Network::host(a));
  }
  for (store::Network& network : store::Network::loopback()) networks.push_back(network);
  const std::string admitted = store::Admission::only(networks, "").describe();
  return store::Admission::only(std::move(networks), "not a node of this round (admitted: " +
                                                         admitted + "); " + kAllowAnyHint);
}

store::Admission admit_this_host() {
  std::vector<store::Network> networks = store::Network::loopback();
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
      if (it->ifa_addr == nullptr) continue;
      if (it->ifa_addr->sa_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(it->ifa_addr);
        networks.push_back(
            store::Network::host(boost::asio::ip::address_v4(ntohl(in->sin_addr.s_addr))));
      } else if (it->ifa_addr->sa_family == AF_INET6) {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(it->ifa_addr);
        boost::asio::ip::address_v6::bytes_type bytes;
        std::copy(std::begin(in6->sin6_addr.s6_addr), std::end(in6->sin6_addr.s6_addr),
                  bytes.begin());
        networks.push_back(store::Network::host(boost::asio::ip::address_v6(bytes)));
      }
    }
    ::freeifaddrs(list);
  }
  return store::Admission::only(std::move(networks),
                                std::string("not this host (a one-node job's store admits only "
                                            "this host's addresses and loopback); ") +
                                    kAllowAnyHint);
}

}  // namespace ddp::launcher
