#pragma once
// What ddprun writes to its own TORCHELASTIC_ERROR_FILE (set by a scheduler that wraps it), as
// torchrun's @record does: the root cause's error file with its "errorCode", or the signal that
// stopped ddprun.

#include <optional>
#include <string>

namespace ddp::launcher {

// The root cause's error file (the JSON text it holds) as torchrun copies it: with
// "message"."errorCode" set to the worker's exit code (-N after signal N) when that is not 0
// and "message" is an object. Text that is not such JSON comes back unchanged.
std::string error_file_with_code(const std::string& worker_file, int error_code);

// torchrun's record of the SignalException that ends it after a handled signal:
//   {"message": {"message": "SignalException: Process <pid> got signal: <N>",
//                "extraInfo": {"py_callstack": "...", "timestamp": "<seconds>"}}}
std::string signal_error_file(int pid, int signal, long long unix_seconds);

// Writes text to path (replacing a file there); an error message, or nullopt on success.
std::optional<std::string> write_error_file(const std::string& path, const std::string& text);

}  // namespace ddp::launcher
