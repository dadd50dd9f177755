// --numa_binding's choice of CPUs, over a made-up sysfs: two sockets, three NUMA nodes, four
// GPUs, hyperthreads and two L3 caches on node 0.
#include "process/numa_binding.hpp"

#include <catch2/catch.hpp>
#include <fstream>

#include "test_support.hpp"

using namespace ddp::launcher;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

// node 0: CPUs 0-3 with siblings 8-11, socket 0, L3 {0,1,8,9} and {2,3,10,11}
// node 1: CPUs 4-7 with siblings 12-15, socket 0, one L3
// node 2: CPUs 16-19, no siblings, socket 1, one L3
// GPU 0 and 1 on node 0, GPU 2 on node 1, GPU 3 on node 2.
class FakeSysfs {
 public:
  FakeSysfs() {
    const fs::path root = dir_.path();
    write(root / "devices/system/node/possible", "0-2");
    write(root / "devices/system/node/node0/cpulist", "0-3,8-11");
    write(root / "devices/system/node/node1/cpulist", "4-7,12-15");
    write(root / "devices/system/node/node2/cpulist", "16-19");
    for (int cpu = 0; cpu < 20; ++cpu) {
      const fs::path c = root / "devices/system/cpu" / ("cpu" + std::to_string(cpu));
      const int socket = cpu >= 16 ? 1 : 0;
      write(c / "topology/physical_package_id", std::to_string(socket));
      const int core = cpu < 16 ? cpu % 8 : cpu;
      write(c / "topology/thread_siblings_list",
            cpu < 16 ? std::to_string(core) + "," + std::to_string(core + 8) : std::to_string(cpu));
      write(c / "cache/index0/level", "1");
      write(c / "cache/index0/shared_cpu_list", std::to_string(cpu));
      std::string l3 = "16-19";
      if (cpu < 16) {
        if (core < 2)
          l3 = "0-1,8-9";
        else if (core < 4)
          l3 = "2-3,10-11";
        else
          l3 = "4-7,12-15";
      }
      write(c / "cache/index3/level", "3");
      write(c / "cache/index3/shared_cpu_list", l3);
    }
    const char* numa[] = {"0", "0", "1", "2"};
    for (int gpu = 0; gpu < 4; ++gpu) {
      write(root / "bus/pci/devices" / sysfs_name(gpu) / "numa_node", numa[gpu]);
    }
  }
  const fs::path& path() const { return dir_.path(); }
  static std::string sysfs_name(int gpu) {
    const char* names[] = {"0000:1b:00.0", "0000:1c:00.0", "0000:3b:00.0", "0000:5b:00.0"};
    return names[gpu];
  }

 private:
  ddp::test::TempDir dir_;
};

// As CUDA's cuDeviceGetPCIBusId gives them.
const std::vector<std::string> kGpus = {"00000000:1B:00.0", "00000000:1C:00.0", "0000:3B:00.0",
                                        "0000:5B:00.0"};

std::vector<int> all_cpus() {
  std::vector<int> cpus;
  for (int cpu = 0; cpu < 20; ++cpu) cpus.push_back(cpu);
  return cpus;
}

std::vector<std::string> ranges(const std::vector<NumaChoice>& plan) {
  std::vector<std::string> out;
  for (const NumaChoice& choice : plan) out.push_back(cpu_ranges(choice.cpus));
  return out;
}

}  // namespace

TEST_CASE("node: every CPU of the GPU's NUMA node") {
  FakeSysfs sysfs;
  auto plan = numa_binding_plan("node", 4, kGpus, all_cpus(), sysfs.path());
  CHECK(ranges(plan) == std::vector<std::string>{"0-3,8-11", "0-3,8-11", "4-7,12-15", "16-19"});
  CHECK(plan[2].description == "local rank 2: GPU 2 (0000:3b:00.0) on NUMA node 1: CPUs 4-7,12-15");
}

TEST_CASE("socket: every NUMA node of the GPU's socket") {
  FakeSysfs sysfs;
  auto plan = numa_binding_plan("socket", 4, kGpus, all_cpus(), sysfs.path());
  CHECK(ranges(plan) == std::vector<std::string>{"0-15", "0-15", "0-15", "16-19"});
  CHECK_THAT(plan[0].description, Catch::Contains("socket 0 (NUMA nodes 0,1)"));
}

TEST_CASE("exclusive: the node's physical cores shared out among its GPUs") {
  FakeSysfs sysfs;
  auto plan = numa_binding_plan("exclusive", 4, kGpus, all_cpus(), sysfs.path());
  CHECK(ranges(plan) == std::vector<std::string>{"0-1,8-9", "2-3,10-11", "4-7,12-15", "16-19"});
}

TEST_CASE("core-complex: one last-level cache per GPU") {
  FakeSysfs sysfs;
  auto plan = numa_binding_plan("core-complex", 4, kGpus, all_cpus(), sysfs.path());
  CHECK(ranges(plan) == std::vector<std::string>{"0-1,8-9", "2-3,10-11", "4-7,12-15", "16-19"});
}

TEST_CASE("only the CPUs this process may use, and fewer workers than GPUs") {
  FakeSysfs sysfs;
  std::vector<int> allowed = {0, 1, 2, 3, 4, 5, 16};
  auto plan = numa_binding_plan("node", 2, kGpus, allowed, sysfs.path());
  CHECK(ranges(plan) == std::vector<std::string>{"0-3", "0-3"});
}

TEST_CASE("what cannot be bound is said, naming the cause") {
  FakeSysfs sysfs;
  auto error = [&](const std::string& mode, int workers, std::vector<std::string> gpus,
                   std::vector<int> allowed) -> std::string {
    try {
      numa_binding_plan(mode, workers, gpus, allowed, sysfs.path());
    } catch (const NumaBindingError& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK_THAT(error("node", 1, {}, all_cpus()), Catch::Contains("no GPU found"));
  CHECK_THAT(error("node", 5, kGpus, all_cpus()), Catch::Contains("local rank 4 has no GPU"));
  CHECK_THAT(error("node", 1, {"0000:99:00.0"}, all_cpus()),
             Catch::Contains("bus/pci/devices/0000:99:00.0/numa_node"));
  CHECK_THAT(error("node", 1, {"garbage"}, all_cpus()), Catch::Contains("'garbage'"));
  CHECK_THAT(error("node", 3, kGpus, {0, 1}), Catch::Contains("NUMA node 1 has no CPU"));
  CHECK_THAT(error("exclusive", 2, kGpus, {0, 8}), Catch::Contains("1 physical cores for 2 GPUs"));
}
