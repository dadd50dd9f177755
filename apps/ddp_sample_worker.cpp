// ddp-sample-worker: a small worker for ddprun's tests and demo. Runs its arguments as a
// script of actions, in order; kUsage below (ddp-sample-worker --help) lists them.
#include <dirent.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ddp/store/client.hpp"

extern char** environ;

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

// One write per line, so that lines of workers sharing a console never mix.
void emit(std::ostream& out, const std::string& line) { out << (line + "\n") << std::flush; }

int parse_signal(const std::string& text) {
  if (!text.empty() && std::isdigit(static_cast<unsigned char>(text[0]))) return std::stoi(text);
  std::string name = text.starts_with("SIG") ? text.substr(3) : text;
  for (int s = 1; s < NSIG; ++s) {
    const char* abbrev = ::sigabbrev_np(s);
    if (abbrev && name == abbrev) return s;
  }
  std::cerr << "ddp-sample-worker: unknown signal " << text << "\n";
  std::exit(64);
}

// "{rank}" and "{restart}" in path become $RANK and $TORCHELASTIC_RESTART_COUNT.
std::string expand(std::string path) {
  if (auto at = path.find("{rank}"); at != std::string::npos) {
    path.replace(at, 6, env_or("RANK", "x"));
  }
  if (auto at = path.find("{restart}"); at != std::string::npos) {
    path.replace(at, 9, env_or("TORCHELASTIC_RESTART_COUNT", "x"));
  }
  return path;
}

// Blocks until path exists (inotify on its directory: an event, not polling).
void wait_for_file(const std::string& path) {
  auto slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  int fd = ::inotify_init1(IN_CLOEXEC);
  if (fd < 0 || ::inotify_add_watch(fd, dir.c_str(), IN_CREATE | IN_MOVED_TO) < 0) {
    std::cerr << "ddp-sample-worker: inotify on " << dir << ": " << std::strerror(errno) << "\n";
    std::exit(65);
  }
  alignas(inotify_event) char events[4096];
  while (::access(path.c_str(), F_OK) != 0) {
    if (::read(fd, events, sizeof events) < 0 && errno != EINTR) {
      std::cerr << "ddp-sample-worker: inotify read: " << std::strerror(errno) << "\n";
      std::exit(65);
    }
  }
  ::close(fd);
}

void dump_env(std::string path) {
  nlohmann::json env = nlohmann::json::object();
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  if (path == "-") return emit(std::cout, env.dump());
  path = expand(path);
  std::string tmp = path + ".tmp";
  std::ofstream(tmp) << env.dump(2) << "\n";
  std::rename(tmp.c_str(), path.c_str());  // readers never see half a file
}

// Every rank ADDs 1 to a counter in the job's store; the last one sets "done", which all
// wait for. Keys are per restart, so a restarted group meets again. Store errors (a refused
// connection among them) end the worker with status 1 and the store's message.
void store_barrier(const std::string& rank, int restart) {
  constexpr std::chrono::seconds kTimeout{30};
  ddp::store::ClientOptions options;
  options.host = env_or("MASTER_ADDR", "127.0.0.1");
  options.port = static_cast<std::uint16_t>(std::stoi(env_or("MASTER_PORT", "29500")));
  options.connect_timeout = kTimeout;
  options.timeout = kTimeout;
  const std::string prefix = "sample-worker/barrier/" + std::to_string(restart) + "/";
  try {
    ddp::store::Client client(options);
    if (client.add(prefix + "count", 1) == std::stoll(env_or("WORLD_SIZE", "1"))) {
      client.set(prefix + "done", "1");
    }
    client.wait({prefix + "done"}, kTimeout);
  } catch (const ddp::store::StoreError& e) {
    std::cerr << "ddp-sample-worker: store barrier failed: " << e.what() << "\n";
    std::exit(1);
  }
  emit(std::cout, "store barrier passed rank=" + rank);
}

void write_error_file(const std::string& message) {
  std::string path = env_or("TORCHELASTIC_ERROR_FILE", "");
  if (path.empty()) return;
  nlohmann::json data = {{"message",
                          {{"message", "RuntimeError: " + message},
                           {"extraInfo",
                            {{"py_callstack",
                              "Traceback (most recent call last):\n  File \"worker.py\", line 7, "
                              "in <module>\n    main()\nRuntimeError: " +
                                  message + "\n"},
                             {"timestamp", std::to_string(std::time(nullptr))}}}}}};
  std::ofstream(path) << data.dump();
}

// "0 1 2": the descriptors open in this process (without the one that lists them); ddprun's
// collective record page (DDPRUN_RECORD_FD) as "record:<fd>".
std::string open_fds() {
  const char* record = std::getenv("DDPRUN_RECORD_FD");
  const int record_fd = record ? std::atoi(record) : -1;
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return "?";
  std::vector<int> fds;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    int fd = std::atoi(entry->d_name);
    if (fd != ::dirfd(dir)) fds.push_back(fd);
  }
  ::closedir(dir);
  std::sort(fds.begin(), fds.end());
  std::string text;
  for (int fd : fds) {
    if (!text.empty()) text += ' ';
    text += (fd == record_fd ? "record:" : "") + std::to_string(fd);
  }
  return text;
}

