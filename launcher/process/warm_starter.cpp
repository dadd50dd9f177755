#include "process/warm_starter.hpp"

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "ddp/common/worker_contract.hpp"

namespace ddp::launcher {
namespace fs = std::filesystem;

namespace {

// A worker's modules list, in its log folder.
constexpr const char* kModulesFile = "modules.txt";
// The template's script, in the probe's folder.
constexpr const char* kTemplateScript = "_ddprun_template.py";
// What a list's write looks like to inotify: the probe writes beside it, then renames.
constexpr std::uint32_t kListEvents = IN_MOVED_TO | IN_CLOSE_WRITE;
// The longest the agent's loop waits for the template: its imports to end before a round's
// workers are forked, one fork's reply. With other nodes, well inside the rendezvous'
// keep-alive (a node whose agent is silent for 15 s is taken for dead); alone, about what a
// cold start of PyTorch 2.x takes on a busy small machine.
constexpr std::chrono::seconds kWaitLimit{8};
constexpr std::chrono::seconds kWaitLimitAlone{30};
// Bytes added to the template's command line and environment, so that a forked worker's own,
// which the template writes over them (/proc/PID/cmdline and environ: what ps shows), fit:
// the command line's room is the workers' command line and this much more; the environment's
// this much more than the template's (a worker's adds its rank's variables).
constexpr std::size_t kCommandLineRoom = 4096;
constexpr std::size_t kEnvironmentRoom = 8192;
// The kernel takes one argument of at most 128 KiB (MAX_ARG_STRLEN): the room is split.
constexpr std::size_t kPadArgument = 64 * 1024;
// Templates dropped (it died, a fork was refused) before warm starts stay off for the job.
constexpr int kMaxFailures = 2;
// What every template preloads: the framework, whose import does nothing per process; the
// user's --warm_preload adds to it.
constexpr const char* kFramework = "torch";

// The bytes of a command line in /proc/PID/cmdline.
std::size_t command_line_bytes(const std::vector<std::string>& argv) {
  std::size_t bytes = 0;
  for (const std::string& arg : argv) bytes += arg.size() + 1;
  return bytes;
}

}  // namespace

bool workers_may_start_again(const LaunchConfig& config) {
  return config.max_restarts > 0 || config.max_nodes > 1;
}

WarmStarter::WarmStarter(boost::asio::io_context& io, WarmStarterOptions options)
    : io_(io),
      options_(std::move(options)),
      template_env_(options_.env.begin(), options_.env.end()),
      lists_(io) {
  enabled_ = options_.mode != WarmStart::kOff && options_.command.python &&
             !options_.probe_dir.empty() && fs::exists(options_.probe_dir / kTemplateScript) &&
             (options_.later_rounds || options_.mode == WarmStart::kAlways);
  if (!enabled_) return;
  // The template imports the framework while the first attempt starts (with always, while the
  // rendezvous runs), so that a crash soon after the launch restarts warm.
  if (start_template()) template_->prepare(preload(), {}, own_folders(), {});
}

std::vector<std::string> WarmStarter::preload() const {
  std::vector<std::string> names = {kFramework};
  for (const std::string& name : options_.preload) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

WarmStarter::~WarmStarter() { alive_.reset(); }

std::chrono::milliseconds WarmStarter::wait_limit() const {
  return options_.alone ? kWaitLimitAlone : kWaitLimit;
}

pid_t WarmStarter::template_pid() const { return template_ ? template_->pid() : 0; }

std::string WarmStarter::modules_variable(const fs::path& dir) const {
  if (!enabled_ || !options_.later_rounds) return "";  // no restart to feed
  return std::string(ddp::contract::kModulesFile) + "=" + (dir / kModulesFile).string();
}

std::vector<std::string> WarmStarter::own_folders() const {
  std::error_code ec;
  std::vector<std::string> own = {fs::current_path(ec).string()};
  // A script's folder (python -u SCRIPT, or the wrapper's --run_path SCRIPT): the program's
  // own modules live there. A module (-m) has only the working directory.
  const std::vector<std::string>& argv = options_.command.argv;
  const std::size_t script = options_.command.args_begin - 1;
  const bool module = script >= 1 && script < argv.size() && argv[script - 1] == "-m";
  if (script < argv.size() && !module) {
    own.push_back(fs::weakly_canonical(fs::absolute(argv[script], ec), ec).parent_path().string());
  }
  return own;
}

bool WarmStarter::start_template() {
  const std::vector<std::string>& argv = options_.command.argv;
  WorkerTemplateOptions spawn;
  spawn.program = options_.command.program;
  spawn.argv = {argv.at(0)};
  // The interpreter's flags, which the workers have too: up to the -c of ddprun's wrapper or
  // the -m of a module.
  for (std::size_t i = 1;
       i < argv.size() && argv[i].starts_with("-") && argv[i] != "-c" && argv[i] != "-m"; ++i) {
    spawn.argv.push_back(argv[i]);
  }
  // Without the site start-up (.pth files, sitecustomize, usercustomize): each worker runs its
  // own after its fork. Last of the flags, where the template finds it to leave it out of the
  // workers' command lines.
  spawn.argv.push_back("-S");
  spawn.argv.push_back((options_.probe_dir / kTemplateScript).string());
  // Room for a forked worker's command line (the template writes it over its own).
  for (std::size_t room = command_line_bytes(argv) + kCommandLineRoom; room > 0;) {
    const std::size_t pad = std::min(room, kPadArgument);
    spawn.argv.push_back(std::string(pad - 1, ' '));
    room -= pad;
  }
  spawn.env = options_.env;
  spawn.env.push_back(std::string(contract::kTemplatePad) + "=" +
                      std::string(kEnvironmentRoom, ' '));
  spawn.group_guard_fd = options_.group_guard_fd;
  std::error_code ec;
  fs::create_directories(options_.log_root, ec);
  const fs::path log = options_.log_root / "warm_template.log";
  const int output = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (output < 0) {
    off_ = "cannot open " + log.string() + ": " + std::strerror(errno);
    return false;
  }
  spawn.output_fd = output;
  try {
    template_ = std::make_unique<WorkerTemplate>(io_, spawn);
  } catch (const std::exception& e) {
    off_ = e.what();
  }
  ::close(output);
  fed_.clear();
  return template_ != nullptr;
}

void WarmStarter::drop_template(const std::string& why) {
  const bool for_good = template_ && template_->refused();
  template_.reset();
  fed_.clear();
  if ((++failures_ >= kMaxFailures || for_good) && off_.empty()) off_ = why;
}

void WarmStarter::note_worker_environment(const std::vector<std::string>& env) {
  if (!enabled_) return;
  for (const std::string& entry : env) {
    if (!template_env_.contains(entry)) varying_.insert(entry.substr(0, entry.find('=')));
  }
}

std::map<std::string, std::pair<long long, long long>> WarmStarter::lists_in(
    const fs::path& dir, int local_world) const {
  std::map<std::string, std::pair<long long, long long>> lists;
  for (int rank = 0; rank < local_world; ++rank) {
    const fs::path path = dir / std::to_string(rank) / kModulesFile;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) continue;
    lists[path.string()] = {
        static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec,
        static_cast<long long>(st.st_size)};
  }
  return lists;
}

void WarmStarter::replace_dead_template() {
  if (!template_) return;
  template_->poll();
  if (template_->reason().empty() || template_->refused()) return;
  const std::string why = template_->reason();
  drop_template(why);
  off_said_ = !off_.empty();
  if (options_.notice) {  // the feed after this starts another, unless off now
    options_.notice(off_.empty() ? "ddprun: warm start: the template cannot be used (" + why +
                                       "); starting another"
                                 : "ddprun: warm start: off for this job, a restart starts its "
                                   "workers cold: " +
                                       why);
  }
}

void WarmStarter::feed(const fs::path& dir, int local_world) {
  replace_dead_template();
  if (!off_.empty() || options_.mode == WarmStart::kOff) return;
  auto lists = lists_in(dir, local_world);
  bool changed = false;
  for (const auto& [path, stamp] : lists) {
    auto seen = fed_.find(path);
    if (seen == fed_.end() || seen->second != stamp) changed = true;
  }
  if (!changed) return;
  const bool fresh = !template_;
  if (fresh && !start_template()) return;
  std::vector<std::string> paths;
  for (const auto& [path, stamp] : lists) {
    paths.push_back(path);
    fed_[path] = stamp;
  }
  template_->prepare(fresh ? preload() : std::vector<std::string>{}, paths, own_folders(),
                     {varying_.begin(), varying_.end()});
}

void WarmStarter::begin_round(int restart_count, const fs::path& previous, int local_world,
                              std::function<void()> ready) {
  round_ = restart_count;
  forked_ = 0;
  round_warm_ = false;
  round_cold_reason_.clear();
  if (!enabled_) return ready();
  boost::system::error_code ignored;
  lists_.close(ignored);  // this round's are watched from its end_round on
  if (!previous.empty()) feed(previous, local_world);  // what the last writes added
  if (previous.empty() && options_.mode != WarmStart::kAlways) return ready();  // a plain exec
  if (off_.empty() && !template_ && start_template()) {  // the last one was dropped
    template_->prepare(preload(), {}, own_folders(), {varying_.begin(), varying_.end()});
  }
  if (!off_.empty()) {
    round_cold_reason_ = off_;
  } else if (!template_) {
    round_cold_reason_ = "the warm template could not be started";
  } else {
    return template_->when_prepared(wait_limit(), [this, ready = std::move(ready)] {
      if (template_->reason().empty()) {
        round_warm_ = true;
      } else {
        round_cold_reason_ = template_->reason();
        drop_template(round_cold_reason_);
      }
      ready();
    });
  }
  ready();
}

void WarmStarter::spawn(const SpawnOptions& options,
                        std::function<void(std::optional<pid_t>)> done) {
  if (!round_warm_ || !template_) return done(std::nullopt);
  std::error_code ec;
  const bool blind = fed_.empty();  // no worker said what it imported: always's first
  template_->spawn(options, fs::current_path(ec).string(), wait_limit(), blind,
                   [this, done = std::move(done)](WorkerTemplate::Forked result) {
                     if (const pid_t* pid = std::get_if<pid_t>(&result)) {
                       ++forked_;
                       return done(*pid);
                     }
                     round_cold_reason_ = std::get<std::string>(result);
                     round_warm_ = false;
                     drop_template(round_cold_reason_);
                     done(std::nullopt);
                   });
}

void WarmStarter::cancel(const std::string& why) {
  if (template_ && template_->waiting()) template_->abandon(why);
}

void WarmStarter::spawn_replacement(const SpawnOptions& options,
                                    std::function<void(std::optional<pid_t>, std::string)> done) {
  if (!enabled_) return done(std::nullopt, "warm starts are off");
  if (!off_.empty()) return done(std::nullopt, off_);
  if (!template_) return done(std::nullopt, "no warm template runs");
  // A template still importing (a failure soon after the launch) is waited for, within the
  // limit: its import is done sooner than a cold worker's own would be.
  std::error_code ec;
  template_->spawn(options, fs::current_path(ec).string(), wait_limit(), false,
                   [this, done = std::move(done)](WorkerTemplate::Forked result) {
                     if (const pid_t* pid = std::get_if<pid_t>(&result)) return done(*pid, "");
                     const std::string why = std::get<std::string>(result);
                     drop_template(why);
                     done(std::nullopt, why);
                   });
}

void WarmStarter::end_round(const fs::path& attempt_dir, int local_world) {
  if (!enabled_) return;
  const std::string attempt = "attempt " + std::to_string(round_);
  if (!round_cold_reason_.empty() && round_cold_reason_ == off_ && off_said_) {
    // said once, when warm starts went off
  } else if (!round_cold_reason_.empty() && options_.notice) {
    off_said_ = !off_.empty() && round_cold_reason_ == off_;
    options_.notice("ddprun: warm start: " + attempt + "'s workers start cold" +
                    (forked_ > 0 ? " (" + std::to_string(forked_) + " forked before)" : "") + ": " +
                    round_cold_reason_);
  } else if (forked_ > 0 && options_.notice && template_) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f", template_->import_seconds());
    options_.notice("ddprun: warm start: " + attempt + "'s " + std::to_string(forked_) +
                    (forked_ == 1 ? " worker was" : " workers were") +
                    " forked from the template (" + std::to_string(template_->imported()) +
                    " modules preloaded in " + seconds + " s)");
  }
  if (!options_.later_rounds) {  // always's first round was the only one: free its memory
    template_.reset();
    off_ = "this node's workers start no other round";
    return;
  }
  watched_dir_ = attempt_dir;
  watched_world_ = local_world;
  if (off_.empty()) watch_lists();
}

