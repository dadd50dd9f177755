#pragma once
// Whether the workers' Python would load ddprun's probe at all. A PYTHON_EXEC that starts Python
// isolated (-I), ignoring the PYTHON* variables (-E) or without the site module (-S) never runs
// the probe's sitecustomize, while a plain Python it starts would (it honours PYTHONPATH): such
// a job's workers get torchrun's environment alone. Internal to the launcher.

#include <chrono>
#include <string>

#include "ddp/launcher/launch_config.hpp"
#include "ddp/launcher/worker_command.hpp"

namespace ddp::launcher {

// How long ddprun waits for the interpreter to say its flags, before the first worker starts.
constexpr std::chrono::milliseconds kPythonFlagsTimeout{10000};

// The flag that keeps ddprun's probe out of `command`'s interpreter: "-I", "-E" or "-S"; empty
// when none does, or `command` is not Python. An interpreter that is a binary runs with the
// flags ddprun gives it (none of those); one that is a script (a wrapper: a shell script that
// runs python3 -I "$@", a pyenv shim) is asked once, as `PROGRAM -c CODE`, in ddprun's own
// environment, for at most `timeout`; one that does not answer is taken as not isolated (the
// workers would fail the same way).
std::string python_isolation_flag(const WorkerCommand& command,
                                  std::chrono::milliseconds timeout = kPythonFlagsTimeout);

// The one line that says so: what `flag` does, that the workers get torchrun's environment
// alone, what that turns off (and warm starts, unless --warm_start=off).
std::string python_isolation_notice(const std::string& flag, const WorkerCommand& command,
                                    const LaunchConfig& config);

}  // namespace ddp::launcher
