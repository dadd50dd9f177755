#pragma once
// The warm template of a node's Python workers (worker/python/_ddprun_template.py): a process
// of the job's interpreter that imports what the workers import, then forks each worker the
// agent asks for. The second way to start a worker, beside spawn_process: both give a pid of
// the agent's own child (the template forks twice, and the agent is a child subreaper while it
// asks), so the worker group watches, signals and reaps it the same way. Internal to the
// launcher; every call runs on the agent's loop and waits at most its timeout.

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ddp/launcher/spawn_process.hpp"
#include "ddp/launcher/unique_fd.hpp"

namespace ddp::launcher {

struct WorkerTemplateOptions {
  std::string program;            // the job's interpreter
  std::vector<std::string> argv;  // interpreter, its flags, the template script
  std::vector<std::string> env;   // the node's worker environment, no rank's variables
  int output_fd = -1;             // the template's stdout and stderr (a file: its log)
  int group_guard_fd = -1;        // as SpawnOptions::group_guard_fd
};

class WorkerTemplate {
 public:
  // Starts the template (throws SpawnError). It imports nothing until prepare().
  explicit WorkerTemplate(const WorkerTemplateOptions& options);
  ~WorkerTemplate();  // SIGKILLs the template's group and reaps it
  WorkerTemplate(const WorkerTemplate&) = delete;
  WorkerTemplate& operator=(const WorkerTemplate&) = delete;

  // Asks it to import the installed modules the lists (the probe's modules.txt files) name,
  // never from the `own` folders (the script's, the working directory), each in the
  // environment the workers imported it in. An import that reads one of the `varying`
  // variables (they differ between workers) makes it unusable; it imports nothing from the
  // first module in `stop` on. Does not wait.
  void prepare(const std::vector<std::string>& lists, const std::vector<std::string>& own,
               const std::vector<std::string>& varying, const std::vector<std::string>& stop);
  // Reads the replies that came, and notices a template that died, without waiting.
  void poll();
  // Waits until every prepare was answered; false when `timeout` passed first or the
  // template is gone (reason() says).
  bool wait_prepared(std::chrono::milliseconds timeout);
  bool preparing() const { return pending_ > 0; }

  // Forks a worker as `options` describe (program and argv as they would be exec'd, in
  // `cwd`): its pid, or why it was not forked (the worker must start cold). `blind`: no
  // worker of this job has run yet (--warm_start=always's first attempt), so the template
  // checks the program's own source too.
  std::variant<pid_t, std::string> spawn(const SpawnOptions& options, const std::string& cwd,
                                         std::chrono::milliseconds timeout, bool blind = false);

  // Why this template cannot fork (it died, an import made it unsafe); empty while it can.
  const std::string& reason() const { return reason_; }
  // The module a next template must stop before to be usable (an import of it read a
  // variable that differs between workers); empty when none would help.
  const std::string& stop_before() const { return stop_; }
  // Whether the reason is the template's own verdict on its imports (a thread, a print...),
  // which another template importing the same would reach again; not a death or a timeout.
  bool refused() const { return refused_; }
  // How many modules the template holds (its own start-up's included).
  std::size_t imported() const { return imported_; }
  double import_seconds() const { return import_seconds_; }
  pid_t pid() const { return pid_; }

 private:
  void send(const std::string& message, const std::vector<int>& fds);
  // One reply, waiting up to timeout; nullopt on timeout or when the template is gone.
  std::optional<std::string> receive(std::chrono::milliseconds timeout);
  void on_prepared(const std::string& reply);
  void gone(const std::string& why);

  pid_t pid_ = 0;
  UniqueFd socket_;
  int pending_ = 0;  // prepares not answered yet
  std::size_t imported_ = 0;
  double import_seconds_ = 0;
  std::string reason_;
  std::string stop_;
  bool refused_ = false;
  std::vector<std::string> env_;  // the template's, as given: its start-up's changes follow
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

}  // namespace ddp::launcher
