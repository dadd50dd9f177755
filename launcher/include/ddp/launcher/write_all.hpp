#pragma once
// Writing a whole buffer to a descriptor: the one write loop of the launcher (log files, the
// console, test pipes).

#include <cstddef>

namespace ddp::launcher {

// Writes all of data to fd, retrying short writes and EINTR, and waiting (10 s at most) when
// a non-blocking fd is full. Returns false on error or timeout.
bool write_all(int fd, const char* data, std::size_t size);

// write_all that says how far it got: the bytes written, and in *error the errno of the
// failure (ETIMEDOUT for the timeout) or 0 when all were written.
std::size_t write_all_counted(int fd, const char* data, std::size_t size, int* error);

}  // namespace ddp::launcher
