// The collective record, writer side: CollectiveRecorder over a memfd page read through a
// second mapping (as the agent reads it), and a Gloo job with a Reducer recording into one
// page per rank.
#include "collective_recorder.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <future>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/common/collective_record.hpp"
#include "ddp/common/worker_contract.hpp"
#include "ddp/runtime.hpp"
#include "ddp/store/memory_store.hpp"
#include "test_support.hpp"
#include "thread_world.hpp"

using ddp::detail::CollectiveRecorder;
using namespace ddp::record;
using Vars = std::map<std::string, std::string>;

namespace {

// A zeroed record page as the agent makes it: a memfd of sizeof(RecordPage) bytes, mapped
// here for reading.
class AgentPage {
 public:
  // inherited: the descriptor stays open across exec (as the agent hands it to a worker).
  explicit AgentPage(std::size_t bytes = sizeof(RecordPage), bool inherited = false) {
    fd_ = memfd_create("ddp-record-test", inherited ? 0u : MFD_CLOEXEC);
    REQUIRE(fd_ >= 0);
    REQUIRE(ftruncate(fd_, static_cast<off_t>(bytes)) == 0);
    if (bytes == sizeof(RecordPage)) {
      void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
      REQUIRE(mapped != MAP_FAILED);
      page_ = static_cast<RecordPage*>(mapped);
    }
  }
  ~AgentPage() {
    if (page_ != nullptr) munmap(page_, sizeof(RecordPage));
    close(fd_);
  }
  AgentPage(const AgentPage&) = delete;
  AgentPage& operator=(const AgentPage&) = delete;
  int fd() const { return fd_; }
  RecordPage& page() const { return *page_; }

 private:
  int fd_ = -1;
  RecordPage* page_ = nullptr;
};

// A stable copy of a collective slot, as the agent would take it.
struct Collective {
  std::uint64_t seq, op, dtype, count, bytes, bucket, queued_ns, started_ns, finished_ns, failed;
};

Collective read_collective(const RecordPage& page, std::uint64_t seq) {
  Collective c{};
  const bool stable = read_stable(page.collectives[seq % kCollectiveSlots], [&](const auto& s) {
    c = {s.seq.load(),         s.op.load(),     s.dtype.load(),     s.count.load(),
         s.bytes.load(),       s.bucket.load(), s.queued_ns.load(), s.started_ns.load(),
         s.finished_ns.load(), s.failed.load()};
  });
  REQUIRE(stable);
  return c;
}

struct Step {
  std::uint64_t step, begin_ns, ready_ns, finalized_ns;
};

Step read_step(const RecordPage& page, std::uint64_t step) {
  Step s{};
  const bool stable = read_stable(page.step_slots[step % kStepSlots], [&](const auto& slot) {
    s = {slot.step.load(), slot.begin_ns.load(), slot.ready_ns.load(), slot.finalized_ns.load()};
  });
  REQUIRE(stable);
  return s;
}

// Sends this process's stderr to a file for its lifetime; text() reads what was written.
class CapturedStderr {
 public:
  CapturedStderr() : file_(dir_.path() / "stderr") {
    std::fflush(stderr);
    saved_ = dup(STDERR_FILENO);
    std::FILE* out = std::fopen(file_.c_str(), "w");
    REQUIRE(out != nullptr);
    dup2(fileno(out), STDERR_FILENO);
    std::fclose(out);
  }
  ~CapturedStderr() { restore(); }
  CapturedStderr(const CapturedStderr&) = delete;
  CapturedStderr& operator=(const CapturedStderr&) = delete;
  std::string text() {
    restore();
    std::ifstream in(file_);
    std::stringstream content;
    content << in.rdbuf();
    return content.str();
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, STDERR_FILENO);
    close(saved_);
    saved_ = -1;
  }
  ddp::test::TempDir dir_;
  std::filesystem::path file_;
  int saved_ = -1;
};

}  // namespace

