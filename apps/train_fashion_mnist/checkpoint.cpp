#include "checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

namespace fmnist {

namespace {

constexpr char kMagic[8] = {'F', 'M', 'N', 'I', 'S', 'T', 'C', 'K'};
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kKeep = 2;  // checkpoints kept on disk

std::uint64_t fnv1a(const std::string& bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// Reads values from a byte string, throwing on a short read.
class Reader {
 public:
  Reader(const std::string& bytes, const std::filesystem::path& path)
      : bytes_(bytes), path_(path) {}
  template <typename T>
  T get() {
    T value;
    take(&value, sizeof value);
    return value;
  }
  void take(void* out, std::size_t n) {
    if (bytes_.size() - pos_ < n) throw CheckpointError(path_.string() + ": truncated");
    std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
  }
  std::size_t pos() const { return pos_; }

 private:
  const std::string& bytes_;
  const std::filesystem::path& path_;
  std::size_t pos_ = 0;
};

std::string encode(std::uint32_t epochs_done, const std::vector<std::span<const float>>& tensors) {
  std::string out(kMagic, sizeof kMagic);
  put(out, kVersion);
  put(out, epochs_done);
  put(out, static_cast<std::uint32_t>(tensors.size()));
  for (const auto& t : tensors) {
    put(out, static_cast<std::uint64_t>(t.size()));
    out.append(reinterpret_cast<const char*>(t.data()), t.size_bytes());
  }
  put(out, fnv1a(out));
  return out;
}

[[noreturn]] void fail(const std::filesystem::path& path, const char* what) {
  throw CheckpointError(path.string() + ": " + what + ": " + std::strerror(errno));
}

// Writes bytes to path and fsyncs it.
void write_synced(const std::filesystem::path& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "cannot create");
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      fail(path, "write failed");
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail(path, "fsync failed");
  }
  ::close(fd);
}

void sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(dir, "cannot open directory");
  ::fsync(fd);  // best effort: some file systems refuse fsync on directories
  ::close(fd);
}

std::string file_name(std::uint32_t epochs_done) {
  char name[32];
  std::snprintf(name, sizeof name, "epoch_%04u.ckpt", epochs_done);
  return name;
}

// epoch_NNNN.ckpt, at least four digits.
bool is_checkpoint_name(const std::string& name) {
  const std::string prefix = "epoch_", suffix = ".ckpt";
  if (name.size() < prefix.size() + 4 + suffix.size()) return false;
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  const auto digits =
      std::string_view(name).substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  return std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::filesystem::path write_checkpoint(const std::filesystem::path& dir, std::uint32_t epochs_done,
                                       const std::vector<std::span<const float>>& tensors) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw CheckpointError(dir.string() + ": cannot create directory: " + ec.message());
  const std::filesystem::path path = dir / file_name(epochs_done);
  std::filesystem::path temp = dir / file_name(epochs_done);
  temp.replace_extension(".ckpt.tmp");  // not matched by list_checkpoints
  write_synced(temp, encode(epochs_done, tensors));
  if (::rename(temp.c_str(), path.c_str()) != 0) fail(path, "rename failed");
  sync_directory(dir);
  const auto all = list_checkpoints(dir);
  for (std::size_t i = kKeep; i < all.size(); ++i) std::filesystem::remove(all[i], ec);
  return path;
}

Checkpoint read_checkpoint(const std::filesystem::path& path,
                           const std::vector<std::size_t>& expected_sizes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path.string() + ": cannot open");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Reader r(bytes, path);
  char magic[sizeof kMagic];
  r.take(magic, sizeof magic);
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0) {
    throw CheckpointError(path.string() + ": not a train_fashion_mnist checkpoint");
  }
  if (r.get<std::uint32_t>() != kVersion)
    throw CheckpointError(path.string() + ": unknown version");
  Checkpoint ck;
  ck.epochs_done = r.get<std::uint32_t>();
  const auto count = r.get<std::uint32_t>();
  if (count != expected_sizes.size()) {
    throw CheckpointError(path.string() + ": holds " + std::to_string(count) +
                          " tensors, expected " + std::to_string(expected_sizes.size()) +
                          " (a checkpoint of another model?)");
  }
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto n = r.get<std::uint64_t>();
    if (n != expected_sizes[i]) {
      throw CheckpointError(path.string() + ": tensor " + std::to_string(i) + " has " +
                            std::to_string(n) + " values, expected " +
                            std::to_string(expected_sizes[i]));
    }
    ck.tensors.emplace_back(n);
    r.take(ck.tensors.back().data(), n * sizeof(float));
  }
  const std::uint64_t sum = fnv1a(bytes.substr(0, r.pos()));
  if (r.get<std::uint64_t>() != sum || r.pos() != bytes.size()) {
    throw CheckpointError(path.string() + ": checksum mismatch (the file is damaged)");
  }
  return ck;
}

std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return found;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (is_checkpoint_name(entry.path().filename().string())) found.push_back(entry.path());
  }
  // Zero-padded names sort by epoch; a longer name (10000+ epochs) is a later one.
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    const auto sa = a.filename().string(), sb = b.filename().string();
    return sa.size() != sb.size() ? sa.size() > sb.size() : sa > sb;
  });
  return found;
}

}  // namespace fmnist
