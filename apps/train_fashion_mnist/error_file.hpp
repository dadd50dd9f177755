#pragma once
// The torchelastic error file: a worker that fails writes its error as JSON to
// $TORCHELASTIC_ERROR_FILE (set by ddprun and torchrun), and the launcher's failure report
// shows it as the root cause instead of "the worker wrote none".

#include <string>

namespace fmnist {

// Writes message (as torchelastic's record() would for a RuntimeError) when
// TORCHELASTIC_ERROR_FILE is set; does nothing otherwise or when the file cannot be written.
void write_error_file(const std::string& message);

}  // namespace fmnist
