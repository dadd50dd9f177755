#include "ddp/launcher/slurm_env.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <initializer_list>
#include <utility>

namespace ddp::launcher {
namespace {

using Lookup = std::function<std::optional<std::string>(const std::string&)>;

// Where expand_nodelist is in its input, for error messages.
struct NodelistCursor {
  std::string_view list;  // the whole list, quoted in every error

  [[noreturn]] void fail(std::size_t position, const std::string& what) const {
    throw SlurmEnvError("bad Slurm node list \"" + std::string(list) + "\": " + what +
                        " at character " + std::to_string(position + 1));
  }
};

// One name of the list: literal text and bracket groups, each group already expanded.
using NameParts = std::vector<std::vector<std::string>>;

// A range bound: digits only, small enough to count with.
unsigned long long parse_bound(const NodelistCursor& cursor, std::string_view text,
                               std::size_t position) {
  if (text.empty()) cursor.fail(position, "empty range bound");
  if (text.size() > 18)
    cursor.fail(position, "range bound \"" + std::string(text) + "\" too large");
  unsigned long long value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    cursor.fail(position, "range bound \"" + std::string(text) + "\" is not a number");
  }
  return value;
}

// "01-04,07" (the inside of a bracket starting at `position`) -> 01 02 03 04 07. The width of
// each lower bound is kept with leading zeros.
std::vector<std::string> expand_brackets(const NodelistCursor& cursor, std::string_view inside,
                                         std::size_t position) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= inside.size()) {
    std::size_t comma = std::min(inside.find(',', start), inside.size());
    std::string_view piece = inside.substr(start, comma - start);
    std::size_t dash = piece.find('-');
    std::string_view low_text = piece.substr(0, dash);
    std::string_view high_text = dash == std::string_view::npos ? low_text : piece.substr(dash + 1);
    auto low = parse_bound(cursor, low_text, position + start);
    auto high = parse_bound(cursor, high_text, position + start + low_text.size() + 1);
    if (high < low)
      cursor.fail(position + start, "range \"" + std::string(piece) + "\" ends below its start");
    if (high - low >= kMaxNodelistHosts || out.size() + (high - low) >= kMaxNodelistHosts) {
      cursor.fail(position + start, "more than " + std::to_string(kMaxNodelistHosts) + " hosts");
    }
    for (auto value = low; value <= high; ++value) {
      std::string digits = std::to_string(value);
      if (digits.size() < low_text.size()) digits.insert(0, low_text.size() - digits.size(), '0');
      out.push_back(std::move(digits));
    }
    start = comma + 1;
  }
  return out;
}

// Splits one name ("rack[1-2]-n[01-03]" starting at `position`) into its parts.
NameParts split_name(const NodelistCursor& cursor, std::string_view name, std::size_t position) {
  if (name.empty()) cursor.fail(position, "empty host name");
  NameParts parts;
  std::size_t i = 0;
  while (i < name.size()) {
    if (name[i] == ']') cursor.fail(position + i, "']' without '['");
    if (name[i] != '[') {
      std::size_t end = std::min(name.find_first_of("[]", i), name.size());
      parts.push_back({std::string(name.substr(i, end - i))});
      i = end;
      continue;
    }
    std::size_t close = name.find(']', i);
    if (close == std::string_view::npos) cursor.fail(position + i, "unclosed '['");
    std::size_t nested = name.find('[', i + 1);
    if (nested < close) cursor.fail(position + nested, "'[' inside brackets");
    parts.push_back(expand_brackets(cursor, name.substr(i + 1, close - i - 1), position + i + 1));
    i = close + 1;
  }
  return parts;
}

// Appends every combination of parts, the first part outermost.
void append_product(const NodelistCursor& cursor, const NameParts& parts, std::size_t position,
                    std::vector<std::string>& hosts) {
  std::size_t count = 1;
  for (const auto& part : parts) {
    count *= part.size();  // each part is below the limit, so checking as we go cannot overflow
    if (hosts.size() + count > kMaxNodelistHosts) {
      cursor.fail(position, "more than " + std::to_string(kMaxNodelistHosts) + " hosts");
    }
  }
  std::vector<std::string> names{""};
  for (const auto& part : parts) {
    std::vector<std::string> longer;
    longer.reserve(names.size() * part.size());
    for (const auto& prefix : names) {
      for (const auto& piece : part) longer.push_back(prefix + piece);
    }
    names = std::move(longer);
  }
  hosts.insert(hosts.end(), names.begin(), names.end());
}

// The positive count in `variable`, or nullopt when unset.
std::optional<long long> read_count(const Lookup& getenv, const std::string& variable,
                                    long long minimum) {
  auto text = getenv(variable);
  if (!text) return std::nullopt;
  long long value = 0;
  auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (text->empty() || error != std::errc() || end != text->data() + text->size() ||
      value < minimum) {
    throw SlurmEnvError(variable + "=" + *text + ": expected a whole number of at least " +
                        std::to_string(minimum) + " (is this a broken Slurm allocation?)");
  }
  return value;
}