TEST_CASE("CollectiveRecorder publishes its header and records collectives in order") {
  AgentPage agent;
  auto recorder = CollectiveRecorder::attach(agent.fd(), 2, 4, ddp::Backend::Gloo);
  REQUIRE(recorder != nullptr);
  const RecordPage& page = agent.page();
  CHECK(page.magic.load() == kRecordMagic);
  CHECK(page.version.load() == kRecordVersion);
  CHECK(page.pid.load() == static_cast<std::uint64_t>(getpid()));
  CHECK(page.rank.load() == 2);
  CHECK(page.world_size.load() == 4);
  CHECK(unpack_name(page.backend.load()) == "gloo");

  const Op ops[] = {Op::kAllReduce, Op::kBroadcast, Op::kAllGather, Op::kReduceScatter,
                    Op::kAllReduce};
  const std::uint64_t buckets[] = {0, kNoBucket, kNoBucket, kNoBucket, 1};
  for (std::uint64_t i = 0; i < 5; ++i) {
    const auto seq =
        recorder->on_queued(ops[i], pack_name("float32"), 100 + i, 4 * (100 + i), buckets[i]);
    REQUIRE(seq == i + 1);
    CHECK(page.queued.load() == seq);
    CHECK(read_collective(page, seq).started_ns == 0);  // queued, not yet started
    recorder->on_started(seq);
    CHECK(page.started.load() == seq);
    CHECK(read_collective(page, seq).finished_ns == 0);
    recorder->on_finished(seq, i == 4);
    CHECK(page.finished.load() == seq);
  }
  const auto barrier = recorder->on_queued(ddp::detail::CallDescriptor{}, 7);
  CHECK(barrier == 6);

  std::uint64_t previous_finish = 0;
  for (std::uint64_t i = 0; i < 5; ++i) {
    const Collective c = read_collective(page, i + 1);
    CHECK(c.seq == i + 1);
    CHECK(c.op == static_cast<std::uint64_t>(ops[i]));
    CHECK(unpack_name(c.dtype) == "float32");
    CHECK(c.count == 100 + i);
    CHECK(c.bytes == 4 * (100 + i));
    CHECK(c.bucket == buckets[i]);
    CHECK(c.queued_ns >= previous_finish);
    CHECK(c.started_ns >= c.queued_ns);
    CHECK(c.finished_ns >= c.started_ns);
    CHECK(c.failed == (i == 4 ? 1u : 0u));
    previous_finish = c.finished_ns;
  }
  CHECK(page.failed.load() == 1);
  CHECK(page.last_finished_ns.load() == previous_finish);
  const Collective b = read_collective(page, 6);
  CHECK(op_name(b.op) == std::string("barrier"));
  CHECK(b.bucket == kNoBucket);  // a barrier carries no bucket
  CHECK(b.count == 0);
  CHECK(page.queued.load() == 6);
  CHECK(page.finished.load() == 5);
}

TEST_CASE("CollectiveRecorder sees the agent's stop request") {
  AgentPage agent;
  auto recorder = CollectiveRecorder::attach(agent.fd(), 0, 2, ddp::Backend::Nccl);
  REQUIRE(recorder != nullptr);
  CHECK_FALSE(recorder->stop_requested());
  agent.page().stop_requested.store(1);  // what ddprun writes when the job hung
  CHECK(recorder->stop_requested());
}

TEST_CASE("CollectiveRecorder names dtypes as PyTorch does and counts per call") {
  AgentPage agent;
  auto recorder = CollectiveRecorder::attach(agent.fd(), 0, 2, ddp::Backend::Nccl);
  REQUIRE(recorder != nullptr);
  CHECK(unpack_name(agent.page().backend.load()) == "nccl");
  using ddp::detail::CallDescriptor;
  using ddp::detail::CallKind;
  const auto seq =
      recorder->on_queued(CallDescriptor{CallKind::Allreduce, ddp::DType::BF16, 10, 0}, 3);
  const Collective c = read_collective(agent.page(), seq);
  CHECK(unpack_name(c.dtype) == "bfloat16");
  CHECK(c.bytes == 20);
  CHECK(c.bucket == 3);
  CHECK(unpack_name(CollectiveRecorder::dtype_word(ddp::DType::F64)) == "float64");
  CHECK(unpack_name(CollectiveRecorder::dtype_word(ddp::DType::I64)) == "int64");
}

