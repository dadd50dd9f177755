#include "ddp/store/admission.hpp"

#include <algorithm>
#include <stdexcept>

namespace ddp::store {
namespace {

using boost::asio::ip::address;

// IPv4-mapped IPv6 (::ffff:10.0.0.5, what a dual-stack socket reports) as IPv4.
address plain(const address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    return boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, a.to_v6());
  }
  return a;
}

// True when the first prefix bits of a and b are equal (both of one family).
template <typename Bytes>
bool same_prefix(const Bytes& a, const Bytes& b, int prefix) {
  int whole = prefix / 8;
  if (!std::equal(a.begin(), a.begin() + whole, b.begin())) return false;
  int rest = prefix % 8;
  if (rest == 0) return true;
  auto mask = static_cast<unsigned char>(0xff << (8 - rest));
  return (a[whole] & mask) == (b[whole] & mask);
}

}  // namespace

Network Network::host(const address& a) {
  address p = plain(a);
  return Network{p, p.is_v4() ? 32 : 128};
}

Network Network::parse(const std::string& text) {
  auto slash = text.find('/');
  boost::system::error_code ec;
  address base = boost::asio::ip::make_address(text.substr(0, slash), ec);
  if (ec) throw std::invalid_argument("'" + text + "' is not an IP address or network");
  Network network = host(base);
  if (slash == std::string::npos) return network;
  const std::string bits = text.substr(slash + 1);
  int max = network.prefix;
  int prefix = -1;
  if (!bits.empty() && bits.size() <= 3 &&
      std::all_of(bits.begin(), bits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    prefix = std::stoi(bits);
  }
  if (prefix < 0 || prefix > max) {
    throw std::invalid_argument("'" + text + "': the prefix length must be 0.." +
                                std::to_string(max));
  }
  network.prefix = prefix;
  return network;
}

std::vector<Network> Network::loopback() {
  return {Network{boost::asio::ip::make_address("127.0.0.0"), 8},
          Network{boost::asio::ip::address_v6::loopback(), 128}};
}

bool Network::contains(const address& a) const {
  address p = plain(a);
  if (p.is_v4() != base.is_v4()) return false;
  if (p.is_v4()) return same_prefix(p.to_v4().to_bytes(), base.to_v4().to_bytes(), prefix);
  return same_prefix(p.to_v6().to_bytes(), base.to_v6().to_bytes(), prefix);
}

std::string Network::to_string() const {
  int whole = base.is_v4() ? 32 : 128;
  return prefix == whole ? base.to_string() : base.to_string() + "/" + std::to_string(prefix);
}

Admission Admission::anyone() { return Admission{}; }

Admission Admission::only(std::vector<Network> networks, std::string why) {
  Admission a;
  a.anyone_ = false;
  a.networks_ = std::move(networks);
  a.why_ = std::move(why);
  return a;
}

Admission Admission::pending(std::vector<Network> networks) {
  Admission a;
  a.anyone_ = false;
  a.pending_ = true;
  a.networks_ = std::move(networks);
  return a;
}

Admission::Verdict Admission::judge(const address& peer) const {
  if (anyone_) return Verdict::kAdmit;
  for (const Network& network : networks_) {
    if (network.contains(peer)) return Verdict::kAdmit;
  }
  return pending_ ? Verdict::kHold : Verdict::kRefuse;
}

std::string Admission::describe() const {
  if (anyone_) return "every address";
  std::string out;
  for (const Network& network : networks_) {
    if (!out.empty()) out += ", ";
    out += network.to_string();
  }
  return out.empty() ? "no address" : out;
}

}  // namespace ddp::store
