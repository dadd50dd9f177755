#include "diagnosis/stack_capture.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "diagnosis/collective_diagnosis.hpp"
#include "shared/tool_run.hpp"

namespace ddp::launcher {
namespace {

// Runs eu-stack -p pid; kills it at the deadline.
void run_eu_stack(RankStack& target, std::chrono::milliseconds timeout) {
  const ToolRun run = run_tool({"eu-stack", "-p", std::to_string(target.pid)}, timeout);
  std::string text = run.output;
  if (run.spawn_error != 0) {
    target.error = run.spawn_error == ENOENT
                       ? "eu-stack not found (install elfutils to see where workers were)"
                       : std::string("eu-stack: ") + std::strerror(run.spawn_error);
  } else if (run.timed_out) {
    target.error = "eu-stack took longer than " + duration_text(timeout.count() / 1000.0);
  } else if (!run.succeeded() || text.find("#0") == std::string::npos) {
    while (!text.empty() && text.back() == '\n') text.pop_back();
    target.error = "eu-stack failed: " + text.substr(0, 300);
  } else {
    target.stack = text;
  }
}

}  // namespace

std::vector<RankStack> capture_stacks(std::vector<RankStack> workers,
                                      std::chrono::milliseconds timeout) {
  // At most kStackTools eu-stacks at once (each stops its worker's threads and reads its
  // memory: 64 at once would stall the node), and all of them within twice the timeout of
  // one: the ranks not reached by then say so.
  const auto deadline = std::chrono::steady_clock::now() + 2 * timeout;
  std::atomic<std::size_t> next{0};
  auto take = [&] {
    for (std::size_t i = next++; i < workers.size(); i = next++) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        workers[i].error = "not taken: the stacks of " + std::to_string(workers.size()) +
                           " workers, " + std::to_string(kStackTools) +
                           " at a time, took longer than " +
                           duration_text(2.0 * static_cast<double>(timeout.count()) / 1000.0);
        continue;
      }
      run_eu_stack(workers[i], std::min(timeout, left));
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < std::min(workers.size(), kStackTools); ++t)
    threads.emplace_back(take);
  for (auto& thread : threads) thread.join();
  return workers;
}

std::string stack_shape(const std::string& eu_stack_text) {
  // "#3  0x00007f0011223344 ddp::Reducer::finalize()" -> "#3 ddp::Reducer::finalize()"
  static const std::regex frame(R"(^#(\d+)\s+0x[0-9a-fA-F]+\s*-?\s*(.*)$)");
  std::istringstream lines(eu_stack_text);
  std::string line, shape;
  while (std::getline(lines, line)) {
    std::smatch match;
    if (line.rfind("PID ", 0) == 0) continue;
    if (line.rfind("TID ", 0) == 0) {
      shape += "thread:\n";
    } else if (std::regex_match(line, match, frame)) {
      std::string function = match[2].str();
      if (function.empty()) function = "??";
      shape += "  #" + match[1].str() + " " + function + "\n";
    }
  }
  return shape;
}

std::string format_stack_groups(const std::vector<std::pair<int, std::string>>& rank_shapes,
                                const std::vector<std::string>& missing,
                                const StackHeading& heading) {
  std::map<std::string, std::vector<int>> by_shape;
  for (const auto& [rank, shape] : rank_shapes) by_shape[shape].push_back(rank);
  std::vector<std::pair<std::string, std::vector<int>>> groups(by_shape.begin(), by_shape.end());
  std::stable_sort(groups.begin(), groups.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  std::string text;
  for (const auto& [shape, ranks] : groups) {
    text += heading(ranks, shape) + "\n";
    text += indent_lines(shape);
  }
  for (const auto& line : missing) text += line + "\n";
  return text;
}

std::string indent_lines(const std::string& text) {
  std::string indented;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) indented += "  " + line + "\n";
  return indented;
}

std::string group_stacks(const std::vector<RankStack>& stacks) {
  std::vector<std::pair<int, std::string>> rank_shapes;
  std::vector<std::string> missing;
  for (const RankStack& s : stacks) {
    if (!s.error.empty()) {
      missing.push_back("rank " + std::to_string(s.rank) + " (pid " + std::to_string(s.pid) +
                        "): no stack: " + s.error);
    } else {
      rank_shapes.emplace_back(s.rank, stack_shape(s.stack));
    }
  }
  return format_stack_groups(
      rank_shapes, missing, [](const std::vector<int>& ranks, const std::string&) {
        return std::to_string(ranks.size()) + (ranks.size() == 1 ? " rank (" : " ranks (") +
               rank_list(ranks) + "):";
      });
}

}  // namespace ddp::launcher