TEST_CASE("The collective ring wraps past kCollectiveSlots") {
  AgentPage agent;
  auto recorder = CollectiveRecorder::attach(agent.fd(), 0, 1, ddp::Backend::Gloo);
  REQUIRE(recorder != nullptr);
  const RecordPage& page = agent.page();

  SECTION("collectives that finish in turn: the last kCollectiveSlots are kept") {
    const std::uint64_t total = 2 * kCollectiveSlots + 88;
    for (std::uint64_t i = 1; i <= total; ++i) {
      const auto seq = recorder->on_queued(Op::kAllReduce, pack_name("float32"), i, 4 * i, i % 7);
      recorder->on_started(seq);
      recorder->on_finished(seq, false);
    }
    CHECK(page.queued.load() == total);
    CHECK(page.finished.load() == total);
    for (std::uint64_t seq = total - kCollectiveSlots + 1; seq <= total; ++seq) {
      const Collective c = read_collective(page, seq);
      REQUIRE(c.seq == seq);
      CHECK(c.count == seq);
      CHECK(c.bucket == seq % 7);
      CHECK(c.finished_ns != 0);
    }
  }

  SECTION("more than kCollectiveSlots in flight: an unfinished slot is never overwritten") {
    const std::uint64_t total = kCollectiveSlots + 40;
    for (std::uint64_t i = 1; i <= total; ++i) {
      recorder->on_queued(Op::kAllReduce, pack_name("float32"), i, 4 * i, kNoBucket);
    }
    CHECK(page.queued.load() == total);  // the counter moves even for unrecorded ones
    const Collective kept = read_collective(page, kCollectiveSlots + 1);
    CHECK(kept.seq == 1);  // collective 1 has not finished: its slot still holds it
    for (std::uint64_t seq = 1; seq <= total; ++seq) {
      recorder->on_started(seq);
      recorder->on_finished(seq, false);
    }
    CHECK(page.finished.load() == total);
    CHECK(read_collective(page, 1).finished_ns != 0);
    // Once the ring has room again, new collectives are recorded.
    const auto next = recorder->on_queued(Op::kBarrier, 0, 0, 0, kNoBucket);
    CHECK(read_collective(page, next).seq == next);
  }
}

TEST_CASE("read_stable rejects a slot caught half-written") {
  AgentPage agent;
  CollectiveSlot& slot = agent.page().collectives[5];
  std::uint64_t copied = 0;
  auto copy = [&](const CollectiveSlot& s) { copied = s.count.load(); };

  begin_write(slot);
  slot.count.store(42, std::memory_order_relaxed);
  CHECK((slot.version.load() & 1) == 1);
  CHECK_FALSE(read_stable(slot, copy));  // odd version: being written
  end_write(slot);
  CHECK(read_stable(slot, copy));
  CHECK(copied == 42);

  // A write that starts and ends while the reader copies: the version moved.
  const bool stable = read_stable(slot, [&](const CollectiveSlot& s) {
    copy(s);
    begin_write(slot);
    slot.count.store(43, std::memory_order_relaxed);
    end_write(slot);
  });
  CHECK_FALSE(stable);
}

TEST_CASE("Reducer step marks: a step begins at the previous finalize and totals add up") {
  AgentPage agent;
  auto recorder = CollectiveRecorder::attach(agent.fd(), 0, 1, ddp::Backend::Gloo);
  REQUIRE(recorder != nullptr);
  const RecordPage& page = agent.page();
  recorder->step_finalized();  // no step open: nothing
  CHECK(page.steps.load() == 0);
  for (int s = 0; s < 3; ++s) {
    recorder->step_begin();
    recorder->step_begin();  // a step already open: no-op
    recorder->step_ready();
    recorder->step_finalized();
  }
  recorder->step_ready();  // opens step 4 by itself
  CHECK(page.steps.load() == 4);
  std::uint64_t compute = 0, wait = 0, previous_finalized = 0;
  for (std::uint64_t k = 1; k <= 3; ++k) {
    const Step s = read_step(page, k);
    CHECK(s.step == k);
    if (k > 1) CHECK(s.begin_ns == previous_finalized);
    CHECK(s.ready_ns >= s.begin_ns);
    CHECK(s.finalized_ns >= s.ready_ns);
    compute += s.ready_ns - s.begin_ns;
    wait += s.finalized_ns - s.ready_ns;
    previous_finalized = s.finalized_ns;
  }
  const Step open = read_step(page, 4);
  CHECK(open.begin_ns == previous_finalized);
  CHECK(open.ready_ns != 0);
  CHECK(open.finalized_ns == 0);
  CHECK(page.compute_ns_total.load() == compute);
  CHECK(page.wait_ns_total.load() == wait);
}

