#include "worker_template.hpp"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <nlohmann/json.hpp>

namespace ddp::launcher {
namespace {

// The largest reply (a few hundred bytes in practice).
constexpr std::size_t kReplyBytes = 64 * 1024;

// "exit code 3", "signal SIGKILL": how the template ended, for the reason.
std::string describe_status(int status) {
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

SubreaperScope::SubreaperScope() {
  ::prctl(PR_GET_CHILD_SUBREAPER, &was_, 0, 0, 0);
  if (!was_) ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
}

SubreaperScope::~SubreaperScope() {
  if (!was_) ::prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
}

WorkerTemplate::WorkerTemplate(const WorkerTemplateOptions& options) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    const int error = errno;
    throw SpawnError(
        std::string("cannot start the warm template: socketpair: ") + std::strerror(error), error);
  }
  socket_ = UniqueFd(pair[0]);
  UniqueFd theirs(pair[1]);
  SpawnOptions spawn;
  spawn.program = options.program;
  spawn.argv = options.argv;
  env_ = options.env;
  std::erase_if(env_, [](const std::string& e) { return e.starts_with("DDPRUN_TEMPLATE_PAD="); });
  spawn.env = options.env;
  spawn.env.push_back("DDPRUN_TEMPLATE_FD=" + std::to_string(theirs.get()));
  spawn.stdout_fd = options.output_fd;
  spawn.stderr_fd = options.output_fd;
  spawn.inherit_fds = {theirs.get()};
  spawn.group_guard_fd = options.group_guard_fd;
  SpawnedProcess process = spawn_process(spawn);
  pid_ = process.pid;
  try {
    confirm_exec(process);
  } catch (...) {
    ::waitpid(pid_, nullptr, 0);
    pid_ = 0;
    throw;
  }
}

WorkerTemplate::~WorkerTemplate() {
  socket_.reset();
  if (pid_ <= 0) return;
  // Its own session and group (spawn_process); the group is only the template: the workers
  // it forked made sessions of their own.
  if (::kill(-pid_, SIGKILL) != 0) ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

void WorkerTemplate::gone(const std::string& why) {
  if (reason_.empty()) reason_ = why;
  socket_.reset();
  pending_ = 0;
  if (pid_ <= 0) return;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    reason_ = "the warm template " + describe_status(status);
    pid_ = 0;
  }
}

void WorkerTemplate::send(const std::string& message, const std::vector<int>& fds) {
  if (!socket_.valid()) return;
  iovec data{const_cast<char*>(message.data()), message.size()};
  msghdr header{};
  header.msg_iov = &data;
  header.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.assign(CMSG_SPACE(sizeof(int) * fds.size()), 0);
    header.msg_control = control.data();
    header.msg_controllen = control.size();
    cmsghdr* rights = CMSG_FIRSTHDR(&header);
    rights->cmsg_level = SOL_SOCKET;
    rights->cmsg_type = SCM_RIGHTS;
    rights->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(rights), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(socket_.get(), &header, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) gone(std::string("the warm template does not listen: ") + std::strerror(errno));
}

std::optional<std::string> WorkerTemplate::receive(std::chrono::milliseconds timeout) {
  if (!socket_.valid()) return std::nullopt;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd ready{socket_.get(), POLLIN, 0};
    const int n = ::poll(&ready, 1, static_cast<int>(std::max<long>(left.count(), 0)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;  // timed out (or poll failed: the same to the caller)
    std::string reply(kReplyBytes, '\0');
    const ssize_t got = ::recv(socket_.get(), reply.data(), reply.size(), MSG_DONTWAIT);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) {
      gone("the warm template exited");
      return std::nullopt;
    }
    reply.resize(static_cast<std::size_t>(got));
    return reply;
  }
}

void WorkerTemplate::on_prepared(const std::string& reply) {
  if (pending_ > 0) --pending_;
  try {
    const auto message = nlohmann::json::parse(reply);
    imported_ = message.value("modules", imported_);
    import_seconds_ += message.value("seconds", 0.0);
    if (message.contains("problem") && message["problem"].is_string() && reason_.empty()) {
      reason_ = message["problem"].get<std::string>();
      refused_ = true;
    }
    if (message.contains("stop") && message["stop"].is_string()) {
      stop_ = message["stop"].get<std::string>();
    }
  } catch (const nlohmann::json::exception& e) {
    gone(std::string("the warm template answered garbage: ") + e.what());
  }
}

void WorkerTemplate::prepare(const std::vector<std::string>& lists,
                             const std::vector<std::string>& own,
                             const std::vector<std::string>& varying,
                             const std::vector<std::string>& stop) {
  if (!reason_.empty()) return;
  send(
      nlohmann::json{
          {"op", "prepare"}, {"lists", lists}, {"own", own}, {"varying", varying}, {"stop", stop}}
          .dump(),
      {});
  if (socket_.valid()) ++pending_;
}

void WorkerTemplate::poll() {
  while (pending_ > 0) {
    auto reply = receive(std::chrono::milliseconds(0));
    if (!reply) return;
    on_prepared(*reply);
  }
  // Nothing asked: the socket is readable only when the template is gone (EOF).
  if (!socket_.valid()) return;
  pollfd ready{socket_.get(), POLLIN, 0};
  if (::poll(&ready, 1, 0) == 1) {
    char byte;
    if (::recv(socket_.get(), &byte, 1, MSG_DONTWAIT | MSG_PEEK) == 0) {
      gone("the warm template exited");
    }
  }
}

bool WorkerTemplate::wait_prepared(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (pending_ > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    auto reply = receive(std::max(left, std::chrono::milliseconds(0)));
    if (!reply) {
      if (reason_.empty()) {
        reason_ = "the warm template was still importing after " +
                  std::to_string(timeout.count() / 1000) + " s";
      }
      return false;
    }
    on_prepared(*reply);
  }
  return reason_.empty();
}

std::variant<pid_t, std::string> WorkerTemplate::spawn(const SpawnOptions& options,
                                                       const std::string& cwd,
                                                       std::chrono::milliseconds timeout,
                                                       bool blind) {
  if (!wait_prepared(timeout)) return reason_;
  std::vector<int> targets = {STDOUT_FILENO, STDERR_FILENO};
  std::vector<int> fds = {options.stdout_fd >= 0 ? options.stdout_fd : STDOUT_FILENO,
                          options.stderr_fd >= 0 ? options.stderr_fd : STDERR_FILENO};
  for (const int fd : options.inherit_fds) {
    targets.push_back(fd);
    fds.push_back(fd);
  }
  int guard = -1;
  if (options.group_guard_fd >= 0) {
    guard = static_cast<int>(fds.size());
    fds.push_back(options.group_guard_fd);
  }
  const nlohmann::json request = {{"op", "spawn"},  {"argv", options.argv}, {"env", options.env},
                                  {"cwd", cwd},     {"cpus", options.cpus}, {"fds", targets},
                                  {"guard", guard}, {"agent", ::getpid()},  {"given", env_},
                                  {"blind", blind}};
  // The worker is the template's grandchild until its parent exits: the orphan comes here.
  SubreaperScope subreaper;
  send(request.dump(), fds);
  for (;;) {
    auto reply = receive(timeout);
    if (!reply) {
      if (reason_.empty())
        reason_ = "the warm template did not answer within " +
                  std::to_string(timeout.count() / 1000) + " s";
      return reason_;
    }
    try {
      const auto message = nlohmann::json::parse(*reply);
      const std::string op = message.value("op", "");
      if (op == "spawned") return static_cast<pid_t>(message.at("pid").get<int>());
      if (op == "cold") {
        if (message.contains("stop") && message["stop"].is_string()) {
          stop_ = message["stop"].get<std::string>();
        }
        return message.value("reason", std::string("the template refused"));
      }
      if (op == "prepared") on_prepared(*reply);
    } catch (const nlohmann::json::exception& e) {
      gone(std::string("the warm template answered garbage: ") + e.what());
      return reason_;
    }
  }
}

}  // namespace ddp::launcher