void spawn_child() {
  pid_t pid = ::fork();
  if (pid == 0) {
    for (;;) ::pause();
  }
  emit(std::cout, "child pid=" + std::to_string(pid));
}

// The actions, as the comment at the top of this file lists them.
constexpr const char* kUsage =
    "usage: ddp-sample-worker [ACTION...]: a worker for ddprun's tests and demo; runs its\n"
    "arguments as a script of actions, in order:\n"
    "  --env-json PATH      write the environment as JSON to PATH (\"-\": stdout); {rank} and\n"
    "                       {restart} in PATH become $RANK and $TORCHELASTIC_RESTART_COUNT\n"
    "  --print TEXT         a line on stdout        --eprint TEXT  a line on stderr\n"
    "  --partial TEXT       TEXT on stdout, no newline\n"
    "  --lines N            N lines \"rank R line I\" on stdout\n"
    "  --hello              a greeting with rank, world size and master endpoint\n"
    "  --ready              \"ready rank=R pid=P\" on stdout\n"
    "  --fds                the open file descriptors on stdout\n"
    "  --read-line          read a line from stdin; print \"got LINE\"\n"
    "  --spawn-child        fork a child that stays in this process group and waits\n"
    "  --ignore SIG         ignore a signal (e.g. SIGTERM)\n"
    "  --wait               wait until a signal ends the process\n"
    "  --wait-for-file PATH wait until PATH exists ({rank} and {restart} expanded)\n"
    "  --store-barrier      as a client of the job's store (MASTER_ADDR:MASTER_PORT), wait\n"
    "                       until every rank has reached it; prints \"store barrier passed "
    "rank=R\"\n"
    "  --error-file MSG     write a torchelastic error file ($TORCHELASTIC_ERROR_FILE)\n"
    "  --exit CODE          exit now with CODE\n"
    "  --signal SIG         kill itself with SIG (a name like SIGKILL or a number)\n"
    "Filters for the next action only:\n"
    "  --if-rank R          only on RANK R\n"
    "  --if-restart-below K only while TORCHELASTIC_RESTART_COUNT < K\n"
    "Example: ddprun --nproc_per_node=2 ddp-sample-worker --hello --if-rank 1 --exit 3\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << kUsage;
    return 0;
  }
  const std::string rank = env_or("RANK", "?");
  const int restart = std::atoi(env_or("TORCHELASTIC_RESTART_COUNT", "0").c_str());
  bool enabled = true;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) {
        std::cerr << "ddp-sample-worker: " << a << " needs a value\n";
        std::exit(64);
      }
      return args[++i];
    };
    if (a == "--if-rank") {
      enabled = value() == rank;
      continue;
    }
    if (a == "--if-restart-below") {
      enabled = restart < std::stoi(value());
      continue;
    }
    bool run = enabled;
    enabled = true;
    if (a == "--env-json") {
      std::string path = value();
      if (run) dump_env(path);
    } else if (a == "--wait-for-file") {
      std::string path = expand(value());
      if (run) wait_for_file(path);
    } else if (a == "--store-barrier") {
      if (run) store_barrier(rank, restart);
    } else if (a == "--print") {
      std::string text = value();
      if (run) emit(std::cout, text);
    } else if (a == "--eprint") {
      std::string text = value();
      if (run) emit(std::cerr, text);
    } else if (a == "--partial") {
      std::string text = value();
      if (run) std::cout << text << std::flush;
    } else if (a == "--lines") {
      int n = std::stoi(value());
      std::string text;
      for (int k = 0; run && k < n; ++k)
        text += "rank " + rank + " line " + std::to_string(k) + "\n";
      std::cout << text << std::flush;
    } else if (a == "--hello") {
      if (run) {
        emit(std::cout, "hello from rank " + rank + " of " + env_or("WORLD_SIZE", "?") +
                            " (local rank " + env_or("LOCAL_RANK", "?") + ", pid " +
                            std::to_string(::getpid()) + ", master " + env_or("MASTER_ADDR", "?") +
                            ":" + env_or("MASTER_PORT", "?") + ", restart " +
                            std::to_string(restart) + ")");
      }
    } else if (a == "--ready") {
      if (run) emit(std::cout, "ready rank=" + rank + " pid=" + std::to_string(::getpid()));
    } else if (a == "--read-line") {
      std::string line;
      if (run && std::getline(std::cin, line)) emit(std::cout, "got " + line);
    } else if (a == "--fds") {
      if (run) emit(std::cout, "fds rank=" + rank + ": " + open_fds());
    } else if (a == "--spawn-child") {
      if (run) spawn_child();
    } else if (a == "--ignore") {
      int s = parse_signal(value());
      if (run) std::signal(s, SIG_IGN);
    } else if (a == "--wait") {
      if (run) {
        for (;;) ::pause();
      }
    } else if (a == "--error-file") {
      std::string message = value();
      if (run) write_error_file(message);
    } else if (a == "--exit") {
      int code = std::stoi(value());
      if (run) return code;
    } else if (a == "--signal") {
      int s = parse_signal(value());
      if (run) {
        std::cout.flush();
        std::signal(s, SIG_DFL);
        ::raise(s);
      }
    } else {
      std::cerr << "ddp-sample-worker: unknown argument " << a << " (see --help)\n";
      return 64;
    }
  }
  return 0;
}
