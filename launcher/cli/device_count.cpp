#include "ddp/launcher/device_count.hpp"

#include <dlfcn.h>

namespace ddp::launcher {
namespace {

// A dlopen'ed library, closed on scope exit.
class SharedLibrary {
 public:
  explicit SharedLibrary(const char* name) : handle_(::dlopen(name, RTLD_NOW | RTLD_LOCAL)) {}
  ~SharedLibrary() {
    if (handle_) ::dlclose(handle_);
  }
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  template <typename Fn>
  Fn* symbol(const char* name) const {
    return handle_ ? reinterpret_cast<Fn*>(::dlsym(handle_, name)) : nullptr;
  }

 private:
  void* handle_;
};

// The driver API: cuInit(0) then cuDeviceGetCount. Honours CUDA_VISIBLE_DEVICES.
int count_with_driver() {
  SharedLibrary cuda("libcuda.so.1");
  auto init = cuda.symbol<int(unsigned)>("cuInit");
  auto count = cuda.symbol<int(int*)>("cuDeviceGetCount");
  int n = 0;
  if (!init || !count || init(0) != 0 || count(&n) != 0) return -1;
  return n;
}

// NVML: every device on the machine.
int count_with_nvml() {
  SharedLibrary nvml("libnvidia-ml.so.1");
  auto init = nvml.symbol<int()>("nvmlInit_v2");
  auto count = nvml.symbol<int(unsigned*)>("nvmlDeviceGetCount_v2");
  auto shutdown = nvml.symbol<int()>("nvmlShutdown");
  unsigned n = 0;
  if (!init || !count || init() != 0) return -1;
  int result = count(&n) == 0 ? static_cast<int>(n) : -1;
  if (shutdown) shutdown();
  return result;
}

}  // namespace

std::vector<std::string> gpu_pci_bus_ids() {
  SharedLibrary cuda("libcuda.so.1");
  auto init = cuda.symbol<int(unsigned)>("cuInit");
  auto count = cuda.symbol<int(int*)>("cuDeviceGetCount");
  auto get = cuda.symbol<int(int*, int)>("cuDeviceGet");  // CUdevice is an int
  auto bus_id = cuda.symbol<int(char*, int, int)>("cuDeviceGetPCIBusId");
  std::vector<std::string> ids;
  int n = 0;
  if (!init || !count || !get || !bus_id || init(0) != 0 || count(&n) != 0) return ids;
  for (int i = 0; i < n; ++i) {
    int device = 0;
    char id[64] = {};
    if (get(&device, i) != 0 || bus_id(id, sizeof id, device) != 0) return {};
    ids.emplace_back(id);
  }
  return ids;
}

int gpu_device_count() {
  int n = count_with_driver();
  if (n < 0) n = count_with_nvml();
  return n < 0 ? 0 : n;
}

std::string no_gpu_message() {
  return "no GPU found (neither libcuda.so.1 nor libnvidia-ml.so.1 reported a device)";
}

}  // namespace ddp::launcher
