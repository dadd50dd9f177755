#include "process/worker_template.hpp"

#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ddp/common/worker_contract.hpp"
#include "ddp/launcher/unique_fd.hpp"

namespace ddp::launcher {
namespace {

using namespace contract::warm_template;

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

WorkerTemplate::WorkerTemplate(boost::asio::io_context& io, const WorkerTemplateOptions& options)
    : io_(io), socket_(io), timer_(io) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    const int error = errno;
    throw SpawnError(
        std::string("cannot start the warm template: socketpair: ") + std::strerror(error), error);
  }
  socket_.assign(pair[0]);
  UniqueFd theirs(pair[1]);
  SpawnOptions spawn;
  spawn.program = options.program;
  spawn.argv = options.argv;
  env_ = options.env;
  std::erase_if(env_, [](const std::string& e) {
    return e.starts_with(std::string(contract::kTemplatePad) + "=");
  });
  spawn.env = options.env;
  spawn.env.push_back(std::string(contract::kTemplateFd) + "=" + std::to_string(theirs.get()));
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
  watch();
}

WorkerTemplate::~WorkerTemplate() {
  alive_.reset();  // the handlers still queued see it and return
  kill_and_reap();
}

void WorkerTemplate::kill_and_reap() {
  boost::system::error_code ignored;
  socket_.close(ignored);
  timer_.cancel(ignored);
  if (pid_ <= 0) return;
  // Its own session and group (spawn_process); the group is only the template: the workers
  // it forked made sessions of their own.
  if (::kill(-pid_, SIGKILL) != 0) ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = 0;
}

void WorkerTemplate::gone(const std::string& why) {
  if (reason_.empty()) reason_ = why;
  boost::system::error_code ignored;
  socket_.close(ignored);
  pending_ = 0;
  if (pid_ > 0) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      reason_ = "the warm template " + describe_status(status);
      pid_ = 0;
    }
  }
  settle_later();
}

void WorkerTemplate::poll() {
  if (pid_ <= 0) return;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {  // its socket's end may not have been read
    pid_ = 0;
    reason_ = "the warm template " + describe_status(status);
    gone(reason_);
  }
}

// From the loop, not inside the call that found it (send, abandon): its caller goes on.
void WorkerTemplate::settle_later() {
  boost::asio::post(io_, [this, alive = std::weak_ptr<bool>(alive_)] {
    if (!alive.expired()) settle();
  });
}

void WorkerTemplate::abandon(const std::string& why) {
  if (reason_.empty()) reason_ = why;
  kill_and_reap();
  pending_ = 0;
  settle_later();
}

void WorkerTemplate::send(const std::string& message, const std::vector<int>& fds) {
  if (!socket_.is_open()) return;
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
    n = ::sendmsg(socket_.native_handle(), &header, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) gone(std::string("the warm template does not listen: ") + std::strerror(errno));
}

std::optional<std::string> WorkerTemplate::receive() {
  while (socket_.is_open()) {
    std::string reply(kReplyBytes, '\0');
    const ssize_t got = ::recv(socket_.native_handle(), reply.data(), reply.size(), MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == EAGAIN) return std::nullopt;
    if (got <= 0) {
      gone("the warm template exited");
      return std::nullopt;
    }
    reply.resize(static_cast<std::size_t>(got));
    return reply;
  }
  return std::nullopt;
}

// The socket is readable when a reply came or the template is gone (end of file): either is
// handled at once, whatever the agent waits for.
void WorkerTemplate::watch() {
  if (!socket_.is_open()) return;
  socket_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                     [this, alive = std::weak_ptr<bool>(alive_)](boost::system::error_code ec) {
                       if (ec || alive.expired()) return;
                       for (;;) {  // after each step, a handler may have dropped the template
                         std::optional<std::string> reply = receive();
                         if (alive.expired()) return;
                         if (!reply) break;
                         on_reply(*reply);
                         if (alive.expired()) return;
                       }
                       watch();
                     });
}

