#include "process/numa_binding.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace ddp::launcher {
namespace fs = std::filesystem;
namespace {

std::string read_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    throw NumaBindingError("cannot read " + path.string());
  }
  return line;
}

// "0-3,8,10-11\n" as sysfs writes CPU and node lists.
std::set<int> parse_ranges(const std::string& text, const fs::path& from) {
  std::set<int> values;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    part.erase(std::remove_if(part.begin(), part.end(), ::isspace), part.end());
    if (part.empty()) continue;
    int first = 0;
    int last = 0;
    char dash = 0;
    std::istringstream range(part);
    range >> first;
    if (!range) throw NumaBindingError("cannot parse '" + text + "' in " + from.string());
    last = first;
    if (range >> dash >> last; dash != 0 && dash != '-') {
      throw NumaBindingError("cannot parse '" + text + "' in " + from.string());
    }
    for (int v = first; v <= last; ++v) values.insert(v);
  }
  return values;
}

std::set<int> read_ranges(const fs::path& path) { return parse_ranges(read_line(path), path); }

// CUDA's "00000000:1B:00.0" as sysfs names it: "0000:1b:00.0".
std::string sysfs_pci(const std::string& cuda_id) {
  unsigned domain = 0;
  unsigned bus = 0;
  unsigned device = 0;
  unsigned function = 0;
  if (std::sscanf(cuda_id.c_str(), "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4) {
    throw NumaBindingError("cannot parse the GPU's PCI address '" + cuda_id + "'");
  }
  char name[32];
  std::snprintf(name, sizeof name, "%04x:%02x:%02x.%x", domain, bus, device, function);
  return name;
}

class Topology {
 public:
  Topology(fs::path sysfs, const std::vector<int>& allowed)
      : sysfs_(std::move(sysfs)), allowed_(allowed.begin(), allowed.end()) {}

  int numa_node_of_gpu(const std::string& pci) const {
    const fs::path path = sysfs_ / "bus/pci/devices" / pci / "numa_node";
    const std::string text = read_line(path);
    return std::max(std::stoi(text), 0);  // -1 on a machine with one node
  }

  // The node's CPUs that this process may use.
  std::set<int> cpus_of_node(int node) const {
    std::set<int> cpus;
    for (int cpu : read_ranges(node_dir(node) / "cpulist")) {
      if (allowed_.contains(cpu)) cpus.insert(cpu);
    }
    return cpus;
  }

  std::set<int> nodes() const { return read_ranges(sysfs_ / "devices/system/node/possible"); }

  int socket_of_cpu(int cpu) const {
    return std::stoi(read_line(cpu_dir(cpu) / "topology/physical_package_id"));
  }

  // The lowest CPU of the core (hyperthread siblings) that cpu is on.
  int core_of_cpu(int cpu) const {
    return *read_ranges(cpu_dir(cpu) / "topology/thread_siblings_list").begin();
  }

  // The lowest CPU sharing cpu's last-level cache.
  int complex_of_cpu(int cpu) const {
    int best_level = -1;
    std::set<int> shared = {cpu};
    const fs::path cache = cpu_dir(cpu) / "cache";
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(cache, ec)) {
      if (!entry.path().filename().string().starts_with("index")) continue;
      const int level = std::stoi(read_line(entry.path() / "level"));
      if (level > best_level) {
        best_level = level;
        shared = read_ranges(entry.path() / "shared_cpu_list");
      }
    }
    return *shared.begin();
  }

 private:
  fs::path node_dir(int node) const {
    return sysfs_ / "devices/system/node" / ("node" + std::to_string(node));
  }
  fs::path cpu_dir(int cpu) const {
    return sysfs_ / "devices/system/cpu" / ("cpu" + std::to_string(cpu));
  }

  fs::path sysfs_;
  std::set<int> allowed_;
};

// The GPUs (by index) on the same NUMA node as gpu, in index order.
std::vector<int> gpus_on_node(const std::vector<int>& node_of_gpu, int node) {
  std::vector<int> gpus;
  for (std::size_t i = 0; i < node_of_gpu.size(); ++i) {
    if (node_of_gpu[i] == node) gpus.push_back(static_cast<int>(i));
  }
  return gpus;
}

// Groups cpus by key_of(cpu), in the order of the keys.
template <typename Key>
std::map<int, std::set<int>> group_by(const std::set<int>& cpus, Key key_of) {
  std::map<int, std::set<int>> groups;
  for (int cpu : cpus) groups[key_of(cpu)].insert(cpu);
  return groups;
}

}  // namespace

