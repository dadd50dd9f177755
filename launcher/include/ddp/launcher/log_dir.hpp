#pragma once
// The directory of one run's logs and error files, made as torchrun makes it.

#include <filesystem>
#include <string>

namespace ddp::launcher {

// A fresh, empty <base>/<run_id>_<random>/ (mkdtemp, mode 0700), as torchrun's
// DefaultLogsSpecs: a second run with the same --log_dir and run id never mixes its files
// with the first's. Creates `base` (and its parents) when missing. Returns an absolute path
// (workers get it in TORCHELASTIC_ERROR_FILE). Throws std::system_error naming the directory.
std::filesystem::path make_run_log_dir(const std::filesystem::path& base,
                                       const std::string& run_id);

}  // namespace ddp::launcher
