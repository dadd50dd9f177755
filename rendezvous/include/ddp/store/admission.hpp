#pragma once
// Who may connect to a store server, judged by the peer's address when it connects: anyone
// (the default), only peers in a list of networks (a job's nodes and loopback), or, while
// that list is not known yet, the listed peers now and the others held until it is. Pure
// value; the server asks it once per accepted connection (and again for held ones when the
// list changes). The store knows no jobs: the launcher builds the list from a rendezvous.

#include <boost/asio/ip/address.hpp>
#include <string>
#include <vector>

namespace ddp::store {

// An address and how many leading bits of it count: 10.0.0.5/32 (one host), 127.0.0.0/8.
struct Network {
  boost::asio::ip::address base;
  int prefix = 0;  // 0..32 (IPv4) or 0..128 (IPv6)

  // One host: /32 or /128. An IPv4-mapped IPv6 address counts as its IPv4 address.
  static Network host(const boost::asio::ip::address& address);
  // "10.0.0.5", "10.0.0.0/8", "::1", "fd00::/8"; throws std::invalid_argument naming text.
  static Network parse(const std::string& text);
  // 127.0.0.0/8 and ::1: a process on this host, whatever loopback address it used.
  static std::vector<Network> loopback();

  bool contains(const boost::asio::ip::address& address) const;
  std::string to_string() const;  // "10.0.0.5" for one host, else "10.0.0.0/8"
};

class Admission {
 public:
  enum class Verdict {
    kAdmit,   // serve it
    kRefuse,  // close it at once
    kHold,    // keep it unread until the list is known (Admission::pending)
  };

  // Every peer (ddpstore, --store_allow_any).
  static Admission anyone();
  // Only peers inside one of networks; the others are refused. why ends the refusal line
  // ("not a node of this job; ...").
  static Admission only(std::vector<Network> networks, std::string why);
  // The list is not known yet: peers inside networks are served, every other is held until
  // the server is given a decided Admission (anyone or only).
  static Admission pending(std::vector<Network> networks);

  Verdict judge(const boost::asio::ip::address& peer) const;
  bool admits_anyone() const { return anyone_; }
  bool is_pending() const { return pending_; }
  // "10.0.0.1, 10.0.0.2, 127.0.0.0/8, ::1", or "every address".
  std::string describe() const;
  const std::string& why() const { return why_; }

 private:
  bool anyone_ = true;
  bool pending_ = false;
  std::vector<Network> networks_;
  std::string why_;
};

}  // namespace ddp::store