TEST_CASE("Recorders of one process share the page, a lane each, and give lanes back") {
  AgentPage agent;
  const RecordPage& page = agent.page();
  auto first = CollectiveRecorder::attach(agent.fd(), 1, 2, ddp::Backend::Gloo, {}, 1);
  REQUIRE(first != nullptr);
  CapturedStderr captured;
  auto second =
      CollectiveRecorder::attach(agent.fd(), 1, 2, ddp::Backend::Nccl, std::chrono::seconds(7), 2);
  REQUIRE(second != nullptr);
  CHECK(first->lane() == 0);
  CHECK(second->lane() == 1);  // Context 2's own lane
  CHECK(page.rank.load() == 1);
  CHECK(unpack_name(page.backend.load()) == "gloo");  // lane 0 is the first's
  CHECK(page.context.load() == 1);
  const LaneHeader& lane1 = page.lanes[0].header;
  CHECK(lane1.state.load() == static_cast<std::uint64_t>(LaneState::kOpen));
  CHECK(lane1.context.load() == 2);
  CHECK(unpack_name(lane1.backend.load()) == "nccl");
  CHECK(lane1.timeout_ms.load() == 7000);

  // Each numbers its own collectives in its own ring.
  const auto a = first->on_queued(Op::kAllReduce, pack_name("float32"), 10, 40, kNoBucket);
  const auto b = second->on_queued(Op::kBroadcast, pack_name("int64"), 3, 24, kNoBucket);
  second->on_started(b);
  second->on_finished(b, false);
  CHECK(a == 1);
  CHECK(b == 1);
  CHECK(page.queued.load() == 1);
  CHECK(page.finished.load() == 0);
  CHECK(lane1.queued.load() == 1);
  CHECK(lane1.finished.load() == 1);
  CHECK(op_name(page.lanes[0].collectives[1].op.load()) == std::string("broadcast"));
  CHECK(op_name(page.collectives[1].op.load()) == std::string("all_reduce"));

  // A destroyed recorder gives its lane back, what it left unfinished recorded as failed;
  // the next on the lane goes on with the numbering.
  second->on_queued(Op::kAllReduce, pack_name("float32"), 1, 4, kNoBucket);  // never finishes
  CHECK(lane1.queued.load() == 2);
  second.reset();
  CHECK(lane1.finished.load() == 2);
  CHECK(page.lanes[0].collectives[2].failed.load() == 1);
  CHECK(lane1.state.load() == static_cast<std::uint64_t>(LaneState::kClosed));
  auto third = CollectiveRecorder::attach(agent.fd(), 1, 2, ddp::Backend::Gloo, {}, 2);
  REQUIRE(third != nullptr);
  CHECK(third->lane() == 1);
  CHECK(third->on_queued(Op::kBarrier, 0, 0, 0, kNoBucket) == 3);
  CHECK(lane1.context.load() == 2);
  CHECK(unpack_name(lane1.backend.load()) == "gloo");

  // With every lane taken: one warning, and a recorder that records nothing.
  auto fourth = CollectiveRecorder::attach(agent.fd(), 1, 2, ddp::Backend::Gloo, {}, 3);
  auto fifth = CollectiveRecorder::attach(agent.fd(), 1, 2, ddp::Backend::Gloo, {}, 4);
  CHECK(fourth->lane() == 2);
  CHECK(fifth->lane() == 3);
  auto sixth = CollectiveRecorder::attach(agent.fd(), 1, 2, ddp::Backend::Gloo, {}, 5);
  REQUIRE(sixth != nullptr);
  CHECK(sixth->lane() == -1);
  CHECK(sixth->on_queued(Op::kBarrier, 0, 0, 0, kNoBucket) == 0);
  const std::string text = captured.text();
  CHECK_THAT(text, Catch::Contains("every lane"));
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
}

TEST_CASE("A bad DDPRUN_RECORD_FD is one warning line and recording stays off") {
  SECTION("not a number") {
    ddp::test::ScopedEnvironment env(Vars{{ddp::contract::kRecordFd, "three"}});
    CapturedStderr captured;
    CHECK(CollectiveRecorder::attach(std::nullopt, 0, 1, ddp::Backend::Gloo) == nullptr);
    const std::string text = captured.text();
    CHECK_THAT(text, Catch::Contains("DDPRUN_RECORD_FD='three' is not a descriptor number"));
    CHECK(std::count(text.begin(), text.end(), '\n') == 1);
  }
  SECTION("a descriptor of the wrong size") {
    AgentPage small(100);
    ddp::test::ScopedEnvironment env(Vars{{ddp::contract::kRecordFd, std::to_string(small.fd())}});
    CapturedStderr captured;
    CHECK(CollectiveRecorder::attach(std::nullopt, 0, 1, ddp::Backend::Gloo) == nullptr);
    CHECK_THAT(captured.text(),
               Catch::Contains("has 100 bytes, not the " + std::to_string(sizeof(RecordPage))));
  }
  SECTION("a descriptor that is not open") {
    int closed = 1000;  // a number far above what this test opens
    while (fcntl(closed, F_GETFD) != -1) ++closed;
    ddp::test::ScopedEnvironment env(Vars{{ddp::contract::kRecordFd, std::to_string(closed)}});
    CapturedStderr captured;
    CHECK(CollectiveRecorder::attach(std::nullopt, 0, 1, ddp::Backend::Gloo) == nullptr);
    CHECK_THAT(captured.text(), Catch::Contains("is not open"));
  }
  SECTION("unset or empty: off without a word") {
    ddp::test::ScopedEnvironment env(Vars{{ddp::contract::kRecordFd, ""}});
    CapturedStderr captured;
    CHECK(CollectiveRecorder::attach(std::nullopt, 0, 1, ddp::Backend::Gloo) == nullptr);
    CHECK(captured.text().empty());
  }
  SECTION("a job still runs its collectives with the variable wrong") {
    ddp::test::ScopedEnvironment env(Vars{{ddp::contract::kRecordFd, "-x"}});
    CapturedStderr captured;
    bool recorder_off = false;
    float total = 0;
    ddp::test::run_world(2, [&](ddp::Context& ctx) {
      float value = 1;
      ctx.allreduce(std::span<float>(&value, 1));
      if (ctx.rank() == 0) {
        recorder_off = ctx.communicator().recorder() == nullptr;
        total = value;
      }
    });
    CHECK(recorder_off);
    CHECK(total == 2);
    CHECK_THAT(captured.text(), Catch::Contains("DDPRUN_RECORD_FD='-x'"));
  }
}

