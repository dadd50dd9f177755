// Checkpoints: round trip, newest first, the two newest kept, damaged files refused.
#include "checkpoint.hpp"

#include <catch2/catch.hpp>
#include <fstream>

#include "test_support.hpp"

namespace {

std::filesystem::path save(const std::filesystem::path& dir, std::uint32_t epoch, float value) {
  const std::vector<float> a(5, value), b(3, -value);
  return fmnist::write_checkpoint(dir, epoch, {a, b});
}

}  // namespace

TEST_CASE("a checkpoint reads back what was written") {
  ddp::test::TempDir dir;
  const auto path = save(dir.path() / "ck", 3, 1.5f);
  CHECK(path.filename() == "epoch_0003.ckpt");
  const auto ck = fmnist::read_checkpoint(path, {5, 3});
  CHECK(ck.epochs_done == 3);
  REQUIRE(ck.tensors.size() == 2);
  CHECK(ck.tensors[0] == std::vector<float>(5, 1.5f));
  CHECK(ck.tensors[1] == std::vector<float>(3, -1.5f));
  // No temporary file left behind.
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path() / "ck"),
                      std::filesystem::directory_iterator()) == 1);
}

TEST_CASE("checkpoints list newest first and only the two newest are kept") {
  ddp::test::TempDir dir;
  for (std::uint32_t e = 1; e <= 4; ++e) save(dir.path(), e, static_cast<float>(e));
  const auto all = fmnist::list_checkpoints(dir.path());
  REQUIRE(all.size() == 2);
  CHECK(all[0].filename() == "epoch_0004.ckpt");
  CHECK(all[1].filename() == "epoch_0003.ckpt");
  CHECK(fmnist::list_checkpoints(dir.path() / "absent").empty());
}

TEST_CASE("a truncated, damaged or foreign checkpoint is refused with the reason") {
  ddp::test::TempDir dir;
  const auto path = save(dir.path(), 1, 2.0f);
  CHECK_THROWS_WITH(fmnist::read_checkpoint(path, {5, 4}),
                    Catch::Contains("tensor 1 has 3 values, expected 4"));
  CHECK_THROWS_WITH(fmnist::read_checkpoint(path, {5}), Catch::Contains("holds 2 tensors"));
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::string flipped = bytes;
  flipped[30] ^= 1;
  std::ofstream(path, std::ios::binary) << flipped;
  CHECK_THROWS_WITH(fmnist::read_checkpoint(path, {5, 3}), Catch::Contains("checksum mismatch"));
  std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() - 5);
  CHECK_THROWS_WITH(fmnist::read_checkpoint(path, {5, 3}), Catch::Contains("truncated"));
  std::ofstream(path, std::ios::binary) << "hello world, not a checkpoint";
  CHECK_THROWS_WITH(fmnist::read_checkpoint(path, {5, 3}), Catch::Contains("not a train_fashion"));
}
