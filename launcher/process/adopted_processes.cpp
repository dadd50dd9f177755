#include "process/adopted_processes.hpp"

#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace ddp::launcher {
namespace {

namespace fs = std::filesystem;

// ddprun's children, from every thread's /proc/self/task/<tid>/children.
std::vector<pid_t> children() {
  std::vector<pid_t> found;
  std::error_code ec;
  for (const auto& task : fs::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(task.path() / "children");
    pid_t pid = 0;
    while (in >> pid) found.push_back(pid);
  }
  return found;
}

// The session of pid, from /proc/<pid>/stat (the 6th field, after the name in parentheses);
// -1 when it is gone.
pid_t session_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto name_end = stat.rfind(')');
  if (name_end == std::string::npos) return -1;
  std::istringstream fields(stat.substr(name_end + 1));
  std::string state;
  pid_t parent = 0, group = 0, session = -1;
  fields >> state >> parent >> group >> session;
  return fields ? session : -1;
}

std::string name_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name.empty() ? "?" : name;
}

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream out;
  out << static_cast<double>(ms.count()) / 1000.0 << " s";
  return out.str();
}

}  // namespace

AdoptedProcesses::AdoptedProcesses(boost::asio::io_context& io, GroupReaper& reaper, IsOwn is_own)
    : io_(io), reaper_(reaper), is_own_(std::move(is_own)), scan_timer_(io), wait_timer_(io) {}

AdoptedProcesses::~AdoptedProcesses() {
  scan_timer_.cancel();
  wait_timer_.cancel();
  signal_all(SIGKILL);
  for (const auto& entry : adopted_) {
    while (::waitpid(entry.first, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  for (const auto& entry : groups_) reaper_.forget(entry.first);
}

void AdoptedProcesses::start() {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  scan();
  schedule_scan();
}

void AdoptedProcesses::schedule_scan() {
  scan_timer_.expires_after(kAdoptionScanInterval);
  scan_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec || on_all_exited_) return;  // cancelled, or the end's wait has begun
    scan();
    schedule_scan();
  });
}

void AdoptedProcesses::scan() {
  const pid_t own_session = ::getsid(0);
  std::set<pid_t> seen;
  for (pid_t pid : children()) {
    if (adopted_.count(pid) || is_own_(pid)) continue;
    const pid_t session = session_of(pid);
    if (session < 0 || session == own_session) continue;  // gone, or a tool of ddprun's
    if (seen_once_.count(pid)) {
      adopt(pid);
    } else {
      seen.insert(pid);
    }
  }
  seen_once_ = std::move(seen);
}

void AdoptedProcesses::adopt(pid_t pid) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {  // gone between the look and now: reap it if it is a zombie of ours
    ::waitpid(pid, nullptr, WNOHANG);
    return;
  }
  Adopted adopted;
  adopted.name = name_of(pid);
  // Its group now, and the group it leads once it calls setsid (it may not have yet: a
  // daemon's double fork takes a moment), both killed by the reaper if ddprun dies.
  adopted.pgid = ::getpgid(pid);
  hold_group(pid);
  if (adopted.pgid > 0 && adopted.pgid != pid) hold_group(adopted.pgid);
  adopted.pidfd = std::make_unique<boost::asio::posix::stream_descriptor>(io_, fd);
  adopted.pidfd->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                            [this, pid](boost::system::error_code ec) {
                              if (!ec) on_exit(pid);
                            });
  adopted_.emplace(pid, std::move(adopted));
}

void AdoptedProcesses::hold_group(pid_t pgid) {
  if (groups_[pgid]++ == 0) reaper_.watch(pgid);
}

void AdoptedProcesses::release_group(pid_t pgid) {
  auto group = groups_.find(pgid);
  if (group == groups_.end() || --group->second > 0) return;
  groups_.erase(group);
  reaper_.forget(pgid);
}

void AdoptedProcesses::on_exit(pid_t pid) {
  auto it = adopted_.find(pid);
  if (it == adopted_.end()) return;
  while (::waitpid(pid, nullptr, WNOHANG) < 0 && errno == EINTR) {
  }
  release_group(pid);
  if (it->second.pgid > 0 && it->second.pgid != pid) release_group(it->second.pgid);
  adopted_.erase(it);
  if (adopted_.empty() && on_all_exited_) {
    wait_timer_.cancel();
    auto done = std::move(on_all_exited_);
    on_all_exited_ = nullptr;
    done();
  }
}

std::string AdoptedProcesses::describe() const {
  std::string text;
  for (const auto& [pid, adopted] : adopted_) {
    if (!text.empty()) text += ", ";
    const std::string name = name_of(pid);  // now: it may have exec'd since its adoption
    text += "pid " + std::to_string(pid) + " (" + (name != "?" ? name : adopted.name) + ")";
  }
  return text;
}

void AdoptedProcesses::signal_all(int signal) {
  for (const auto& entry : groups_) ::kill(-entry.first, signal);  // ESRCH: not a group (yet)
  for (const auto& entry : adopted_) ::kill(entry.first, signal);
}

void AdoptedProcesses::wait_all(std::chrono::milliseconds grace,
                                std::chrono::milliseconds kill_after,
                                std::function<void(const std::string&)> notice,
                                std::function<void()> done) {
  scan_timer_.cancel();
  // Every worker has exited: whatever child is not ddprun's own is one they left.
  scan();
  for (pid_t pid : std::set<pid_t>(seen_once_)) adopt(pid);
  seen_once_.clear();
  if (adopted_.empty()) return done();
  notice("ddprun: waiting up to " + seconds(grace) + " for " + std::to_string(adopted_.size()) +
         " process(es) the workers left running: " + describe() +
         " (--restart_policy=none: nothing outlives the job)");
  on_all_exited_ = std::move(done);  // on_exit cancels the timer first
  wait_timer_.expires_after(grace);
  wait_timer_.async_wait([this, kill_after, notice](boost::system::error_code ec) {
    if (ec || adopted_.empty()) return;
    notice("ddprun: still running after the wait: " + describe() + "; sending SIGTERM");
    signal_all(SIGTERM);
    wait_timer_.expires_after(kill_after);
    wait_timer_.async_wait([this, notice](boost::system::error_code ec2) {
      if (ec2 || adopted_.empty()) return;
      notice("ddprun: still running after SIGTERM: " + describe() + "; sending SIGKILL");
      signal_all(SIGKILL);
    });
  });
}

}  // namespace ddp::launcher
