#pragma once
// --numa_binding: which CPUs each local rank may run on, chosen as torchrun 2.x does from the
// node's topology in sysfs, near the GPU whose index is the local rank (the agent's view of
// the GPUs, CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER included). The agent applies the
// choice with sched_setaffinity in the worker before exec (torchrun wraps it in numactl).

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp::launcher {

// The binding of one local rank, and the line that says so.
struct NumaChoice {
  std::vector<int> cpus;    // sorted
  std::string description;  // "local rank 0: GPU 0 (0000:1b:00.0) on NUMA node 0: CPUs 0-23"
};

class NumaBindingError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One choice per local rank (0 .. gpu_pci_ids.size()-1 or fewer: `workers`). mode: node,
// socket, exclusive or core-complex. gpu_pci_ids: each GPU's PCI address as CUDA gives it
// ("0000:1B:00.0" or "00000000:1B:00.0"). allowed: the CPUs this process may use. Reads
// <sysfs>/bus/pci/devices/<pci>/numa_node, devices/system/node/*, devices/system/cpu/*.
// Throws NumaBindingError saying what is missing and what to do.
std::vector<NumaChoice> numa_binding_plan(const std::string& mode, int workers,
                                          const std::vector<std::string>& gpu_pci_ids,
                                          const std::vector<int>& allowed,
                                          const std::filesystem::path& sysfs = "/sys");

// "0-3,8,10-11" for a sorted list of CPUs (the form of sysfs and numactl).
std::string cpu_ranges(const std::vector<int>& cpus);

}  // namespace ddp::launcher
