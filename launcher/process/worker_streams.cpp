#include "process/worker_streams.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <system_error>

namespace ddp::launcher {
namespace {

UniqueFd open_or_throw(const std::filesystem::path& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "open " + path.string());
  return UniqueFd(fd);
}

UniqueFd make_pipe(UniqueFd& read_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
  read_end = UniqueFd(fds[0]);
  return UniqueFd(fds[1]);
}

// Sets up one stream; returns the fd the child should get (invalid: inherit).
UniqueFd route(bool teed, bool to_file, bool on_console, bool is_stderr,
               const std::filesystem::path& file, int console_fd, bool append,
               WorkerStreams& streams) {
  const int file_flags = O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC);
  WorkerStreams::Tee tee;
  tee.is_stderr = is_stderr;
  tee.console_fd = on_console ? console_fd : -1;
  if (teed) {
    UniqueFd write_end = make_pipe(tee.read_end);
    tee.file = open_or_throw(file, file_flags);
    tee.file_path = file;
    streams.tees.push_back(std::move(tee));
    return write_end;
  }
  if (to_file) {
    return open_or_throw(file, file_flags);
  }
  if (!on_console) return open_or_throw("/dev/null", O_WRONLY);
  return UniqueFd();
}

}  // namespace

WorkerStreams open_worker_streams(const LaunchConfig& config, int local_rank,
                                  const std::filesystem::path& dir, int console_out,
                                  int console_err, bool append) {
  const Std redirect = config.redirects.for_rank(local_rank);
  const Std tee = config.tee.for_rank(local_rank);
  const bool on_console =
      !config.local_ranks_filter || config.local_ranks_filter->contains(local_rank);
  WorkerStreams streams;
  streams.child_out = route(selects_stdout(tee), selects_stdout(redirect), on_console, false,
                            dir / "stdout.log", console_out, append, streams);
  streams.child_err = route(selects_stderr(tee), selects_stderr(redirect), on_console, true,
                            dir / "stderr.log", console_err, append, streams);
  return streams;
}

}  // namespace ddp::launcher
