#pragma once
// A blocking TCP connection with read deadlines and a read buffer: what Client needs
// from the OS, behind one narrow class. Private to the rendezvous library.

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::store {

class TcpConnection {
 public:
  enum class Io { Ok, Timeout, Closed, Error };
  using Clock = std::chrono::steady_clock;

  // Connects to host:port, retrying refused or unreachable attempts with back-off until
  // deadline. Returns nullptr with `error` set (the last failure) when it never succeeded.
  static std::unique_ptr<TcpConnection> connect(const std::string& host, std::uint16_t port,
                                                Clock::time_point deadline, std::string& error);

  explicit TcpConnection(int fd);
  ~TcpConnection();
  TcpConnection(const TcpConnection&) = delete;
  TcpConnection& operator=(const TcpConnection&) = delete;

  // Sends every byte, each send waiting at most timeout for buffer space.
  Io send_all(std::string_view data, std::chrono::milliseconds timeout);
  // Reads exactly n bytes, all of them by deadline (Io::Timeout after it, however steadily
  // the bytes trickle in).
  Io read(char* dst, std::size_t n, Clock::time_point deadline);
  // The errno of the last Io::Error, as text.
  std::string last_error() const;

 private:
  bool set_timeout(int option, std::chrono::milliseconds timeout,
                   std::chrono::milliseconds& cached);

  int fd_;
  int errno_ = 0;
  std::vector<char> buffer_;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  std::chrono::milliseconds send_timeout_{-1};
};

}  // namespace ddp::store
