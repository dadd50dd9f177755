// Network and Admission: which peers a store serves, refuses or holds.

#include "ddp/store/admission.hpp"

#include <catch2/catch.hpp>
#include <stdexcept>

using namespace ddp::store;
using boost::asio::ip::make_address;
using Verdict = Admission::Verdict;

TEST_CASE("Network: hosts, prefixes, IPv4-mapped peers and bad text") {
  CHECK(Network::parse("10.0.0.5").contains(make_address("10.0.0.5")));
  CHECK_FALSE(Network::parse("10.0.0.5").contains(make_address("10.0.0.6")));
  CHECK(Network::parse("10.0.0.0/8").contains(make_address("10.255.1.2")));
  CHECK_FALSE(Network::parse("10.0.0.0/8").contains(make_address("11.0.0.1")));
  CHECK(Network::parse("10.77.1.0/25").contains(make_address("10.77.1.127")));
  CHECK_FALSE(Network::parse("10.77.1.0/25").contains(make_address("10.77.1.128")));
  CHECK(Network::parse("0.0.0.0/0").contains(make_address("192.0.2.1")));
  CHECK(Network::parse("fd00::/8").contains(make_address("fd12::1")));
  CHECK_FALSE(Network::parse("fd00::/8").contains(make_address("fe80::1")));
  // A dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d.
  CHECK(Network::parse("10.0.0.5").contains(make_address("::ffff:10.0.0.5")));
  CHECK(Network::host(make_address("::ffff:10.0.0.5")).to_string() == "10.0.0.5");
  // No family crosses over.
  CHECK_FALSE(Network::parse("0.0.0.0/0").contains(make_address("::1")));
  CHECK(Network::parse("10.0.0.0/8").to_string() == "10.0.0.0/8");
  CHECK(Network::parse("::1").to_string() == "::1");
  CHECK_THROWS_AS(Network::parse("node1"), std::invalid_argument);
  CHECK_THROWS_AS(Network::parse("10.0.0.0/33"), std::invalid_argument);
  CHECK_THROWS_AS(Network::parse("10.0.0.0/"), std::invalid_argument);
  CHECK_THROWS_AS(Network::parse("10.0.0.0/x"), std::invalid_argument);
}

TEST_CASE("Network::loopback covers every 127/8 address and ::1, nothing else") {
  Admission loopback = Admission::only(Network::loopback(), "not local");
  CHECK(loopback.judge(make_address("127.0.0.1")) == Verdict::kAdmit);
  CHECK(loopback.judge(make_address("127.3.2.1")) == Verdict::kAdmit);
  CHECK(loopback.judge(make_address("::1")) == Verdict::kAdmit);
  CHECK(loopback.judge(make_address("::ffff:127.0.0.1")) == Verdict::kAdmit);
  CHECK(loopback.judge(make_address("10.0.0.1")) == Verdict::kRefuse);
  CHECK(loopback.judge(make_address("::2")) == Verdict::kRefuse);
}

TEST_CASE("Admission: anyone admits all, only refuses the unlisted, pending holds them") {
  const auto member = make_address("10.77.1.2");
  const auto stranger = make_address("10.77.1.3");
  CHECK(Admission::anyone().judge(stranger) == Verdict::kAdmit);
  CHECK(Admission::anyone().admits_anyone());
  CHECK(Admission::anyone().describe() == "every address");

  Admission only = Admission::only({Network::host(member)}, "not a node of this job");
  CHECK(only.judge(member) == Verdict::kAdmit);
  CHECK(only.judge(stranger) == Verdict::kRefuse);
  CHECK(only.why() == "not a node of this job");
  CHECK_FALSE(only.admits_anyone());
  CHECK_FALSE(only.is_pending());
  CHECK(only.describe() == "10.77.1.2");

  Admission pending = Admission::pending(Network::loopback());
  CHECK(pending.is_pending());
  CHECK(pending.judge(make_address("127.0.0.1")) == Verdict::kAdmit);
  CHECK(pending.judge(stranger) == Verdict::kHold);
  CHECK(pending.describe() == "127.0.0.0/8, ::1");

  CHECK(Admission::only({}, "closed").judge(member) == Verdict::kRefuse);
  CHECK(Admission::only({}, "closed").describe() == "no address");
}
