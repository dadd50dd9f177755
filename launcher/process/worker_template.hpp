#pragma once
// The warm template of a node's Python workers (worker/python/_ddprun_template.py): a process
// of the job's interpreter that imports the framework (torch, and --warm_preload's modules),
// never the program, then forks each worker the agent asks for. The second way to start a worker,
// beside spawn_process: both give a pid of the agent's own child (the template forks twice, and the
// agent is a child subreaper while it asks), so the worker group watches, signals and reaps it the
// same way. Internal to the launcher; every call runs on the agent's loop and none waits: replies,
// the template's death and the timeouts arrive as handlers on the loop.

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ddp/launcher/spawn_process.hpp"

namespace ddp::launcher {

struct WorkerTemplateOptions {
  std::string program;            // the job's interpreter
  std::vector<std::string> argv;  // interpreter, its flags, the template script
  std::vector<std::string> env;   // the node's worker environment, no rank's variables
  int output_fd = -1;             // the template's stdout and stderr (a file: its log)
  int group_guard_fd = -1;        // as SpawnOptions::group_guard_fd
};

// Whether this process is a child subreaper, then sets it; restored by the destructor. While
// set, the orphans of its descendants become its children.
class SubreaperScope {
 public:
  SubreaperScope();
  ~SubreaperScope();
  SubreaperScope(const SubreaperScope&) = delete;
  SubreaperScope& operator=(const SubreaperScope&) = delete;

 private:
  int was_ = 0;
};

class WorkerTemplate {
 public:
  // Why a worker was not forked, or its pid.
  using Forked = std::variant<pid_t, std::string>;

  // Starts the template (throws SpawnError). It imports nothing until prepare().
  WorkerTemplate(boost::asio::io_context& io, const WorkerTemplateOptions& options);
  // SIGKILLs the template's group and reaps it; a handler still waiting is never called.
  ~WorkerTemplate();
  WorkerTemplate(const WorkerTemplate&) = delete;
  WorkerTemplate& operator=(const WorkerTemplate&) = delete;

  // Asks it to import the `preload` modules that are installed code (never from the `own`
  // folders: the script's, the working directory), in the environment it was given, and to
  // read the workers' `lists` (the probe's modules.txt files): a worker that imported one of
  // the modules it holds after changing its environment makes it unusable, as does an import
  // that reads one of the `varying` variables (they differ between workers). Does not wait.
  void prepare(const std::vector<std::string>& preload, const std::vector<std::string>& lists,
               const std::vector<std::string>& own, const std::vector<std::string>& varying);
  // Calls `ready` on the loop once every prepare was answered, the template is gone, or
  // `timeout` passed (then reason() says so). One wait at a time.
  void when_prepared(std::chrono::milliseconds timeout, std::function<void()> ready);
  bool preparing() const { return pending_ > 0; }

  // Forks a worker as `options` describe (program and argv as they would be exec'd, in
  // `cwd`) once the template is prepared; `done` gets its pid, or why it was not forked (the
  // worker must start cold), on the loop, within `timeout` after the preparing ended.
  // `blind`: no worker of this job has run yet (--warm_start=always's first attempt), so the
  // template checks the program's own source too. One spawn at a time.
  void spawn(const SpawnOptions& options, const std::string& cwd, std::chrono::milliseconds timeout,
             bool blind, std::function<void(Forked)> done);
  // Whether a when_prepared or a spawn waits for its handler.
  bool waiting() const { return ready_ || forked_; }
  // Gives up the template: it is killed, and a handler that waits is called next on the loop
  // (reason() says `why`). A worker whose fork was under way is its own process group, known to the
  // group guard, which ends it with the job.
  void abandon(const std::string& why);

  // Whether the template has exited (reaped now, its reason set, the socket closed), even
  // when the end of its socket has not been read yet; never waits.
  void poll();

  // Why this template cannot fork (it died, an import made it unsafe); empty while it can.
  const std::string& reason() const { return reason_; }
  // Whether the reason is the template's own verdict on its imports (a thread, a print...),
  // which another template importing the same would reach again; not a death or a timeout.
  bool refused() const { return refused_; }
  // How many modules the template holds (its own start-up's included).
  std::size_t imported() const { return imported_; }
  double import_seconds() const { return import_seconds_; }
  pid_t pid() const { return pid_; }

 private:
  void send(const std::string& message, const std::vector<int>& fds);
  // One reply that came, without waiting; nullopt when none came or the template is gone.
  std::optional<std::string> receive();
  // Watches the socket on the loop: replies, and its end when the template dies.
  void watch();
  void on_reply(const std::string& reply);
  void on_prepared(const std::string& reply);
  // The handlers whose wait ended: `ready` once nothing is pending (or the template is gone),
  // `forked` with what the template said.
  void settle();
  void settle_later();
  void finish_spawn(Forked result);
  void arm_timer(std::chrono::milliseconds timeout, std::string why);
  void gone(const std::string& why);
  void kill_and_reap();

  boost::asio::io_context& io_;
  pid_t pid_ = 0;
  boost::asio::posix::stream_descriptor socket_;  // ours of the pair; closed once it is gone
  boost::asio::steady_timer timer_;               // the wait's limit
  std::function<void()> ready_;                   // when_prepared's handler, while it waits
  std::function<void(Forked)> forked_;            // spawn's, while it waits
  std::unique_ptr<SubreaperScope> subreaper_;     // while a spawn waits for its reply
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  int pending_ = 0;  // prepares not answered yet
  std::size_t imported_ = 0;
  double import_seconds_ = 0;
  std::string reason_;
  bool refused_ = false;
  std::vector<std::string> env_;  // the template's, as given: its start-up's changes follow
};

}  // namespace ddp::launcher
