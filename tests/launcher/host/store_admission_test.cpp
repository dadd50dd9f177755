// Who the agent's stores admit: a round's members (names resolved) and loopback, or this
// host's own addresses and loopback.

#include "host/store_admission.hpp"

#include <catch2/catch.hpp>

#include "ddp/store/local_address.hpp"

using namespace ddp::launcher;
using boost::asio::ip::make_address;
using Verdict = ddp::store::Admission::Verdict;

namespace {

ddp::elastic::Member member(const std::string& addr) {
  ddp::elastic::Member m;
  m.addr = addr;
  return m;
}

}  // namespace

TEST_CASE("a round's workers' store: held until the round closes, then only its members") {
  auto pending = admit_round_pending();
  CHECK(pending.is_pending());
  CHECK(pending.judge(make_address("127.0.0.1")) == Verdict::kAdmit);
  CHECK(pending.judge(make_address("10.0.0.1")) == Verdict::kHold);

  auto members = admit_members({member("10.0.0.1"), member("10.0.0.2")});
  CHECK(members.judge(make_address("10.0.0.1")) == Verdict::kAdmit);
  CHECK(members.judge(make_address("10.0.0.2")) == Verdict::kAdmit);
  CHECK(members.judge(make_address("127.0.0.1")) == Verdict::kAdmit);
  CHECK(members.judge(make_address("10.0.0.3")) == Verdict::kRefuse);
  CHECK(members.why() ==
        "not a node of this round (admitted: 10.0.0.1, 10.0.0.2, 127.0.0.0/8, ::1); behind NAT "
        "or a proxy, --store_allow_any admits every address");
}

TEST_CASE("a member's host name admits the addresses it resolves to") {
  auto named = admit_members({member("localhost")});
  // Its addresses (127.0.0.1, ::1) come before loopback's networks; no name is kept.
  CHECK(named.describe().find("localhost") == std::string::npos);
  CHECK(named.describe().size() > std::string("127.0.0.0/8, ::1").size());
  CHECK(named.describe().substr(named.describe().size() - 16) == "127.0.0.0/8, ::1");
  CHECK(named.judge(make_address("127.0.0.1")) == Verdict::kAdmit);
  CHECK(named.judge(make_address("10.0.0.3")) == Verdict::kRefuse);
}

TEST_CASE("a one-node store on every address admits this host's addresses and loopback") {
  auto host = admit_this_host();
  CHECK(host.judge(make_address("127.0.0.1")) == Verdict::kAdmit);
  CHECK(host.judge(make_address("::1")) == Verdict::kAdmit);
  // The address this host reaches others from (a route out, where there is one).
  const std::string own = ddp::store::local_address_towards("192.0.2.1", 9);
  if (!own.empty()) CHECK(host.judge(make_address(own)) == Verdict::kAdmit);
  CHECK(host.judge(make_address("192.0.2.1")) == Verdict::kRefuse);  // TEST-NET-1: no host's
  CHECK(host.why().find("not this host") == 0);
}
