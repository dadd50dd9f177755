#include "fashion_mnist.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>
#include <span>

namespace fmnist {

namespace {

constexpr std::uint32_t kImageMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr std::uint32_t kLabelMagic = 0x00000801;  // unsigned byte, 1 dimension

// A file read through zlib, which reads gzip and plain files alike.
class IdxFile {
 public:
  explicit IdxFile(const std::filesystem::path& path) : path_(path) {
    if (!std::filesystem::exists(path)) {
      throw DataError(path.string() + ": file not found (install the Debian package " +
                      "dataset-fashion-mnist, or pass --data DIR with the IDX files)");
    }
    file_.reset(gzopen(path.c_str(), "rb"));
    if (!file_) throw DataError(path.string() + ": cannot open for reading");
  }

  // Reads exactly out.size() bytes; `what` names them in the error.
  void read(std::span<std::uint8_t> out, const std::string& what) {
    std::size_t done = 0;
    while (done < out.size()) {
      const auto chunk = static_cast<unsigned>(std::min<std::size_t>(out.size() - done, 1u << 30));
      const int got = gzread(file_.get(), out.data() + done, chunk);
      if (got < 0) fail_corrupt();
      if (got == 0) {
        throw DataError(path_.string() + ": truncated: expected " + std::to_string(out.size()) +
                        " bytes of " + what + ", found " + std::to_string(done) +
                        " (re-install dataset-fashion-mnist or download the file again)");
      }
      done += static_cast<std::size_t>(got);
    }
  }

  std::uint32_t read_u32(const std::string& what) {
    std::array<std::uint8_t, 4> b{};
    read(b, what);
    return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
           std::uint32_t{b[3]};  // IDX is big-endian
  }

  // DataError unless the file ends here.
  void expect_end() {
    std::uint8_t extra = 0;
    const int got = gzread(file_.get(), &extra, 1);
    if (got < 0) fail_corrupt();
    if (got > 0) {
      throw DataError(path_.string() + ": corrupt: more data than its header announces");
    }
  }

  const std::filesystem::path& path() const { return path_; }

 private:
  [[noreturn]] void fail_corrupt() {
    int code = 0;
    const char* message = gzerror(file_.get(), &code);
    throw DataError(path_.string() + ": corrupt: " + (message ? message : "read error") +
                    " (re-install dataset-fashion-mnist or download the file again)");
  }

  struct Closer {
    void operator()(gzFile f) const { gzclose(f); }
  };
  std::filesystem::path path_;
  std::unique_ptr<gzFile_s, Closer> file_;
};

void expect_magic(IdxFile& file, std::uint32_t magic, const char* kind) {
  const std::uint32_t found = file.read_u32("header");
  if (found != magic) {
    char text[96];
    std::snprintf(text, sizeof text, ": not an IDX %s file (magic 0x%08x, expected 0x%08x)", kind,
                  found, magic);
    throw DataError(file.path().string() + text);
  }
}

std::vector<std::uint8_t> read_labels(const std::filesystem::path& path) {
  IdxFile file(path);
  expect_magic(file, kLabelMagic, "label");
  const std::uint32_t count = file.read_u32("header");
  std::vector<std::uint8_t> labels(count);
  file.read(labels, "labels");
  file.expect_end();
  const auto bad = std::find_if(labels.begin(), labels.end(), [](auto l) { return l >= kClasses; });
  if (bad != labels.end()) {
    throw DataError(path.string() + ": corrupt: label " + std::to_string(*bad) + " at index " +
                    std::to_string(bad - labels.begin()) + " (classes are 0-9)");
  }
  return labels;
}

std::vector<std::uint8_t> read_pixels(const std::filesystem::path& path, std::size_t& count) {
  IdxFile file(path);
  expect_magic(file, kImageMagic, "image");
  count = file.read_u32("header");
  const std::uint32_t rows = file.read_u32("header");
  const std::uint32_t cols = file.read_u32("header");
  if (rows != kImageSide || cols != kImageSide) {
    throw DataError(path.string() + ": images are " + std::to_string(rows) + "x" +
                    std::to_string(cols) + ", expected 28x28");
  }
  std::vector<std::uint8_t> pixels(count * kPixels);
  file.read(pixels, "pixels");
  file.expect_end();
  return pixels;
}

// dir/name, else dir/name.gz; the plain name (for the error) when neither exists.
std::filesystem::path find_file(const std::filesystem::path& dir, const std::string& name) {
  if (std::filesystem::exists(dir / name)) return dir / name;
  if (std::filesystem::exists(dir / (name + ".gz"))) return dir / (name + ".gz");
  return dir / (name + ".gz");
}

}  // namespace

Split read_split(const std::filesystem::path& images, const std::filesystem::path& labels) {
  std::size_t count = 0;
  const std::vector<std::uint8_t> pixels = read_pixels(images, count);
  Split split;
  split.labels = read_labels(labels);
  if (split.labels.size() != count) {
    throw DataError(images.string() + " holds " + std::to_string(count) + " images but " +
                    labels.string() + " holds " + std::to_string(split.labels.size()) +
                    " labels: the two files do not belong together");
  }
  split.images.resize(pixels.size());
  std::transform(pixels.begin(), pixels.end(), split.images.begin(),
                 [](std::uint8_t p) { return static_cast<float>(p) / 255.0f; });
  return split;
}

Dataset load_dataset(const std::filesystem::path& dir) {
  Dataset data;
  data.train = read_split(find_file(dir, "train-images-idx3-ubyte"),
                          find_file(dir, "train-labels-idx1-ubyte"));
  data.test = read_split(find_file(dir, "t10k-images-idx3-ubyte"),
                         find_file(dir, "t10k-labels-idx1-ubyte"));
  return data;
}

void normalize(Split& split) {
  for (float& x : split.images) x = (x - kPixelMean) / kPixelStd;
}

Split head(const Split& split, std::size_t n) {
  if (n == 0 || n >= split.size()) return split;
  Split out;
  out.labels.assign(split.labels.begin(), split.labels.begin() + static_cast<std::ptrdiff_t>(n));
  out.images.assign(split.images.begin(),
                    split.images.begin() + static_cast<std::ptrdiff_t>(n * kPixels));
  return out;
}

}  // namespace fmnist
