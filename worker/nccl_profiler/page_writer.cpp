#include "page_writer.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "ddp/common/worker_contract.hpp"

namespace ddp::nccl_profiler {

namespace {

using namespace ddp::record;

}  // namespace

std::optional<PageWriter> PageWriter::open_from_environment(std::string& problem) {
  const char* value = std::getenv(ddp::contract::kRecordFd);
  if (value == nullptr || *value == '\0') return std::nullopt;
  int fd = -1;
  const char* end = value + std::strlen(value);
  const auto [ptr, ec] = std::from_chars(value, end, fd);
  if (ec != std::errc() || ptr != end || fd < 0) {
    problem = std::string(ddp::contract::kRecordFd) + "='" + value + "' is not a descriptor number";
    return std::nullopt;
  }
  return open(fd, problem);
}

std::optional<PageWriter> PageWriter::open(int fd, std::string& problem) {
  const std::string name = "the collective record descriptor " + std::to_string(fd);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    problem = name + " is not open: " + std::strerror(errno);
    return std::nullopt;
  }
  if (static_cast<std::uint64_t>(st.st_size) != sizeof(RecordPage)) {
    problem = name + " has " + std::to_string(st.st_size) + " bytes, not the " +
              std::to_string(sizeof(RecordPage)) +
              " of a record page (a ddprun of another version?)";
    return std::nullopt;
  }
  void* mapped = mmap(nullptr, sizeof(RecordPage), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) {
    problem = name + " could not be mapped: " + std::strerror(errno);
    return std::nullopt;
  }
  return PageWriter(static_cast<RecordPage*>(mapped));
}

PageWriter::~PageWriter() {
  if (page_ != nullptr) munmap(page_, sizeof(RecordPage));
}

bool PageWriter::claim(int rank, int world_size) {
  if (claimed_) return true;
  std::uint64_t owner = 0;
  const auto pid = static_cast<std::uint64_t>(getpid());
  if (!page_->pid.compare_exchange_strong(owner, pid, std::memory_order_acq_rel)) {
    // An earlier load of this plugin in this process (NCCL unloads it with its last
    // communicator) wrote here: go on where it stopped.
    if (owner != pid || page_->writer.load(std::memory_order_relaxed) != pack_name(kWriterName))
      return false;
    next_seq_ = page_->queued.load(std::memory_order_relaxed);
    claimed_ = true;
    return true;
  }
  page_->version.store(kRecordVersion, std::memory_order_relaxed);
  page_->rank.store(static_cast<std::uint64_t>(rank < 0 ? 0 : rank), std::memory_order_relaxed);
  page_->world_size.store(static_cast<std::uint64_t>(world_size < 0 ? 0 : world_size),
                          std::memory_order_relaxed);
  page_->backend.store(pack_name("nccl"), std::memory_order_relaxed);
  page_->writer.store(pack_name(kWriterName), std::memory_order_relaxed);
  // Lane 0 is this plugin's (version 2): a libddp communicator made later in this process
  // takes another lane instead of writing over it.
  page_->lane_state.store(static_cast<std::uint64_t>(LaneState::kOpen), std::memory_order_relaxed);
  // The program's own NCCL timeout is not known to a profiler: 0 (unknown).
  page_->magic.store(kRecordMagic, std::memory_order_release);  // last: publishes the header
  claimed_ = true;
  return true;
}

std::uint64_t PageWriter::on_queued(Op op, std::uint64_t dtype, std::uint64_t count,
                                    std::uint64_t bytes) {
  const std::uint64_t seq = ++next_seq_;
  // The slot's previous collective has not finished: leave its record (the agent may still
  // need it) and only count this one.
  if (seq > kCollectiveSlots &&
      page_->finished.load(std::memory_order_acquire) < seq - kCollectiveSlots) {
    page_->queued.store(seq, std::memory_order_release);
    return seq;
  }
  CollectiveSlot& slot = page_->collectives[seq % kCollectiveSlots];
  begin_write(slot);
  slot.seq.store(seq, std::memory_order_relaxed);
  slot.op.store(static_cast<std::uint64_t>(op), std::memory_order_relaxed);
  slot.dtype.store(dtype, std::memory_order_relaxed);
  slot.count.store(count, std::memory_order_relaxed);
  slot.bytes.store(bytes, std::memory_order_relaxed);
  slot.bucket.store(kNoBucket, std::memory_order_relaxed);
  slot.queued_ns.store(now_ns(), std::memory_order_relaxed);
  slot.started_ns.store(0, std::memory_order_relaxed);
  slot.finished_ns.store(0, std::memory_order_relaxed);
  slot.failed.store(0, std::memory_order_relaxed);
  end_write(slot);
  page_->queued.store(seq, std::memory_order_release);
  return seq;
}

void PageWriter::on_started(std::uint64_t seq) {
  CollectiveSlot& slot = page_->collectives[seq % kCollectiveSlots];
  if (slot.seq.load(std::memory_order_relaxed) == seq) {
    begin_write(slot);
    slot.started_ns.store(now_ns(), std::memory_order_relaxed);
    end_write(slot);
  }
  if (page_->started.load(std::memory_order_relaxed) < seq) {
    page_->started.store(seq, std::memory_order_release);
  }
}

void PageWriter::on_finished(std::uint64_t seq) {
  const std::uint64_t now = now_ns();
  CollectiveSlot& slot = page_->collectives[seq % kCollectiveSlots];
  if (slot.seq.load(std::memory_order_relaxed) == seq) {
    begin_write(slot);
    if (slot.started_ns.load(std::memory_order_relaxed) == 0) {
      slot.started_ns.store(now, std::memory_order_relaxed);
    }
    slot.finished_ns.store(now, std::memory_order_relaxed);
    end_write(slot);
  }
  page_->last_finished_ns.store(now, std::memory_order_relaxed);
  if (page_->started.load(std::memory_order_relaxed) < seq) {
    page_->started.store(seq, std::memory_order_release);
  }
  // Release: on_queued reuses this slot once it sees `finished` pass it.
  if (page_->finished.load(std::memory_order_relaxed) < seq) {
    page_->finished.store(seq, std::memory_order_release);
  }
}

void PageWriter::on_p2p(std::uint64_t since_ns, Op op, std::uint64_t bytes, std::uint64_t peer) {
  if (since_ns != 0) {
    page_->p2p_op.store(static_cast<std::uint64_t>(op), std::memory_order_relaxed);
    page_->p2p_bytes.store(bytes, std::memory_order_relaxed);
    page_->p2p_peer.store(peer, std::memory_order_relaxed);
  }
  page_->p2p_since_ns.store(since_ns, std::memory_order_release);  // last: the reader's key
}

bool PageWriter::owned_elsewhere() const {
  if (claimed_) return false;
  const std::uint64_t owner = page_->pid.load(std::memory_order_acquire);
  if (owner == 0) return false;
  return owner != static_cast<std::uint64_t>(getpid()) ||
         page_->writer.load(std::memory_order_relaxed) != pack_name(kWriterName);
}

}  // namespace ddp::nccl_profiler
