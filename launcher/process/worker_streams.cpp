#include "worker_streams.hpp"

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

// Sets up one stream; returns the fd the child should get (invalid: inherit).
UniqueFd route(bool teed, bool to_file, bool on_console, const std::filesystem::path& file,
               int console_fd, std::vector<WorkerStreams::Tee>& tees) {
  const int file_flags = O_WRONLY | O_CREAT | O_TRUNC;
  if (teed) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
      throw std::system_error(errno, std::generic_category(), "pipe");
    tees.push_back(
        {UniqueFd(fds[0]), open_or_throw(file, file_flags), file, on_console ? console_fd : -1});
    return UniqueFd(fds[1]);
  }
  if (to_file) return open_or_throw(file, file_flags);
  if (!on_console) return open_or_throw("/dev/null", O_WRONLY);
  return UniqueFd();
}

}  // namespace

WorkerStreams open_worker_streams(const LaunchConfig& config, int local_rank,
                                  const std::filesystem::path& dir, int console_out,
                                  int console_err) {
  const Std redirect = config.redirects.for_rank(local_rank);
  const Std tee = config.tee.for_rank(local_rank);
  const bool on_console =
      !config.local_ranks_filter || config.local_ranks_filter->contains(local_rank);
  WorkerStreams streams;
  streams.child_out = route(selects_stdout(tee), selects_stdout(redirect), on_console,
                            dir / "stdout.log", console_out, streams.tees);
  streams.child_err = route(selects_stderr(tee), selects_stderr(redirect), on_console,
                            dir / "stderr.log", console_err, streams.tees);
  return streams;
}

}  // namespace ddp::launcher
