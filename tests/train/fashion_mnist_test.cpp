// Reading Fashion-MNIST's IDX files: valid files (plain and gzip) and every way a file can be
// wrong, each with an error that names the file and the problem.
#include "fashion_mnist.hpp"

#include <zlib.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "skip.hpp"
#include "test_support.hpp"

namespace {

using fmnist::DataError;

std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

std::string image_file(std::uint32_t count, std::uint32_t side = 28, std::uint32_t magic = 0x803) {
  std::string bytes = be32(magic) + be32(count) + be32(side) + be32(side);
  for (std::uint32_t i = 0; i < count * side * side; ++i)
    bytes.push_back(static_cast<char>(i % 256));
  return bytes;
}

std::string label_file(std::uint32_t count, std::uint32_t magic = 0x801) {
  std::string bytes = be32(magic) + be32(count);
  for (std::uint32_t i = 0; i < count; ++i) bytes.push_back(static_cast<char>(i % 10));
  return bytes;
}

std::filesystem::path write(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::filesystem::path write_gz(const std::filesystem::path& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
  return path;
}

}  // namespace

TEST_CASE("a valid image and label file pair is read and scaled to [0, 1]") {
  ddp::test::TempDir dir;
  const auto split = fmnist::read_split(write(dir.path() / "i", image_file(3)),
                                        write(dir.path() / "l", label_file(3)));
  REQUIRE(split.size() == 3);
  REQUIRE(split.images.size() == 3 * 784);
  CHECK(split.images[1] == Approx(1.0f / 255));
  CHECK(split.images[255] == 1.0f);
  CHECK(split.labels[2] == 2);
}

TEST_CASE("gzip-compressed files are read like plain ones, found as NAME.gz") {
  ddp::test::TempDir dir;
  write_gz(dir.path() / "train-images-idx3-ubyte.gz", image_file(4));
  write_gz(dir.path() / "train-labels-idx1-ubyte.gz", label_file(4));
  write(dir.path() / "t10k-images-idx3-ubyte", image_file(2));
  write(dir.path() / "t10k-labels-idx1-ubyte", label_file(2));
  const auto data = fmnist::load_dataset(dir.path());
  CHECK(data.train.size() == 4);
  CHECK(data.test.size() == 2);
  CHECK(fmnist::head(data.train, 3).size() == 3);
  CHECK(fmnist::head(data.train, 0).size() == 4);
}

TEST_CASE("a missing file names the file and the package to install") {
  ddp::test::TempDir dir;
  REQUIRE_THROWS_WITH(fmnist::load_dataset(dir.path()),
                      Catch::Contains("train-images-idx3-ubyte.gz: file not found") &&
                          Catch::Contains("dataset-fashion-mnist") && Catch::Contains("--data"));
}

TEST_CASE("a truncated file says how many bytes were expected and found") {
  ddp::test::TempDir dir;
  std::string images = image_file(2);
  images.resize(images.size() - 100);
  const auto i = write(dir.path() / "i", images);
  const auto l = write(dir.path() / "l", label_file(2));
  REQUIRE_THROWS_WITH(fmnist::read_split(i, l),
                      Catch::Contains("truncated: expected 1568 bytes of pixels, found 1468"));
  write(i, be32(0x803).substr(0, 3));
  REQUIRE_THROWS_WITH(fmnist::read_split(i, l),
                      Catch::Contains("truncated") && Catch::Contains("of header"));
}

TEST_CASE("a wrong magic number, size or label is reported as corrupt") {
  ddp::test::TempDir dir;
  const auto l = write(dir.path() / "l", label_file(2));
  const auto i = dir.path() / "i";
  write(i, image_file(2, 28, 0x801));
  CHECK_THROWS_WITH(
      fmnist::read_split(i, l),
      Catch::Contains("not an IDX image file (magic 0x00000801, expected 0x00000803)"));
  write(i, image_file(2, 27));
  CHECK_THROWS_WITH(fmnist::read_split(i, l), Catch::Contains("images are 27x27, expected 28x28"));
  write(i, image_file(2) + "x");
  CHECK_THROWS_WITH(fmnist::read_split(i, l), Catch::Contains("more data than its header"));
  write(i, image_file(3));
  CHECK_THROWS_WITH(fmnist::read_split(i, l),
                    Catch::Contains("holds 3 images but") && Catch::Contains("2 labels"));
  write(i, image_file(2));
  std::string labels = label_file(2);
  labels.back() = 12;
  CHECK_THROWS_WITH(fmnist::read_split(i, write(l, labels)),
                    Catch::Contains("label 12 at index 1"));
}

TEST_CASE("a damaged gzip stream is reported as corrupt") {
  ddp::test::TempDir dir;
  const auto i = write_gz(dir.path() / "i.gz", image_file(50));
  std::string bytes;
  {
    std::ifstream in(i, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  for (std::size_t k = 20; k < bytes.size() - 8; k += 7) bytes[k] = static_cast<char>(~bytes[k]);
  write(i, bytes);
  const auto l = write(dir.path() / "l", label_file(50));
  REQUIRE_THROWS_WITH(fmnist::read_split(i, l), Catch::Contains("i.gz: corrupt"));
}

TEST_CASE("the installed data set reads as 60,000 + 10,000 images") {
  if (!std::filesystem::exists(std::filesystem::path(fmnist::kDefaultDataDir) /
                               "t10k-labels-idx1-ubyte.gz")) {
    return ddp::test::skip("dataset-fashion-mnist is not installed (scripts/setup installs it)");
  }
  const auto data = fmnist::load_dataset(fmnist::kDefaultDataDir);
  CHECK(data.train.size() == 60000);
  CHECK(data.test.size() == 10000);
}
