// The collective record on the NCCL backend (one GPU): collectives are recorded at launch and
// finished by the stream callback, with the Reducer's buckets. Skips without a device.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "ddp/common/collective_record.hpp"
#include "ddp/runtime.hpp"
#include "ddp/store/memory_store.hpp"
#include "skip.hpp"
#include "thread_world.hpp"

using namespace ddp::record;

namespace {

// Why the GPU test cannot run here, or "" when it can.
std::string no_gpu_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess)
    return std::string("no usable CUDA device: ") + cudaGetErrorString(status);
  if (count == 0) return "no CUDA device";
  return "";
}

}  // namespace

TEST_CASE("nccl: collectives and Reducer buckets are recorded, finished by the stream") {
  if (const auto reason = no_gpu_reason(); !reason.empty()) return ddp::test::skip(reason);
  const int fd = memfd_create("ddp-nccl-record-test", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, sizeof(RecordPage)) == 0);
  void* mapped = mmap(nullptr, sizeof(RecordPage), PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(mapped != MAP_FAILED);
  const auto& page = *static_cast<const RecordPage*>(mapped);
  constexpr std::uint64_t kSteps = 3;
  std::uint64_t buckets = 0;
  {
    ddp::InitOptions options;
    options.backend = ddp::Backend::Nccl;
    options.init_timeout = std::chrono::seconds(60);
    options.record_fd = fd;
    ddp::Context ctx = ddp::init(ddp::test::thread_env(0, 1),
                                 std::make_shared<ddp::store::MemoryStore>(), options);
    auto memory = ctx.communicator().allocate(2 * 1000 * sizeof(float));
    auto* values = static_cast<float*>(memory.get());
    std::vector<ddp::Parameter> parameters = {{"a", std::span<float>(values, 1000)},
                                              {"b", std::span<float>(values + 1000, 1000)}};
    ddp::ReducerOptions reducer_options;
    reducer_options.first_bucket_mb = 1e-6;  // one parameter per bucket
    reducer_options.bucket_cap_mb = 1e-6;
    ddp::Reducer reducer(ctx, parameters, reducer_options);
    buckets = reducer.buckets().size();
    for (std::uint64_t s = 0; s < kSteps; ++s) {
      reducer.mark_ready(1);
      reducer.mark_ready(0);
      reducer.finalize();
    }
    ctx.barrier();  // a host wait: every earlier stream callback has run
  }
  REQUIRE(buckets == 2);
  REQUIRE(page.magic.load() == kRecordMagic);
  CHECK(unpack_name(page.backend.load()) == "nccl");
  const std::uint64_t expected = 2 + kSteps * buckets + 1;  // broadcasts, buckets, barrier
  CHECK(page.queued.load() == expected);
  CHECK(page.finished.load() == expected);
  CHECK(page.steps.load() == kSteps);
  for (std::uint64_t seq = 3; seq < expected; ++seq) {
    const auto& slot = page.collectives[seq % kCollectiveSlots];
    CHECK(slot.seq.load() == seq);
    CHECK(op_name(slot.op.load()) == std::string("all_reduce"));
    CHECK(slot.bucket.load() == (seq - 3) % buckets);
    CHECK(slot.finished_ns.load() >= slot.queued_ns.load());
  }
  munmap(mapped, sizeof(RecordPage));
  close(fd);
}
