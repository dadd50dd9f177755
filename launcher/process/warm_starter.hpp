#pragma once
// --warm_start for a node's Python workers: keeps the node's warm template (WorkerTemplate),
// which imports the framework (torch, and --warm_preload's modules) from the launch on, feeds
// it what the workers say of their own imports (the probe's modules.txt of each rank, read when
// a worker writes it: inotify, an event on the loop; a worker that set its environment before
// `import torch` makes the template unusable), and forks a round's workers from it when it
// may, saying in one line why a round starts cold when it may not. Internal to the launcher; runs
// on the agent's loop.

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ddp/launcher/launch_config.hpp"
#include "ddp/launcher/worker_command.hpp"
#include "process/worker_template.hpp"

namespace ddp::launcher {

struct WarmStarterOptions {
  WarmStart mode = WarmStart::kOff;
  WorkerCommand command;             // a Python entrypoint, else warm starts are off
  std::filesystem::path probe_dir;   // the probe's folder (the template lives there);
                                     // empty: warm starts are off
  std::vector<std::string> env;      // the template's: the node's worker environment
  std::vector<std::string> preload;  // --warm_preload: modules preloaded beside torch
  std::filesystem::path log_root;    // <log_root>/warm_template.log is its output
  int group_guard_fd = -1;           // GroupReaper::channel()
  bool alone = false;                // the job has one node: no rendezvous keep-alive to miss
  bool later_rounds = true;          // workers_may_start_again: else only --warm_start=always
                                     // starts a template, for the first round alone
  std::function<void(const std::string&)> notice;  // one line on the console
};

// Whether this node's workers may start again after their first round, so that a template could
// fork them: a failure restarts them (--max_restarts above 0), or a change of membership does
// (a job of more than one node: a node lost, or one arriving, whatever --max_restarts says).
// One node with no restart to make has one round only. The one place this is decided.
bool workers_may_start_again(const LaunchConfig& config);

class WarmStarter {
 public:
  WarmStarter(boost::asio::io_context& io, WarmStarterOptions options);
  ~WarmStarter();

  // Whether warm starts can happen at all (a Python entrypoint with the probe, not off).
  bool enabled() const { return enabled_; }
  // The variable that asks a worker's probe for its modules list (in its log folder `dir`);
  // empty when warm starts are off.
  std::string modules_variable(const std::filesystem::path& dir) const;

  // Before a round's workers start; `previous` is the attempt folder of the round before
  // (empty for the first). Decides whether this round's workers are forked: reads the last
  // lists, starts or prepares the template, says why not when it cannot; then calls `ready`:
  // at once when nothing is to be waited for, else on the loop once the template is prepared
  // or the wait ended (bounded: kWaitLimit), the loop going on meanwhile.
  void begin_round(int restart_count, const std::filesystem::path& previous, int local_world,
                   std::function<void()> ready);
  // Whether this round's workers are asked of the template (spawn answers on the loop).
  bool forking() const { return round_warm_ && template_ != nullptr; }
  // The template's pid while one runs (0: none).
  pid_t template_pid() const;
  // A worker of the round begun: `done` gets its pid when the template forked it (on the
  // loop), else nullopt (start it cold; the first such worker of a round says why, once),
  // at once when the round is cold.
  void spawn(const SpawnOptions& options, std::function<void(std::optional<pid_t>)> done);
  // A worker that replaces one of the running round's (--restart_policy=inplace): `done` gets
  // its pid when the template forked it (once its imports are done, within the wait limit), on
  // the loop, else nullopt and why (start it cold): at once when no template runs.
  void spawn_replacement(const SpawnOptions& options,
                         std::function<void(std::optional<pid_t>, std::string why)> done);
  // The agent stops: a wait for the template ends now (the template is dropped), and its
  // handler is called next on the loop, the round cold for `why`.
  void cancel(const std::string& why);
  // A worker's environment, as it would be exec'd: the variables in which it differs from
  // the template's (a rank's, an attempt's, ddprun's descriptors) are the ones an import
  // must not read in the template.
  void note_worker_environment(const std::vector<std::string>& env);
  // After the round's workers started (in `attempt_dir`): one line saying how they started,
  // and the timer that watches their lists.
  void end_round(const std::filesystem::path& attempt_dir, int local_world);

 private:
  // The modules.txt of each local rank under dir that exists, with its time and size.
  std::map<std::string, std::pair<long long, long long>> lists_in(const std::filesystem::path& dir,
                                                                  int local_world) const;
  // Sends the lists under dir to the template (started first if need be) when they changed.
  void feed(const std::filesystem::path& dir, int local_world);
  // The template that died (noticed by its socket) is dropped, saying so: the next feed
  // starts another.
  void replace_dead_template();
  // The lists of the round that runs: inotify on each rank's folder (no polling).
  void watch_lists();
  void wait_for_lists();
  // How long the loop may wait for the template (kWaitLimit, or kWaitLimitAlone).
  std::chrono::milliseconds wait_limit() const;
  bool start_template();
  // What a template imports: torch, then --warm_preload's modules.
  std::vector<std::string> preload() const;
  // Drops the template. One whose imports made it unusable turns warm starts off (another
  // would import the same), as do kMaxFailures of any kind.
  void drop_template(const std::string& why);
  std::vector<std::string> own_folders() const;

  boost::asio::io_context& io_;
  WarmStarterOptions options_;
  std::set<std::string> template_env_;  // options_.env's "K=V" entries, to compare a worker's
  bool enabled_ = false;
  std::unique_ptr<WorkerTemplate> template_;
  int failures_ = 0;       // templates dropped; after kMaxFailures warm starts stay off
  std::string off_;        // why warm starts are off for the rest of the job ("" while on)
  bool off_said_ = false;  // a line said so: the rounds after it say nothing more
  bool round_warm_ = false;
  int round_ = 0;
  int forked_ = 0;                 // workers of this round from the template
  std::string round_cold_reason_;  // why this round (or part of it) started cold
  std::filesystem::path watched_dir_;
  int watched_world_ = 0;
  std::map<std::string, std::pair<long long, long long>> fed_;  // lists sent, as they were
  std::set<std::string> varying_;  // variables that differ between a worker and the template
  boost::asio::posix::stream_descriptor lists_;  // inotify on the running round's folders
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace ddp::launcher