// Each rank's folder of the round is watched: a list's write is an event on the loop.
void WarmStarter::watch_lists() {
  boost::system::error_code ignored;
  lists_.close(ignored);  // the last round's, if any
  const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd < 0) {  // out of inotify instances: restarts feed what the last attempt wrote
    return;
  }
  lists_.assign(fd);
  for (int rank = 0; rank < watched_world_; ++rank) {
    ::inotify_add_watch(fd, (watched_dir_ / std::to_string(rank)).c_str(), kListEvents);
  }
  wait_for_lists();
}

void WarmStarter::wait_for_lists() {
  lists_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                    [this, alive = std::weak_ptr<bool>(alive_)](boost::system::error_code ec) {
                      if (ec || alive.expired()) return;
                      bool listed = false;
                      alignas(inotify_event) char events[4096];
                      for (;;) {
                        const ssize_t got = ::read(lists_.native_handle(), events, sizeof events);
                        if (got <= 0) break;
                        for (ssize_t at = 0; at < got;) {
                          const auto* event = reinterpret_cast<const inotify_event*>(events + at);
                          if (event->len > 0 && std::strcmp(event->name, kModulesFile) == 0) {
                            listed = true;
                          }
                          at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
                        }
                      }
                      if (listed) feed(watched_dir_, watched_world_);
                      if (off_.empty()) wait_for_lists();
                    });
}

}  // namespace ddp::launcher
