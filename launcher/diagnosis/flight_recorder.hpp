#pragma once
// PyTorch's Flight Recorder (its NCCL process groups keep their last collectives in a ring and
// dump them to <attempt dir>/nccl_trace_rank_<rank> when a collective times out): the dumps a
// round left, and PyTorch's analyser over them (torch.distributed.flight_recorder.fr_trace,
// PyTorch 2.6+), whose verdict ddprun prints. Internal to the launcher.

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "shared/tool_run.hpp"

namespace ddp::launcher {

// The dumps' file names start with this, in the attempt's folder.
inline constexpr const char* kFlightRecorderPrefix = "nccl_trace_rank_";
// How long the analyser may take over the dumps of one round.
inline constexpr std::chrono::seconds kFlightRecorderTimeout{60};

// The dumps in attempt_dir, sorted.
std::vector<std::string> flight_recorder_dumps(const std::filesystem::path& attempt_dir);
// The analyser's command line with the job's interpreter `python`.
std::vector<std::string> flight_recorder_analyser(const std::string& python,
                                                  const std::filesystem::path& attempt_dir);
// What the analyser said, for the console: its output indented, or why there is none.
std::string flight_recorder_verdict(const ToolRun& run, const std::string& command);

}  // namespace ddp::launcher
