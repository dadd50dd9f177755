#include "ddp/launcher/failure_report.hpp"

#include <algorithm>
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

// What torchrun shows as `traceback` when there is no error file.
constexpr const char* kNoTraceback =
    "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";

// The widest the ==== and ---- rules get, as in torchrun.
constexpr std::size_t kMaxRuleWidth = 60;

// torchrun's value of `traceback`: the error file's traceback (else its message), or for a
// worker without one a pointer to @record, or the signal that killed it. Continuation lines
// are indented by two spaces, as torchrun does.
std::string traceback_of(const WorkerFailure& f) {
  std::string text;
  if (f.error) {
    text = f.error->traceback.empty() ? f.error->message : f.error->traceback;
    while (!text.empty() && text.back() == '\n') text.pop_back();
    if (text.empty()) text = "<N/A>";
  } else if (f.signal != 0) {
    text = "Signal " + std::to_string(f.signal) + " (" + signal_name(f.signal) +
           ") received by PID " + std::to_string(f.pid);
  } else {
    text = kNoTraceback;
  }
  std::string out;
  for (char c : text) {
    out += c;
    if (c == '\n') out += "  ";
  }
  return out;
}

// One failure in torchrun 2.x's layout, field for field; ours (exit, message) after them.
std::string describe(std::size_t index, const WorkerFailure& f) {
  std::ostringstream out;
  out << "[" << index << "]:\n"
      << "  time      : " << iso_time(f.time) << "\n"
      << "  host      : " << f.host << "\n"
      << "  rank      : " << f.rank << " (local_rank: " << f.local_rank << ")\n"
      << "  exitcode  : " << (f.signal != 0 ? -f.signal : f.exit_code) << " (pid: " << f.pid << ")"
      << (f.signal != 0 ? "  (" + signal_name(f.signal) + ")" : std::string()) << "\n"
      << "  error_file: " << (f.error ? f.error_file : "<N/A>") << "\n"
      << "  traceback : " << traceback_of(f) << "\n"
      << "  exit      : " << f.describe_exit() << "\n";
  if (f.error) out << "  message   : " << f.error->message << "\n";
  if (!f.collectives.empty()) out << "  collective: " << f.collectives << "\n";
  return out.str();
}

std::size_t widest_line(const std::string& text) {
  std::size_t widest = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) widest = std::max(widest, line.size());
  return widest;
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
  if (hung) return "hung: stopped by ddprun (the verdict and why it stopped are above)";
  if (signal != 0) return "signal " + signal_name(signal) + " (" + std::to_string(signal) + ")";
  return "exit code " + std::to_string(exit_code);
}

std::string format_failure_report(const std::string& what, const WorkerFailure& root_cause,
                                  const std::vector<WorkerFailure>& others) {
  // As torchrun: the root cause is [0], the other failures follow it in rank order.
  std::vector<const WorkerFailure*> all;
  for (const WorkerFailure& other : others) all.push_back(&other);
  std::stable_sort(all.begin(), all.end(), [](const WorkerFailure* a, const WorkerFailure* b) {
    return a->rank < b->rank;
  });
  all.insert(all.begin(), &root_cause);
  const std::string title = what + " FAILED";
  std::string root_text;
  std::string others_text;
  std::size_t width = title.size();
  for (std::size_t i = 0; i < all.size(); ++i) {
    std::string text = describe(i, *all[i]);
    width = std::max(width, widest_line(text));
    (i == 0 ? root_text : others_text) += text;
  }
  if (others_text.empty()) others_text = "  <NO_OTHER_FAILURES>\n";
  width = std::min(width, kMaxRuleWidth);
  const std::string rule(width, '=');
  const std::string section(width, '-');
  return rule + "\n" + title + "\n" + section + "\nFailures:\n" + others_text + section +
         "\nRoot Cause (first observed failure):\n" + root_text + rule + "\n";
}

std::string kill_notice(std::chrono::milliseconds shutdown_timeout, int signal,
                        const std::vector<StillRunning>& workers) {
  std::ostringstream seconds;
  seconds << static_cast<double>(shutdown_timeout.count()) / 1000.0;
  std::string names;
  for (const StillRunning& w : workers) {
    names += (names.empty() ? "" : ", ") + std::string("rank ") + std::to_string(w.rank) +
             " (local_rank " + std::to_string(w.local_rank) + ", pid " + std::to_string(w.pid) +
             ")";
  }
  const std::string count =
      std::to_string(workers.size()) + (workers.size() == 1 ? " worker" : " workers");
  return "ddprun: " + count + " did not stop within --shutdown_timeout=" + seconds.str() +
         "s after " + signal_name(signal) + ": sending SIGKILL to " + names;
}

}  // namespace ddp::launcher