void WorkerTemplate::on_reply(const std::string& reply) {
  std::string op;
  try {
    op = nlohmann::json::parse(reply).value(kOp, "");
  } catch (const nlohmann::json::exception& e) {
    return gone(std::string("the warm template answered garbage: ") + e.what());
  }
  if (op == kSpawned || op == kCold) {
    if (!forked_) return gone("the warm template answered a spawn nobody asked for");
    try {
      const auto message = nlohmann::json::parse(reply);
      if (op == kSpawned) return finish_spawn(static_cast<pid_t>(message.at("pid").get<int>()));
      return finish_spawn(message.value("reason", std::string("the template refused")));
    } catch (const nlohmann::json::exception& e) {
      return gone(std::string("the warm template answered garbage: ") + e.what());
    }
  }
  on_prepared(reply);
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
  } catch (const nlohmann::json::exception& e) {
    return gone(std::string("the warm template answered garbage: ") + e.what());
  }
  settle();
}

// Each handler is called last: it may drop the template.
void WorkerTemplate::settle() {
  if (forked_ && !socket_.is_open()) return finish_spawn(reason_);
  if (ready_ && (pending_ == 0 || !reason_.empty())) {
    timer_.cancel();
    auto ready = std::exchange(ready_, nullptr);
    ready();
  }
}

void WorkerTemplate::finish_spawn(Forked result) {
  auto done = std::exchange(forked_, nullptr);
  subreaper_.reset();
  timer_.cancel();
  if (done) done(std::move(result));
}

void WorkerTemplate::arm_timer(std::chrono::milliseconds timeout, std::string why) {
  timer_.expires_after(timeout);
  timer_.async_wait([this, why = std::move(why),
                     alive = std::weak_ptr<bool>(alive_)](boost::system::error_code ec) {
    if (ec || alive.expired()) return;
    if (reason_.empty()) reason_ = why;
    if (forked_) return finish_spawn(reason_);
    settle();
  });
}

void WorkerTemplate::prepare(const std::vector<std::string>& preload,
                             const std::vector<std::string>& lists,
                             const std::vector<std::string>& own,
                             const std::vector<std::string>& varying) {
  if (!reason_.empty()) return;
  send(nlohmann::json{{kOp, kPrepare},
                      {"preload", preload},
                      {"lists", lists},
                      {"own", own},
                      {"varying", varying}}
           .dump(),
       {});
  if (socket_.is_open()) ++pending_;
}

void WorkerTemplate::when_prepared(std::chrono::milliseconds timeout, std::function<void()> ready) {
  ready_ = std::move(ready);
  arm_timer(timeout, "the warm template was still importing after " +
                         std::to_string(timeout.count() / 1000) + " s");
  if (pending_ == 0 || !reason_.empty()) settle_later();  // answered already
}

void WorkerTemplate::spawn(const SpawnOptions& options, const std::string& cwd,
                           std::chrono::milliseconds timeout, bool blind,
                           std::function<void(Forked)> done) {
  when_prepared(timeout, [this, options, cwd, timeout, blind, done = std::move(done)]() mutable {
    forked_ = std::move(done);
    if (!reason_.empty()) return finish_spawn(reason_);
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
    const nlohmann::json request = {{kOp, kSpawn},          {"program", options.program},
                                    {"argv", options.argv}, {"env", options.env},
                                    {"cwd", cwd},           {"cpus", options.cpus},
                                    {"fds", targets},       {"guard", guard},
                                    {"agent", ::getpid()},  {"given", env_},
                                    {"blind", blind}};
    // The worker is the template's grandchild until its parent exits: the orphan comes here.
    subreaper_ = std::make_unique<SubreaperScope>();
    arm_timer(timeout, "the warm template did not answer within " +
                           std::to_string(timeout.count() / 1000) + " s");
    send(request.dump(), fds);  // last: a template gone already has called `done`
  });
}

}  // namespace ddp::launcher
