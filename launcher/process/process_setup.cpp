#include "ddp/launcher/process_setup.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <boost/system/system_error.hpp>
#include <cerrno>
#include <system_error>

#include "ddp/launcher/spawn_process.hpp"

namespace ddp::launcher {
namespace {

// The agent's own descriptors: standard streams, the store's listener, the event loop's
// epoll, signal and timer descriptors, the console writer's, the group reaper's pipe.
constexpr std::size_t kAgentDescriptors = 32;
// Per worker besides its teed streams: pidfd, exec report, and its store connections.
constexpr std::size_t kPerWorkerDescriptors = 4;

bool is_descriptor_error(int error) { return error == EMFILE || error == ENFILE; }

}  // namespace

bool open_missing_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // open() returns the lowest free descriptor: this one.
    int opened = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (opened < 0) return false;
    if (opened != fd) {  // (only if another thread raced us; keep the promise anyway)
      ::dup2(opened, fd);
      ::close(opened);
    }
  }
  return true;
}

rlim_t raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) return raised.rlim_cur;
  }
  return limit.rlim_cur;
}

std::size_t descriptors_needed(const LaunchConfig& config) {
  std::size_t needed = kAgentDescriptors;
  for (int rank = 0; rank < config.nproc_per_node; ++rank) {
    const Std tee = config.tee.for_rank(rank);
    needed += kPerWorkerDescriptors + 2 * (selects_stdout(tee) ? 1 : 0) +
              2 * (selects_stderr(tee) ? 1 : 0);
  }
  return needed;
}

bool is_out_of_descriptors(const std::exception& e) {
  if (const auto* system = dynamic_cast<const std::system_error*>(&e)) {
    return is_descriptor_error(system->code().value()) &&
           (system->code().category() == std::generic_category() ||
            system->code().category() == std::system_category());
  }
  if (const auto* spawn = dynamic_cast<const SpawnError*>(&e)) {
    return is_descriptor_error(spawn->error());
  }
  if (const auto* asio = dynamic_cast<const boost::system::system_error*>(&e)) {
    return is_descriptor_error(asio->code().value()) &&
           (asio->code().category() == boost::system::system_category() ||
            asio->code().category() == boost::system::generic_category());
  }
  return false;
}

std::string out_of_descriptors_message(const LaunchConfig& config, const std::exception& e) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  const std::string soft =
      limit.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(limit.rlim_cur);
  return "out of file descriptors starting " + std::to_string(config.nproc_per_node) +
         " workers (" + e.what() + "): the job needs about " +
         std::to_string(descriptors_needed(config)) + " descriptors and the limit is " + soft +
         " (ulimit -n; ddprun raised its soft limit to the hard limit already). Raise the hard "
         "limit (ulimit -Hn, limits.conf, or the container's nofile) or start fewer workers.";
}

}  // namespace ddp::launcher
