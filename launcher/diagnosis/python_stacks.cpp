#include "diagnosis/python_stacks.hpp"

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>

#include "diagnosis/collective_diagnosis.hpp"
#include "diagnosis/stack_capture.hpp"

namespace ddp::launcher {
namespace {

bool is_thread_header(const std::string& line) {
  return (line.starts_with("Thread 0x") || line.starts_with("Current thread 0x")) &&
         line.ends_with("(most recent call first):");
}

bool is_python_frame(const std::string& line) { return line.starts_with("  File \""); }

bool is_frame(const std::string& line) {
  return is_python_frame(line) || line == "  <no Python frame>";
}

// True when some thread of the dump was in Python code.
bool has_python_frame(const std::string& dump) {
  std::istringstream lines(dump);
  std::string line;
  while (std::getline(lines, line)) {
    if (is_python_frame(line)) return true;
  }
  return false;
}

// "Thread 0x00007f00aa (most recent call first):" -> "Thread (most recent call first):"
std::string without_thread_id(const std::string& line) {
  static const std::regex id(R"( 0x[0-9a-fA-F]+)");
  return std::regex_replace(line, id, "");
}

}  // namespace

namespace {

// A frame of ddprun's own Python (the probe's Work.wait wrapper, the warm template's frames
// beneath a forked worker's program where they remain): not the program's, so not shown.
bool is_ddprun_frame(const std::string& line) {
  static const std::regex ours(R"re(^  File ".*/ddprun/python/_ddprun_[a-z_]+\.py", line )re");
  return is_python_frame(line) && std::regex_search(line, ours);
}

}  // namespace

std::string faulthandler_threads(std::string_view text) {
  std::istringstream lines{std::string(text)};
  std::string line, dump;
  while (std::getline(lines, line)) {
    if (is_thread_header(line) || (is_frame(line) && !is_ddprun_frame(line))) dump += line + "\n";
  }
  return dump;
}

std::string innermost_frame(std::string_view dump) {
  // The last thread block's first frame.
  std::istringstream lines{std::string(dump)};
  std::string line, frame;
  bool first_of_block = false;
  while (std::getline(lines, line)) {
    if (is_thread_header(line)) {
      first_of_block = true;
    } else if (first_of_block && is_frame(line)) {
      frame = line;
      first_of_block = false;
    }
  }
  //   File "/path/train.py", line 42 in main
  static const std::regex parts(R"re(^  File "(?:.*/)?([^/"]+)", line (\d+) in (.+)$)re");
  std::smatch match;
  if (!std::regex_match(frame, match, parts)) return "";
  return match[3].str() + " (" + match[1].str() + ":" + match[2].str() + ")";
}

std::string group_python_stacks(const std::vector<PythonStack>& stacks) {
  std::vector<std::pair<int, std::string>> rank_shapes;
  std::map<std::string, std::string> frame_of;  // shape -> its innermost frame
  std::vector<std::string> missing;
  for (const PythonStack& s : stacks) {
    if (s.dump.empty()) {
      missing.push_back("rank " + std::to_string(s.rank) + ": no stack: " + s.error);
      continue;
    }
    if (!has_python_frame(s.dump)) {  // every thread "<no Python frame>": its Python had ended
      missing.push_back("rank " + std::to_string(s.rank) + ": no stack: " + kExitedNoFrame);
      continue;
    }
    std::istringstream lines(s.dump);
    std::string line, shape;
    while (std::getline(lines, line)) {
      if (is_thread_header(line) || is_frame(line)) shape += without_thread_id(line) + "\n";
    }
    frame_of[shape] = innermost_frame(s.dump);
    rank_shapes.emplace_back(s.rank, std::move(shape));
  }
  return format_stack_groups(
      rank_shapes, missing, [&frame_of](const std::vector<int>& ranks, const std::string& shape) {
        std::string heading = std::to_string(ranks.size()) +
                              (ranks.size() == 1 ? " rank (rank " : " ranks (ranks ") +
                              rank_list(ranks) + ")";
        if (const std::string& frame = frame_of[shape]; !frame.empty()) heading += ": in " + frame;
        return heading;
      });
}

}  // namespace ddp::launcher
