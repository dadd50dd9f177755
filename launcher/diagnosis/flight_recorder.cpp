#include "diagnosis/flight_recorder.hpp"

#include <algorithm>
#include <cstring>

namespace ddp::launcher {
namespace fs = std::filesystem;

std::vector<std::string> flight_recorder_dumps(const fs::path& attempt_dir) {
  std::error_code ec;
  std::vector<std::string> dumps;
  for (const auto& entry : fs::directory_iterator(attempt_dir, ec)) {
    if (entry.path().filename().string().starts_with(kFlightRecorderPrefix)) {
      dumps.push_back(entry.path().string());
    }
  }
  std::sort(dumps.begin(), dumps.end());
  return dumps;
}

// python -m torch.distributed.flight_recorder.fr_trace <dir> --prefix <prefix> (2.6+)
std::vector<std::string> flight_recorder_analyser(const std::string& python,
                                                  const fs::path& attempt_dir) {
  return {python,
          "-m",
          "torch.distributed.flight_recorder.fr_trace",
          attempt_dir.string(),
          "--prefix",
          kFlightRecorderPrefix};
}

std::string flight_recorder_verdict(const ToolRun& run, const std::string& command) {
  if (run.spawn_error != 0) {
    return "ddprun: could not run PyTorch's Flight Recorder analyser (" + command +
           "): " + std::strerror(run.spawn_error);
  }
  if (run.output.find("No module named") != std::string::npos && !run.succeeded()) {
    return "ddprun: this PyTorch has no Flight Recorder analyser "
           "(torch.distributed.flight_recorder comes with PyTorch 2.6+); with one, run: " +
           command;
  }
  std::string text = "ddprun: PyTorch's Flight Recorder analyser (" + command + ")";
  if (run.timed_out) {
    text += " took longer than " + std::to_string(kFlightRecorderTimeout.count()) +
            " s and was stopped; what it said:";
  } else if (!run.succeeded()) {
    text += " failed (" +
            (run.exited ? "exit code " + std::to_string(run.exit_code) : std::string("signal")) +
            "); what it said:";
  } else {
    text += " says:";
  }
  std::size_t start = 0;
  while (start < run.output.size()) {
    const std::size_t end = std::min(run.output.find('\n', start), run.output.size());
    text += "\n  " + run.output.substr(start, end - start);
    start = end + 1;
  }
  return text;
}

}  // namespace ddp::launcher
