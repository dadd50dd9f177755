#pragma once
// Where each worker was: native stacks of running workers through elfutils' eu-stack (it
// attaches with ptrace for a moment: the agent runs as the workers' user, and as root or with
// kernel.yama.ptrace_scope=0 where Yama restricts ptrace to ancestors), grouped by identical
// stack. Blocking: call off the agent's loop. Internal to the launcher.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ddp::launcher {

// How long one eu-stack may take before it is killed (a worker with many threads and no
// symbols cache takes a second or two).
inline constexpr std::chrono::milliseconds kStackTimeout{10000};

struct RankStack {
  int rank = -1;
  pid_t pid = 0;
  std::string stack;  // eu-stack's text, as printed
  std::string error;  // why there is none ("eu-stack not found", ptrace refused, ...)
};

// How many eu-stacks run at once.
inline constexpr std::size_t kStackTools = 4;

// One eu-stack per worker, kStackTools at a time; each bounded by timeout, all by twice that
// (the workers not reached by then get an error saying so).
std::vector<RankStack> capture_stacks(std::vector<RankStack> workers,
                                      std::chrono::milliseconds timeout = kStackTimeout);

// The stack without what differs between identical places: addresses, thread ids, the pid.
std::string stack_shape(const std::string& eu_stack_text);

// Groups ranks by stack shape, largest group first: "3 ranks (0, 1, 3):" then the frames of
// each thread indented; a rank without a stack is listed with why.
std::string group_stacks(const std::vector<RankStack>& stacks);

// The grouping both kinds of stack share (native here, Python in python_stacks): ranks with
// the same shape together, the largest group first (equal sizes in shape order); each group
// is its heading line, then the shape's lines indented by two spaces; `missing` (a line per
// rank without a stack) comes last.
using StackHeading =
    std::function<std::string(const std::vector<int>& ranks, const std::string& shape)>;
std::string format_stack_groups(const std::vector<std::pair<int, std::string>>& rank_shapes,
                                const std::vector<std::string>& missing,
                                const StackHeading& heading);

// Each line of text with two spaces before it (a report's section), each ended by a newline.
std::string indent_lines(const std::string& text);

}  // namespace ddp::launcher