std::string cpu_ranges(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<NumaChoice> numa_binding_plan(const std::string& mode, int workers,
                                          const std::vector<std::string>& gpu_pci_ids,
                                          const std::vector<int>& allowed, const fs::path& sysfs) {
  if (gpu_pci_ids.empty()) {
    throw NumaBindingError(
        "no GPU found: NUMA binding binds each worker near the GPU of its local rank");
  }
  if (static_cast<std::size_t>(workers) > gpu_pci_ids.size()) {
    throw NumaBindingError("local rank " + std::to_string(gpu_pci_ids.size()) + " has no GPU (" +
                           std::to_string(gpu_pci_ids.size()) +
                           " visible): start at most one worker per GPU");
  }
  const Topology topology(sysfs, allowed);
  std::vector<std::string> pci;
  std::vector<int> node_of_gpu;
  for (const std::string& id : gpu_pci_ids) {
    pci.push_back(sysfs_pci(id));
    node_of_gpu.push_back(topology.numa_node_of_gpu(pci.back()));
  }
  std::vector<NumaChoice> plan;
  for (int rank = 0; rank < workers; ++rank) {
    const int node = node_of_gpu[static_cast<std::size_t>(rank)];
    const std::vector<int> peers = gpus_on_node(node_of_gpu, node);
    const auto index =
        static_cast<std::size_t>(std::find(peers.begin(), peers.end(), rank) - peers.begin());
    const std::set<int> node_cpus = topology.cpus_of_node(node);
    if (node_cpus.empty()) {
      throw NumaBindingError("NUMA node " + std::to_string(node) +
                             " has no CPU this process may use (see taskset -p " +
                             std::to_string(::getpid()) + ")");
    }
    std::set<int> cpus;
    std::string where = "NUMA node " + std::to_string(node);
    if (mode == "node") {
      cpus = node_cpus;
    } else if (mode == "socket") {
      const int socket = topology.socket_of_cpu(*node_cpus.begin());
      std::string nodes;
      for (int other : topology.nodes()) {
        std::set<int> other_cpus;
        try {
          other_cpus = topology.cpus_of_node(other);
        } catch (const NumaBindingError&) {
          continue;  // a possible node that is not online
        }
        if (other_cpus.empty() || topology.socket_of_cpu(*other_cpus.begin()) != socket) continue;
        cpus.insert(other_cpus.begin(), other_cpus.end());
        nodes += (nodes.empty() ? "" : ",") + std::to_string(other);
      }
      where = "socket " + std::to_string(socket) + " (NUMA nodes " + nodes + ")";
    } else if (mode == "exclusive") {
      // The node's physical cores split evenly among its GPUs, the first ones one more.
      const auto cores = group_by(node_cpus, [&](int cpu) { return topology.core_of_cpu(cpu); });
      const std::size_t per_gpu = cores.size() / peers.size();
      const std::size_t extra = cores.size() % peers.size();
      if (per_gpu < 1) {
        throw NumaBindingError("NUMA node " + std::to_string(node) + " has " +
                               std::to_string(cores.size()) + " physical cores for " +
                               std::to_string(peers.size()) +
                               " GPUs: --numa_binding=exclusive needs one core per GPU at least");
      }
      const std::size_t begin = index * per_gpu + std::min(index, extra);
      const std::size_t end = begin + per_gpu + (index < extra ? 1 : 0);
      std::size_t i = 0;
      for (const auto& [core, siblings] : cores) {
        if (i >= begin && i < end) cpus.insert(siblings.begin(), siblings.end());
        ++i;
      }
      where += ", cores " + std::to_string(begin) + "-" + std::to_string(end - 1) + " of " +
               std::to_string(cores.size());
    } else if (mode == "core-complex") {
      // One last-level cache per GPU: the fullest first, then by lowest CPU.
      const auto complexes =
          group_by(node_cpus, [&](int cpu) { return topology.complex_of_cpu(cpu); });
      std::vector<std::set<int>> ordered;
      for (const auto& [first, group] : complexes) ordered.push_back(group);
      std::stable_sort(ordered.begin(), ordered.end(),
                       [](const auto& a, const auto& b) { return a.size() > b.size(); });
      cpus = ordered[index % ordered.size()];
      where += ", core complex " + std::to_string(index % ordered.size()) + " of " +
               std::to_string(ordered.size());
    } else {
      throw NumaBindingError("unknown mode '" + mode +
                             "' (node, socket, exclusive or core-complex)");
    }
    NumaChoice choice;
    choice.cpus.assign(cpus.begin(), cpus.end());
    choice.description = "local rank " + std::to_string(rank) + ": GPU " + std::to_string(rank) +
                         " (" + pci[static_cast<std::size_t>(rank)] + ") on " + where + ": CPUs " +
                         cpu_ranges(choice.cpus);
    plan.push_back(std::move(choice));
  }
  return plan;
}

}  // namespace ddp::launcher
