// libddprun-nccl-profiler.so loaded by a real NCCL (NCCL_PROFILER_PLUGIN) into a process that
// runs a two-rank communicator on two GPUs (ncclCommInitAll) without libddp: its collectives
// must be on the record page, started and finished by NCCL's kernel events. NCCL runs a
// one-rank communicator's collectives as copies, with no profiler events, hence two devices;
// skips (with the reason) where fewer are visible.
#include <cuda_runtime.h>
#include <nccl.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "ddp/common/collective_record.hpp"
#include "ddp/common/worker_contract.hpp"
#include "process/record_mapping.hpp"
#include "skip.hpp"

using namespace ddp::record;

namespace {

std::string fewer_than_two_gpus() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device (") + cudaGetErrorString(status) + ")";
  }
  return count < 2 ? "needs two CUDA devices, " + std::to_string(count) + " visible" : "";
}

}  // namespace

TEST_CASE("nccl profiler on GPUs: a plain NCCL program's collectives are recorded") {
  if (const auto reason = fewer_than_two_gpus(); !reason.empty()) {
    return ddp::test::skip(reason);
  }
  ddp::launcher::RecordMapping mapping;
  // As ddprun sets them for a worker; NCCL reads NCCL_PROFILER_PLUGIN at its first init.
  setenv(ddp::contract::kRecordFd, std::to_string(mapping.fd()).c_str(), 1);
  setenv("NCCL_PROFILER_PLUGIN", DDP_NCCL_PROFILER_PATH, 1);
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");

  constexpr int kRanks = 2;
  constexpr int kCollectives = 5;
  constexpr std::size_t kCount = 1 << 16;
  int devices[kRanks] = {0, 1};
  ncclComm_t comms[kRanks];
  REQUIRE(ncclCommInitAll(comms, kRanks, devices) == ncclSuccess);
  float* buffers[kRanks];
  cudaStream_t streams[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(cudaSetDevice(r) == cudaSuccess);
    REQUIRE(cudaMalloc(&buffers[r], kCount * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaStreamCreate(&streams[r]) == cudaSuccess);
  }
  for (int i = 0; i < kCollectives; ++i) {
    REQUIRE(ncclGroupStart() == ncclSuccess);
    for (int r = 0; r < kRanks; ++r) {
      REQUIRE(ncclAllReduce(buffers[r], buffers[r], kCount, ncclFloat, ncclSum, comms[r],
                            streams[r]) == ncclSuccess);
    }
    REQUIRE(ncclGroupEnd() == ncclSuccess);
  }
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(cudaSetDevice(r) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(streams[r]) == cudaSuccess);
  }
  // The kernel's end reaches the plugin through NCCL's proxy thread, a moment after the stream.
  const RecordPage& page = mapping.page();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (page.finished.load() < kCollectives && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < kRanks; ++r) {
    ncclCommDestroy(comms[r]);
    cudaFree(buffers[r]);
    cudaStreamDestroy(streams[r]);
  }
  REQUIRE(page.magic.load() == kRecordMagic);
  CHECK(unpack_name(page.writer.load()) == "ncclprof");
  CHECK(page.world_size.load() == kRanks);
  CHECK(page.queued.load() == kCollectives);
  CHECK(page.finished.load() == kCollectives);
  for (std::uint64_t seq = 1; seq <= kCollectives; ++seq) {
    const CollectiveSlot& slot = page.collectives[seq];
    INFO("collective " << seq);
    CHECK(slot.op.load() == static_cast<std::uint64_t>(Op::kAllReduce));
    CHECK(unpack_name(slot.dtype.load()) == "float32");
    CHECK(slot.count.load() == kCount);
    CHECK(slot.started_ns.load() != 0);
    CHECK(slot.finished_ns.load() >= slot.started_ns.load());
  }
}
