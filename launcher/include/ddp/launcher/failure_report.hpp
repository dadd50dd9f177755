#pragma once
// What a failed worker left behind, and the report ddprun prints about a failed job.

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ddp/elastic/rendezvous.hpp"

namespace ddp::launcher {

// A torchelastic error file (TORCHELASTIC_ERROR_FILE) as PyTorch's @record writes it:
//   {"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}
// or the short form {"message": "...", "timestamp": ...}.
struct ErrorFileContent {
  std::string message;    // "RuntimeError: boom"
  std::string traceback;  // py_callstack; empty in the short form
};

// Reads the error file at path; nullopt when it does not exist (or is no regular file). A
// file that is not in the format above comes back whole as the message, so that nothing the
// worker said is lost; one over 1 MiB comes back cut there, an empty one says so. Never
// throws for what the file holds.
std::optional<ErrorFileContent> read_error_file(const std::string& path);

// The worker's record (host, ranks, pid, exit code or signal, its TORCHELASTIC_ERROR_FILE) is
// the one a StopReason carries to the other nodes.
struct WorkerFailure : elastic::WorkerRecord {
  std::chrono::system_clock::time_point time;  // when the agent saw the exit
  std::optional<ErrorFileContent> error;       // what it wrote in its error file
  bool hung = false;        // not an exit: ddprun found the job hung (--hang_timeout)
  bool blamed = false;      // hung: the diagnosis blames this rank (not only the first to wait)
  std::string collectives;  // where the job's collectives were (a line or more), if recorded

  // The exit status ddprun reports for it: exit_code, or 128+signal.
  int status() const { return signal != 0 ? 128 + signal : exit_code; }
  // "exit code 3", "signal SIGKILL (9)" or "hung: stopped by ddprun".
  std::string describe_exit() const;
};

// The report on a failed job, in torchrun 2.x's layout field for field (so that log scrapers
// written for torchrun keep working): a ==== rule, "<what> FAILED", "Failures:" (the other
// failures, or <NO_OTHER_FAILURES>), "Root Cause (first observed failure):", each failure as
// "[i]:" (the root cause [0], the others after it in rank order) with time, host, rank,
// exitcode (-N for signal N) with the pid, error_file and
// traceback; then fields of ddprun's own (exit, message). `what` names the job (the
// entrypoint).
std::string format_failure_report(const std::string& what, const WorkerFailure& root_cause,
                                  const std::vector<WorkerFailure>& others);

// A worker still running when --shutdown_timeout ran out.
struct StillRunning {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
};

// The notice ddprun prints before it SIGKILLs the workers that did not stop within
// --shutdown_timeout after `signal` (SIGTERM, or the signal it forwarded): names each one.
std::string kill_notice(std::chrono::milliseconds shutdown_timeout, int signal,
                        const std::vector<StillRunning>& workers);

}  // namespace ddp::launcher
