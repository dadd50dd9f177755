#pragma once
// ddprun's own process at start, and what it says when it runs out of file descriptors.

#include <sys/resource.h>

#include <cstddef>
#include <exception>
#include <string>

#include "ddp/launcher/launch_config.hpp"

namespace ddp::launcher {

// Opens /dev/null on each of descriptors 0, 1 and 2 that is closed (ddprun started with
// `<&-` or by a daemon), so that no descriptor ddprun opens later (a socket, a log file)
// becomes its own stdout or a worker's stdin. Call first thing in main. Returns false when
// /dev/null cannot be opened.
bool open_missing_standard_descriptors();

// Raises the soft limit on open files to the hard limit, as ddpstore does: the agent holds
// several descriptors per worker. Returns the soft limit now in force. Workers inherit it.
rlim_t raise_open_file_limit();

// About how many descriptors the agent holds at once for the job: a few of its own, and per
// worker its pidfd, its store connections and two per teed stream (pipe and log file).
std::size_t descriptors_needed(const LaunchConfig& config);

// True when e is the system running out of descriptors (EMFILE or ENFILE), from a
// std::system_error or a SpawnError.
bool is_out_of_descriptors(const std::exception& e);

// "out of file descriptors starting 64 workers: ..." with the estimate and the limit, and
// what to do.
std::string out_of_descriptors_message(const LaunchConfig& config, const std::exception& e);

}  // namespace ddp::launcher
