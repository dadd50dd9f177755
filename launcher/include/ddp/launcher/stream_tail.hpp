#pragma once
// The last bytes of a worker's stream, kept in memory for the agent to read after the worker
// ended (its Python stack dump, say). Bounded: holds at least the last `capacity` bytes and
// at most twice that. Not thread-safe: written and read on the agent's loop.

#include <cstddef>
#include <string>

namespace ddp::launcher {

class StreamTail {
 public:
  static constexpr std::size_t kDefaultCapacity = 256 * 1024;

  explicit StreamTail(std::size_t capacity = kDefaultCapacity) : capacity_(capacity) {}

  void append(const char* data, std::size_t size) {
    text_.append(data, size);
    if (text_.size() > 2 * capacity_) text_.erase(0, text_.size() - capacity_);
  }
  const std::string& text() const { return text_; }

 private:
  std::size_t capacity_;
  std::string text_;
};

}  // namespace ddp::launcher