TEST_CASE("A Gloo job with a Reducer records every collective with its bucket and the steps") {
  constexpr int kWorld = 3;
  constexpr int kSteps = 4;
  constexpr std::size_t kParameters = 4;
  std::vector<std::unique_ptr<AgentPage>> pages;
  for (int r = 0; r < kWorld; ++r) pages.push_back(std::make_unique<AgentPage>());

  auto store = std::make_shared<ddp::store::MemoryStore>();
  std::vector<std::string> failures(kWorld);
  std::vector<std::size_t> bucket_counts(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        ddp::InitOptions options;
        options.backend = ddp::Backend::Gloo;
        options.init_timeout = std::chrono::seconds(30);
        options.timeout = std::chrono::seconds(30);
        options.record_fd = pages[rank]->fd();  // each rank its own page
        ddp::Context ctx = ddp::init(ddp::test::thread_env(rank, kWorld), store, options);
        std::vector<std::vector<float>> values(kParameters, std::vector<float>(1000, 1.0f));
        std::vector<ddp::Parameter> parameters;
        for (std::size_t i = 0; i < kParameters; ++i) {
          parameters.push_back({"p" + std::to_string(i), std::span<float>(values[i])});
        }
        ddp::ReducerOptions reducer_options;
        reducer_options.first_bucket_mb = 1e-6;  // one parameter per bucket
        reducer_options.bucket_cap_mb = 1e-6;
        ddp::Reducer reducer(ctx, parameters, reducer_options);
        bucket_counts[rank] = reducer.buckets().size();
        for (int step = 0; step < kSteps; ++step) {
          for (std::size_t i = kParameters; i-- > 0;) {
            std::fill(reducer.grad(i).begin(), reducer.grad(i).end(), 1.0f);
            reducer.mark_ready(i);
          }
          reducer.finalize();
        }
        {
          auto guard = reducer.no_sync();  // an accumulation step: no collective, no step
          for (std::size_t i = 0; i < kParameters; ++i) reducer.mark_ready(i);
          reducer.finalize();
        }
        ctx.barrier();
      } catch (const std::exception& e) {
        failures[rank] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    REQUIRE(failures[r].empty());
    REQUIRE(bucket_counts[r] == kParameters);
  }

  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    const RecordPage& page = pages[r]->page();
    REQUIRE(page.magic.load() == kRecordMagic);
    CHECK(page.rank.load() == static_cast<std::uint64_t>(r));
    CHECK(page.world_size.load() == kWorld);
    // The constructor's broadcasts, a bucket all-reduce per bucket and step, the barrier.
    const std::uint64_t expected = kParameters + kSteps * kParameters + 1;
    CHECK(page.queued.load() == expected);
    CHECK(page.started.load() == expected);
    CHECK(page.finished.load() == expected);
    CHECK(page.failed.load() == 0);
    std::vector<std::uint64_t> all_reduce_buckets;
    for (std::uint64_t seq = 1; seq <= expected; ++seq) {
      const Collective c = read_collective(page, seq);
      REQUIRE(c.seq == seq);
      CHECK(c.finished_ns >= c.started_ns);
      CHECK(c.started_ns >= c.queued_ns);
      if (seq <= kParameters) {
        CHECK(op_name(c.op) == std::string("broadcast"));
        CHECK(c.bucket == kNoBucket);
      } else if (seq == expected) {
        CHECK(op_name(c.op) == std::string("barrier"));
      } else {
        CHECK(op_name(c.op) == std::string("all_reduce"));
        CHECK(unpack_name(c.dtype) == "float32");
        CHECK(c.count == 1000);
        CHECK(c.bytes == 4000);
        all_reduce_buckets.push_back(c.bucket);
      }
    }
    std::vector<std::uint64_t> expected_buckets;
    for (int s = 0; s < kSteps; ++s) {
      for (std::uint64_t b = 0; b < kParameters; ++b) expected_buckets.push_back(b);
    }
    CHECK(all_reduce_buckets == expected_buckets);

    CHECK(page.steps.load() == kSteps);  // the no_sync step is not one
    std::uint64_t compute = 0, wait = 0;
    for (std::uint64_t k = 1; k <= kSteps; ++k) {
      const Step s = read_step(page, k);
      CHECK(s.step == k);
      CHECK(s.ready_ns >= s.begin_ns);
      CHECK(s.finalized_ns >= s.ready_ns);
      compute += s.ready_ns - s.begin_ns;
      wait += s.finalized_ns - s.ready_ns;
      // The last bucket was issued once its gradients were ready: after the step's ready
      // mark, the collective of bucket kParameters - 1 of that step was already queued.
      const Collective last = read_collective(page, kParameters + k * kParameters);
      CHECK(last.bucket == kParameters - 1);
      CHECK(last.queued_ns <= s.ready_ns);
      CHECK(last.finished_ns <= s.finalized_ns);
    }
    CHECK(page.compute_ns_total.load() == compute);
    CHECK(page.wait_ns_total.load() == wait);
  }
}

