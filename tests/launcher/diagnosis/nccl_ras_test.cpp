// Asking NCCL's RAS service for its status, against a stand-in that speaks its protocol.
#include "diagnosis/nccl_ras.hpp"

#include <catch2/catch.hpp>
#include <chrono>

#include "fake_nccl_ras.hpp"

using namespace ddp::launcher;
using ddp::test::FakeNcclRas;

TEST_CASE("the RAS status is read after the handshake and the timeout, to the end") {
  const std::string report =
      "Job summary\n===========\n\nErrors\n======\n\nCommunicator 0x1 is missing rank 7\n";
  FakeNcclRas ras(report);
  const NcclRasStatus status = query_nccl_ras(ras.address(), std::chrono::seconds(10));
  INFO(status.error);
  REQUIRE(status.answered);
  CHECK(status.report == report);
  const auto sent = ras.received();
  REQUIRE(sent.size() == 3);
  CHECK(sent[0] == "CLIENT PROTOCOL 2");
  CHECK(sent[1] == "TIMEOUT 7");  // below ours (10 s), so that its answer comes in time
  CHECK(sent[2] == "STATUS");
}

TEST_CASE("a RAS address where nothing listens, or something else answers, says why") {
  std::string refused_address;
  {
    FakeNcclRas gone("");
    refused_address = gone.address();
  }  // closed: nothing listens there now
  const NcclRasStatus refused = query_nccl_ras(refused_address, std::chrono::seconds(5));
  CHECK_FALSE(refused.answered);
  CHECK_THAT(refused.error, Catch::Contains("refused"));

  FakeNcclRas other("", "HTTP/1.1 400 Bad Request\n");
  const NcclRasStatus wrong = query_nccl_ras(other.address(), std::chrono::seconds(5));
  CHECK_FALSE(wrong.answered);
  CHECK_THAT(wrong.error, Catch::StartsWith("not NCCL's RAS service: it answered \"HTTP/1.1"));

  FakeNcclRas silent("", "");
  const auto start = std::chrono::steady_clock::now();
  const NcclRasStatus quiet = query_nccl_ras(silent.address(), std::chrono::milliseconds(500));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK_FALSE(quiet.answered);
  CHECK_THAT(quiet.error, Catch::Contains("timed out"));

  const NcclRasStatus unresolved = query_nccl_ras("no-such-host.invalid:28028");
  CHECK_FALSE(unresolved.answered);
  CHECK_THAT(unresolved.error, Catch::StartsWith("cannot resolve no-such-host.invalid"));
}
