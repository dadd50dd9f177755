#pragma once
// The Fashion-MNIST data set read from its IDX files (plain or gzip-compressed, as Debian's
// dataset-fashion-mnist installs them), checked before use.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace fmnist {

// Where Debian's dataset-fashion-mnist puts the files.
inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int kImageSide = 28;
inline constexpr std::size_t kPixels = kImageSide * kImageSide;  // 784
inline constexpr int kClasses = 10;

// A file that is missing, truncated or not what it claims to be; the message names the file,
// what was wrong and what to do.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One split: images as floats in [0, 1] (pixel / 255), row-major, kPixels per image.
struct Split {
  std::vector<float> images;         // size() * kPixels
  std::vector<std::uint8_t> labels;  // one class 0..9 per image
  std::size_t size() const { return labels.size(); }
  const float* image(std::size_t i) const { return images.data() + i * kPixels; }
};

struct Dataset {
  Split train;  // 60,000 images in the full set
  Split test;   // 10,000 images
};

// Reads an IDX image file (magic 0x00000803, N x 28 x 28 bytes) and its label file (magic
// 0x00000801, N bytes). Either may be gzip-compressed. DataError when a file is missing,
// unreadable, truncated, longer than its header says, has the wrong magic or dimensions, a
// label above 9, or when the two files disagree on N.
Split read_split(const std::filesystem::path& images, const std::filesystem::path& labels);

// The four standard files in dir, each as NAME or NAME.gz (train-images-idx3-ubyte, ...).
Dataset load_dataset(const std::filesystem::path& dir);

// Fashion-MNIST's training-set pixel mean and standard deviation (of pixel / 255).
inline constexpr float kPixelMean = 0.2860f;
inline constexpr float kPixelStd = 0.3530f;

// Standardises every pixel: (x - kPixelMean) / kPixelStd. SGD trains faster on inputs
// centred at 0 than on [0, 1].
void normalize(Split& split);

// The first n images of a split (all of them when n is 0 or above its size).
Split head(const Split& split, std::size_t n);

}  // namespace fmnist
