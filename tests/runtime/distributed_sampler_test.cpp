#include "ddp/distributed_sampler.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <set>
#include <sstream>

#include "ddp/logger.hpp"
#include "ddp/rank_zero_first.hpp"
#include "skip.hpp"
#include "test_support.hpp"

using ddp::DistributedSampler;
using ddp::DistributedSamplerOptions;

namespace {

std::vector<std::vector<std::size_t>> all_ranks(std::size_t n, int replicas,
                                                DistributedSamplerOptions options,
                                                std::uint64_t epoch = 0) {
  std::vector<std::vector<std::size_t>> out;
  for (int r = 0; r < replicas; ++r) {
    DistributedSampler sampler(n, replicas, r, options);
    sampler.set_epoch(epoch);
    out.push_back(sampler.indices());
    REQUIRE(out.back().size() == sampler.size());
  }
  return out;
}

}  // namespace

TEST_CASE("sampler: ranks are disjoint and together cover the dataset once (divisible)") {
  for (bool shuffle : {false, true}) {
    auto ranks = all_ranks(99, 3, {shuffle, 7, false});
    std::multiset<std::size_t> seen;
    for (const auto& r : ranks) seen.insert(r.begin(), r.end());
    REQUIRE(seen.size() == 99);
    for (std::size_t i = 0; i < 99; ++i) REQUIRE(seen.count(i) == 1);
  }
}

TEST_CASE("sampler: padding wraps around, drop_last cuts the tail") {
  DistributedSamplerOptions padded{false, 0, false};
  auto ranks = all_ranks(10, 4, padded);  // 12 slots: indices 0..9 then 0, 1
  REQUIRE(ranks[0] == std::vector<std::size_t>{0, 4, 8});
  REQUIRE(ranks[2] == std::vector<std::size_t>{2, 6, 0});
  REQUIRE(ranks[3] == std::vector<std::size_t>{3, 7, 1});
  auto dropped = all_ranks(10, 4, {false, 0, true});  // 8 slots
  REQUIRE(dropped[3] == std::vector<std::size_t>{3, 7});
  // More padding than data: wraps more than once.
  auto tiny = all_ranks(2, 5, padded);
  REQUIRE(tiny[4] == std::vector<std::size_t>{0});
  REQUIRE(all_ranks(0, 3, padded)[1].empty());
}

TEST_CASE("sampler: the shuffle depends on seed + epoch only, the same on every rank") {
  DistributedSamplerOptions options{true, 42, false};
  auto epoch0 = all_ranks(1000, 4, options, 0);
  auto again = all_ranks(1000, 4, options, 0);
  auto epoch1 = all_ranks(1000, 4, options, 1);
  REQUIRE(epoch0 == again);   // identical wherever it is computed
  REQUIRE(epoch0 != epoch1);  // set_epoch changes the order
  std::vector<std::size_t> sorted0, sorted1;
  for (int r = 0; r < 4; ++r) {
    sorted0.insert(sorted0.end(), epoch0[r].begin(), epoch0[r].end());
    sorted1.insert(sorted1.end(), epoch1[r].begin(), epoch1[r].end());
  }
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  REQUIRE(sorted0 == sorted1);  // same set, different order
  options.seed = 43;
  REQUIRE(all_ranks(1000, 4, options, 0) != epoch0);
}

TEST_CASE("sampler: a rank outside the world is refused") {
  REQUIRE_THROWS_AS(DistributedSampler(10, 2, 2), std::invalid_argument);
}

TEST_CASE("sampler: shuffle off gives exactly PyTorch's indices", "[torch]") {
  if (!ddp::test::torch_available()) {
    return ddp::test::skip(ddp::test::torch_python() + " cannot import torch");
  }
  struct Case {
    std::size_t n;
    int replicas;
    int rank;
    bool drop_last;
  };
  std::vector<Case> cases;
  for (std::size_t n : {0u, 1u, 7u, 10u, 12u, 101u}) {
    for (int replicas : {1, 3, 4}) {
      for (int rank = 0; rank < replicas; ++rank) {
        for (bool drop : {false, true}) cases.push_back({n, replicas, rank, drop});
      }
    }
  }
  std::string command = ddp::test::torch_python() + " " +
                        ddp::test::source_path("tests/runtime/sampler_reference.py").string();
  for (const auto& c : cases) {
    command += " " + std::to_string(c.n) + "," + std::to_string(c.replicas) + "," +
               std::to_string(c.rank) + "," + (c.drop_last ? "1" : "0");
  }
  const auto result = ddp::test::run_shell(command + " 2>/dev/null", 120);
  REQUIRE(result.status == 0);
  std::istringstream lines(result.output);
  for (const auto& c : cases) {
    std::string line;
    REQUIRE(std::getline(lines, line));
    std::istringstream numbers(line);
    std::vector<std::size_t> expected;
    for (std::size_t v; numbers >> v;) expected.push_back(v);
    DistributedSampler sampler(c.n, c.replicas, c.rank, {false, 0, c.drop_last});
    INFO("n=" << c.n << " replicas=" << c.replicas << " rank=" << c.rank
              << " drop_last=" << c.drop_last);
    REQUIRE(sampler.indices() == expected);
  }
}

TEST_CASE("rank_seed differs across ranks and is reproducible") {
  REQUIRE(ddp::rank_seed(1, 0) != ddp::rank_seed(1, 1));
  REQUIRE(ddp::rank_seed(1, 0) != ddp::rank_seed(2, 0));
  REQUIRE(ddp::rank_seed(5, 3) == ddp::rank_seed(5, 3));
}

TEST_CASE("logger: rank 0 by default, every rank on request") {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::tmpfile(), std::fclose);
  ddp::Logger rank0(0, false, file.get());
  ddp::Logger rank1(1, false, file.get());
  rank0.info("epoch ", 3, " loss ", 0.5);
  rank1.info("hidden");
  rank1.set_all_ranks(true);
  rank1.info("shown");
  std::rewind(file.get());
  char buffer[256] = {};
  const std::size_t n = std::fread(buffer, 1, sizeof buffer - 1, file.get());
  REQUIRE(std::string(buffer, n) == "[rank 0] epoch 3 loss 0.5\n[rank 1] shown\n");
}