TEST_CASE("A worker process records into the page named by DDPRUN_RECORD_FD") {
  AgentPage agent(sizeof(RecordPage), /*inherited=*/true);
  const int port = ddp::test::reserve_port();
  const auto result = ddp::test::run_shell(
      "RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
          std::to_string(port) +
          " TORCHELASTIC_RESTART_COUNT=0 DDPRUN_RECORD_FD=" + std::to_string(agent.fd()) + " " +
          ddp::test::bin_path("ddp-example-sum").string() + " 2>&1",
      60);
  INFO(result.output);
  REQUIRE(result.status == 0);
  CHECK_THAT(result.output, Catch::Contains("sum=1"));
  const RecordPage& page = agent.page();
  REQUIRE(page.magic.load() == kRecordMagic);
  CHECK(page.pid.load() != 0);
  CHECK(page.pid.load() != static_cast<std::uint64_t>(getpid()));  // the worker's own
  CHECK(page.queued.load() == 2);                                  // its all-reduce and its barrier
  CHECK(page.finished.load() == 2);
  const Collective all_reduce = read_collective(page, 1);
  CHECK(op_name(all_reduce.op) == std::string("all_reduce"));
  CHECK(all_reduce.count == 1000);
  CHECK(unpack_name(all_reduce.dtype) == "float32");
  CHECK(op_name(read_collective(page, 2).op) == std::string("barrier"));
}

