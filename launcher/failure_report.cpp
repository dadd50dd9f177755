#include "ddp/launcher/failure_report.hpp"

#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ddp/launcher/signal_names.hpp"

namespace ddp::launcher {
namespace {

// The most of an error file the report shows: PyTorch's are a few KiB.
constexpr std::size_t kMaxErrorFileBytes = 1 << 20;

std::string iso_time(std::chrono::system_clock::time_point time) {
  std::time_t t = std::chrono::system_clock::to_time_t(time);
  std::tm local{};
  ::localtime_r(&t, &local);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d_%H:%M:%S", &local);
  return text;
}

std::string text_of(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// Indents every line of text by `indent`.
std::string indented(const std::string& text, const std::string& indent) {
  std::istringstream lines(text);
  std::string line;
  std::string out;
  while (std::getline(lines, line)) out += indent + line + "\n";
  return out;
}

void describe(std::ostringstream& out, int index, const WorkerFailure& f) {
  out << "[" << index << "]:\n"
      << "  time      : " << iso_time(f.time) << "\n"
      << "  host      : " << f.host << "\n"
      << "  rank      : " << f.rank << " (local_rank: " << f.local_rank << ")\n"
      << "  exit      : " << f.describe_exit() << "\n"
      << "  pid       : " << f.pid << "\n";
  if (!f.error) {
    out << "  error_file: <N/A> (the worker wrote none; see its output above or in the logs)\n";
    return;
  }
  out << "  error_file: " << f.error_file << "\n"
      << "  message   : " << f.error->message << "\n";
  if (!f.error->traceback.empty()) out << "  traceback :\n" << indented(f.error->traceback, "    ");
}

}  // namespace

std::optional<ErrorFileContent> read_error_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string raw(kMaxErrorFileBytes, '\0');
  in.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  raw.resize(static_cast<std::size_t>(in.gcount()));
  if (raw.empty()) return ErrorFileContent{"(the error file is empty)", ""};
  if (in.peek() != std::char_traits<char>::eof()) {
    return ErrorFileContent{raw + "\n(truncated: the error file is larger than " +
                                std::to_string(kMaxErrorFileBytes >> 20) + " MiB)",
                            ""};
  }
  ErrorFileContent content;
  nlohmann::json json = nlohmann::json::parse(raw, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object() || !json.contains("message")) {
    content.message = raw;
    return content;
  }
  const nlohmann::json& message = json["message"];
  if (!message.is_object()) {
    content.message = text_of(message);
    return content;
  }
  content.message = message.contains("message") ? text_of(message["message"]) : message.dump();
  if (message.contains("extraInfo") && message["extraInfo"].is_object() &&
      message["extraInfo"].contains("py_callstack")) {
    content.traceback = text_of(message["extraInfo"]["py_callstack"]);
  }
  return content;
}

std::string WorkerFailure::describe_exit() const {
  if (signal != 0) return "signal " + signal_name(signal) + " (" + std::to_string(signal) + ")";
  return "exit code " + std::to_string(exit_code);
}

std::string format_failure_report(const std::string& what, const WorkerFailure& root_cause,
                                  const std::vector<WorkerFailure>& others) {
  const std::string rule(72, '=');
  const std::string thin(72, '-');
  std::ostringstream out;
  out << rule << "\n" << what << " FAILED\n" << thin << "\n";
  out << "Root Cause (first observed failure):\n";
  describe(out, 0, root_cause);
  out << thin << "\nOther Failures:\n";
  if (others.empty()) out << "  <NO_OTHER_FAILURES>\n";
  for (std::size_t i = 0; i < others.size(); ++i) describe(out, static_cast<int>(i + 1), others[i]);
  out << rule << "\n";
  return out.str();
}

}  // namespace ddp::launcher
