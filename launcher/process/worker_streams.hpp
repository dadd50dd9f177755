#pragma once
// Where one worker's stdout and stderr go, from --redirects, --tee and --local_ranks_filter:
// the console (inherited, no copying), a log file (the child writes it directly), a pipe the
// agent tees to file and console, or /dev/null (console filtered out, no file). Internal.

#include <filesystem>
#include <string>
#include <vector>

#include "ddp/launcher/launch_config.hpp"
#include "ddp/launcher/unique_fd.hpp"

namespace ddp::launcher {

struct WorkerStreams {
  UniqueFd child_out;  // the child's fd 1; invalid: inherit the agent's
  UniqueFd child_err;  // the child's fd 2; invalid: inherit the agent's
  struct Tee {
    UniqueFd read_end;                // the agent reads the worker's output here
    UniqueFd file;                    // and copies it here
    std::filesystem::path file_path;  // (that file's path, for messages)
    int console_fd = -1;              // and, prefixed line by line, here (-1: filtered out)
    bool is_stderr = false;
  };
  std::vector<Tee> tees;
};

// Opens the files and pipes for local_rank; files are <dir>/stdout.log and <dir>/stderr.log,
// made afresh, or appended to (append: a replacement's, after the failed worker's lines).
// Throws std::system_error naming the file that cannot be opened.
WorkerStreams open_worker_streams(const LaunchConfig& config, int local_rank,
                                  const std::filesystem::path& dir, int console_out,
                                  int console_err, bool append = false);

}  // namespace ddp::launcher