// Issue 24: NCCL's watchdog finishes collective k while a waiter's poll finished k + 1, so
// `finished` passes k and the issuing thread reuses k's slot for k + kCollectiveSlots while
// the watchdog still writes k there. No stable read may then show a mix: fields of two
// collectives, or a finish that belongs to another collective.
TEST_CASE("Concurrent writers of one slot never leave a mixed record that reads as stable") {
  AgentPage agent;
  auto recorder = CollectiveRecorder::attach(agent.fd(), 0, 1, ddp::Backend::Nccl);
  REQUIRE(recorder != nullptr);
  const RecordPage& page = agent.page();
  constexpr std::uint64_t kTotal = 200'000;
  // finish_called[s]: on_finished(s) was called (set before the call).
  std::vector<std::atomic<bool>> finish_called(kTotal + 1);
  std::atomic<std::uint64_t> queued{0};
  std::atomic<bool> stop{false};
  // Two finishers: one finishes the even collectives, the other each odd k only once k + 1
  // finished, so `finished` always passes k before k's own finish is written.
  auto finisher = [&](std::uint64_t first) {
    for (std::uint64_t k = first; k <= kTotal && !stop.load(); k += 2) {
      const std::uint64_t after = k % 2 == 1 ? k + 1 : k;
      while ((queued.load(std::memory_order_acquire) < after ||
              (k % 2 == 1 && k + 1 <= kTotal && !finish_called[k + 1].load())) &&
             !stop.load()) {
        std::this_thread::yield();
      }
      if (k % 2 == 1) {  // and wait for that finish to land in `finished`
        while (page.finished.load() < k && !stop.load()) std::this_thread::yield();
      }
      finish_called[k].store(true);
      recorder->on_finished(k, false);
    }
  };
  std::string mixed;
  std::thread reader([&] {
    while (!stop.load() && mixed.empty()) {
      for (std::uint32_t i = 0; i < kCollectiveSlots && mixed.empty(); ++i) {
        Collective c{};
        const bool stable = read_stable(page.collectives[i], [&](const CollectiveSlot& s) {
          c = {s.seq.load(),         s.op.load(),     s.dtype.load(),     s.count.load(),
               s.bytes.load(),       s.bucket.load(), s.queued_ns.load(), s.started_ns.load(),
               s.finished_ns.load(), s.failed.load()};
        });
        if (!stable || c.seq == 0) continue;
        if (c.count != c.seq || c.bytes != 4 * c.seq || c.bucket != c.seq % 5) {
          mixed = "slot " + std::to_string(i) + " holds seq " + std::to_string(c.seq) +
                  " with count " + std::to_string(c.count);
        } else if (c.finished_ns != 0 && !finish_called[c.seq].load()) {
          mixed = "collective " + std::to_string(c.seq) + " reads as finished before it was";
        }
      }
    }
  });
  std::thread even(finisher, 2);
  std::thread odd(finisher, 1);
  for (std::uint64_t i = 1; i <= kTotal && mixed.empty(); ++i) {
    const auto seq = recorder->on_queued(Op::kAllReduce, pack_name("float32"), i, 4 * i, i % 5);
    recorder->on_started(seq);
    queued.store(seq, std::memory_order_release);
    // The next one as soon as its slot may be reused (`finished` passed its old collective).
    while (page.finished.load() + kCollectiveSlots < seq + 1 && mixed.empty()) {
      std::this_thread::yield();
    }
  }
  if (!mixed.empty()) stop.store(true);  // the finishers may wait for collectives never queued
  even.join();
  odd.join();
  stop.store(true);
  reader.join();
  CHECK(mixed == "");
  CHECK(page.finished.load() == kTotal);
}

// The same race, step by step: a writer that finds the slot claimed waits for the other
// writer to end; a reader meanwhile never takes the slot as stable.
TEST_CASE("A second writer of a slot waits for the first, and the reader sees it unstable") {
  AgentPage agent;
  CollectiveSlot& slot = agent.page().collectives[7];
  auto stable_now = [&] { return read_stable(slot, [](const CollectiveSlot&) {}); };
  begin_write(slot);  // writer A (the watchdog finishing collective k)
  slot.finished_ns.store(1, std::memory_order_relaxed);
  std::promise<void> b_claimed;
  auto b_claimed_future = b_claimed.get_future();
  std::thread b([&] {  // writer B (the issuing thread reusing the slot)
    begin_write(slot);
    b_claimed.set_value();
    slot.seq.store(7 + kCollectiveSlots, std::memory_order_relaxed);
    end_write(slot);
  });
  // B may not claim the slot while A holds it (bounded: a B that got in shows at once).
  const bool b_got_in =
      b_claimed_future.wait_for(std::chrono::milliseconds(300)) == std::future_status::ready;
  const bool stable_while_a_writes = stable_now();
  end_write(slot);  // A ends: now B may go on
  const bool b_went_on =
      b_got_in || b_claimed_future.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  b.join();
  CHECK_FALSE(b_got_in);
  CHECK_FALSE(stable_while_a_writes);
  CHECK(b_went_on);
  CHECK(stable_now());
  CHECK(slot.seq.load() == 7 + kCollectiveSlots);
  CHECK(slot.version.load() % 2 == 0);
}