// The first of `variables` that is set, as (name, value).
std::optional<std::pair<std::string, std::string>> first_set(
    const Lookup& getenv, std::initializer_list<const char*> variables) {
  for (const char* variable : variables) {
    if (auto value = getenv(variable); value && !value->empty())
      return std::pair{std::string(variable), *value};
  }
  return std::nullopt;
}

std::optional<SlurmOption> node_count(const Lookup& getenv) {
  auto found = first_set(getenv, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
  if (!found) return std::nullopt;
  read_count(getenv, found->first, 1);
  return SlurmOption{"nnodes", found->second, found->first};
}

std::optional<SlurmOption> node_rank(const Lookup& getenv,
                                     const std::optional<SlurmOption>& nnodes) {
  auto id = read_count(getenv, "SLURM_NODEID", 0);
  if (!id) return std::nullopt;
  if (nnodes && *id >= std::stoll(nnodes->value)) {
    throw SlurmEnvError("SLURM_NODEID=" + std::to_string(*id) + " is not below " + nnodes->source +
                        "=" + nnodes->value + " (is this a broken Slurm allocation?)");
  }
  return SlurmOption{"node_rank", std::to_string(*id), "SLURM_NODEID"};
}

std::optional<SlurmOption> first_host(const Lookup& getenv) {
  auto found = first_set(getenv, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (!found) return std::nullopt;
  try {
    return SlurmOption{"master_addr", expand_nodelist(found->second).front(), found->first};
  } catch (const SlurmEnvError& e) {
    throw SlurmEnvError(found->first + ": " + e.what());
  }
}

}  // namespace

std::vector<std::string> expand_nodelist(std::string_view nodelist) {
  NodelistCursor cursor{nodelist};
  if (nodelist.empty()) cursor.fail(0, "empty list");
  std::vector<std::string> hosts;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= nodelist.size(); ++i) {
    char c = i < nodelist.size() ? nodelist[i] : ',';
    if (std::isspace(static_cast<unsigned char>(c))) cursor.fail(i, "whitespace");
    if (c == '[') ++depth;
    if (c == ']') depth = std::max(0, depth - 1);  // split_name reports a stray ']'
    if (c != ',' || (depth > 0 && i < nodelist.size())) continue;
    std::string_view name = nodelist.substr(start, i - start);
    append_product(cursor, split_name(cursor, name, start), start, hosts);
    start = i + 1;
  }
  return hosts;
}

std::vector<SlurmOption> SlurmDefaults::options() const {
  std::vector<SlurmOption> out;
  for (const auto* option : {&nnodes, &node_rank, &master_addr, &rdzv_id}) {
    if (*option) out.push_back(**option);
  }
  return out;
}

SlurmDefaults SlurmDefaults::without(
    const std::function<bool(std::string_view dest)>& given) const {
  SlurmDefaults kept = *this;
  for (auto* option : {&kept.nnodes, &kept.node_rank, &kept.master_addr, &kept.rdzv_id}) {
    if (*option && given((*option)->dest)) option->reset();
  }
  return kept;
}

std::string SlurmDefaults::summary() const {
  std::vector<SlurmOption> taken = options();
  if (taken.empty()) return "";
  std::string line = "ddprun: from Slurm job " + job_id + ":";
  for (const auto& option : taken) line += " --" + option.dest + "=" + option.value;
  return line;
}

void SlurmDefaults::check_started_by_srun() const {
  if (in_step || !nnodes || std::stoll(nnodes->value) <= 1) return;
  throw SlurmEnvError(nnodes->source + "=" + nnodes->value +
                      " but ddprun was not started by srun (SLURM_STEP_ID is unset), so it runs "
                      "on this node only and would wait for the others: start it with `srun "
                      "--ntasks-per-node=1 ddprun ...`, or give --nnodes yourself");
}

std::optional<SlurmDefaults> slurm_defaults(const Lookup& getenv) {
  auto job = getenv("SLURM_JOB_ID");
  if (!job || job->empty()) return std::nullopt;
  SlurmDefaults defaults;
  defaults.job_id = *job;
  defaults.in_step = first_set(getenv, {"SLURM_STEP_ID", "SLURM_STEPID"}).has_value();
  defaults.nnodes = node_count(getenv);
  defaults.node_rank = node_rank(getenv, defaults.nnodes);
  defaults.master_addr = first_host(getenv);
  defaults.rdzv_id = SlurmOption{"rdzv_id", *job, "SLURM_JOB_ID"};
  return defaults;
}

}  // namespace ddp::launcher
