#pragma once
// Counts GPUs without linking CUDA: loads the driver (libcuda.so.1) or NVML
// (libnvidia-ml.so.1) at run time. Used for --nproc_per_node=gpu|auto.

#include <string>
#include <vector>

namespace ddp::launcher {

// The number of CUDA devices this process can see (honouring CUDA_VISIBLE_DEVICES through
// the driver); 0 when neither library loads or they report no device. Never throws.
int gpu_device_count();

// The PCI address of each CUDA device this process can see, in CUDA's order ("0000:1B:00.0"),
// from the driver; empty when it does not load or reports none. For --numa_binding.
std::vector<std::string> gpu_pci_bus_ids();

// What to tell the user when gpu_device_count() is 0.
std::string no_gpu_message();

}  // namespace ddp::launcher