// Issue 24: a Gloo abort fails the queued work at once; its records must say so too, or a
// process that lives on after the abort keeps pending records that age into a hang verdict.
TEST_CASE("A Gloo abort finishes the records of its queued collectives, as failed") {
  AgentPage page0;
  auto store = std::make_shared<ddp::store::MemoryStore>();
  std::promise<void> queued_failed, rank1_may_leave, running_failed, rank1_joined;
  std::shared_future<void> joined = rank1_joined.get_future().share();
  auto queued_failed_future = queued_failed.get_future();
  auto running_failed_future = running_failed.get_future();
  std::shared_future<void> leave = rank1_may_leave.get_future().share();
  std::vector<std::string> failures(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        ddp::InitOptions options;
        options.backend = ddp::Backend::Gloo;
        options.shared_memory = false;
        options.init_timeout = std::chrono::seconds(30);
        options.timeout = std::chrono::seconds(30);
        options.record_fd = rank == 0 ? page0.fd() : -1;
        ddp::Context ctx = ddp::init(ddp::test::thread_env(rank, 2), store, options);
        if (rank == 1) {             // never joins rank 0's barrier; leaves when the test says
          rank1_joined.set_value();  // its side of the mesh is complete (an abort ends it)
          RANK_REQUIRE(leave.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
          return;
        }
        RANK_REQUIRE(joined.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
        ddp::Work running = ctx.barrier_async();  // collective 1: waits for rank 1
        std::vector<float> data(16, 1.0f);
        ddp::Work second = ctx.allreduce_async(std::span<float>(data));  // 2 and 3: queued
        ddp::Work third = ctx.allreduce_async(std::span<float>(data));
        ctx.abort("test abort");
        RANK_REQUIRE_THROWS_AS(second.wait(std::chrono::seconds(20)), ddp::CommError);
        RANK_REQUIRE_THROWS_AS(third.wait(std::chrono::seconds(20)), ddp::CommError);
        queued_failed.set_value();
        RANK_REQUIRE_THROWS_AS(running.wait(std::chrono::seconds(40)), ddp::CommError);
        running_failed.set_value();
        RANK_REQUIRE(leave.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
      } catch (const std::exception& e) {
        failures[rank] = e.what();
      }
    });
  }
  const bool queued_ok =
      queued_failed_future.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  std::vector<Collective> queued_records;
  if (queued_ok) {
    for (std::uint64_t seq : {2, 3}) queued_records.push_back(read_collective(page0.page(), seq));
  }
  rank1_may_leave.set_value();  // the abort ended rank 0's barrier (failing) already
  const bool running_ok =
      running_failed_future.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  const std::uint64_t finished = page0.page().finished.load();
  const Collective first = read_collective(page0.page(), 1);
  for (auto& thread : threads) thread.join();
  CHECK(failures[0] == "");
  CHECK(failures[1] == "");
  REQUIRE(queued_ok);
  REQUIRE(running_ok);
  for (const Collective& c : queued_records) {
    INFO("collective " << c.seq);
    CHECK(c.finished_ns != 0);  // finished at the abort, not pending for ever
    CHECK(c.failed == 1);
  }
  CHECK(first.finished_ns != 0);
  CHECK(first.failed == 1);
  CHECK(finished == 3);
  CHECK(page0.page().failed.load() == 1);
}

// Issue 24: a process with two communicators (a Gloo and an NCCL one, a common pair) records
// both, each under its own name; one made after another was destroyed records too.
TEST_CASE("Every communicator of a process records, each in a lane of its own") {
  AgentPage agent;
  auto store = std::make_shared<ddp::store::MemoryStore>();
  ddp::InitOptions options;
  options.backend = ddp::Backend::Gloo;
  options.init_timeout = std::chrono::seconds(30);
  options.record_fd = agent.fd();
  std::vector<float> data(8, 1.0f);
  {
    ddp::Context first = ddp::init(ddp::test::thread_env(0, 1), store, options);
    ddp::Context second = ddp::init(ddp::test::thread_env(0, 1), store, options);
    REQUIRE(first.communicator().recorder() != nullptr);
    REQUIRE(second.communicator().recorder() != nullptr);
    first.allreduce(std::span<float>(data));
    second.allreduce(std::span<float>(data));
    second.barrier();
  }
  const RecordPage& page = agent.page();
  CHECK(page.context.load() == 1);
  CHECK(page.queued.load() == 1);
  CHECK(page.finished.load() == 1);
  const LaneHeader& lane1 = page.lanes[0].header;
  CHECK(lane1.context.load() == 2);
  CHECK(unpack_name(lane1.backend.load()) == "gloo");
  CHECK(lane1.queued.load() == 2);
  CHECK(lane1.finished.load() == 2);
  CHECK(op_name(page.lanes[0].collectives[2].op.load()) == std::string("barrier"));
  CHECK(lane1.state.load() == static_cast<std::uint64_t>(LaneState::kClosed));

  ddp::Context third = ddp::init(ddp::test::thread_env(0, 1), store, options);
  REQUIRE(third.communicator().recorder() != nullptr);
  CHECK(third.communicator().recorder()->lane() == 2);  // Context 3's lane
  third.barrier();
  CHECK(page.lanes[1].header.context.load() == 3);
  CHECK(page.lanes[1].header.finished.load() == 1);
}
