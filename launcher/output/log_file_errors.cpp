#include "ddp/launcher/log_file_errors.hpp"

#include <cstring>

namespace ddp::launcher {

LogFileErrors::LogFileErrors(Notice notice) : notice_(std::move(notice)) {}

void LogFileErrors::write_failed(const std::string& path, int error, std::size_t bytes) {
  auto [it, first] = lost_.try_emplace(path, 0);
  it->second += bytes;
  if (first && notice_) {
    notice_("ddprun: cannot write the log file " + path + ": " + std::strerror(error) + "; " +
            std::to_string(bytes) +
            " bytes not written (the console still gets the output, "
            "and later output is tried again)");
  }
}

std::string LogFileErrors::take_incomplete_files_notice() {
  if (lost_.empty()) return "";
  std::string text = "ddprun: incomplete log files (writes failed):";
  for (const auto& [path, bytes] : lost_) {
    text += " " + path + " (" + std::to_string(bytes) + " bytes missing)";
  }
  lost_.clear();
  return text;
}

}  // namespace ddp::launcher
