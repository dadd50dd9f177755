#include "process/record_mapping.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <system_error>

#include "ddp/common/worker_contract.hpp"

namespace ddp::launcher {

RecordMapping::RecordMapping() {
  fd_ = UniqueFd(::memfd_create("ddprun-collective-record", MFD_CLOEXEC));
  if (!fd_.valid()) {
    throw std::system_error(errno, std::generic_category(), "memfd_create (collective record)");
  }
  if (::ftruncate(fd_.get(), sizeof(record::RecordPage)) != 0) {
    throw std::system_error(errno, std::generic_category(), "ftruncate (collective record)");
  }
  void* address =
      ::mmap(nullptr, sizeof(record::RecordPage), PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (address == MAP_FAILED) {
    throw std::system_error(errno, std::generic_category(), "mmap (collective record)");
  }
  page_ = static_cast<record::RecordPage*>(address);
  stack_fd_ = UniqueFd(::memfd_create(record::kStackFileName, MFD_CLOEXEC));
  if (!stack_fd_.valid()) {
    throw std::system_error(errno, std::generic_category(), "memfd_create (Python stacks)");
  }
}

RecordMapping::~RecordMapping() {
  if (page_) ::munmap(page_, sizeof(record::RecordPage));
}

std::string RecordMapping::variable() const {
  return std::string(ddp::contract::kRecordFd) + "=" + std::to_string(fd_.get());
}

std::string RecordMapping::stack_variable() const {
  return std::string(ddp::contract::kStackFd) + "=" + std::to_string(stack_fd_.get());
}

std::uint64_t RecordMapping::stack_size() const {
  struct stat info {};
  return ::fstat(stack_fd_.get(), &info) == 0 ? static_cast<std::uint64_t>(info.st_size) : 0;
}

std::string RecordMapping::stacks_since(std::uint64_t offset) const {
  constexpr std::uint64_t kMax = 1 << 20;
  const std::uint64_t size = stack_size();
  if (size <= offset) return {};
  std::string text(std::min(size - offset, kMax), '\0');
  const ssize_t n = ::pread(stack_fd_.get(), text.data(), text.size(), static_cast<off_t>(offset));
  text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return text;
}

int RecordMapping::stack_signal() const {
  const std::uint64_t signal = page_->stack_signal.load(std::memory_order_acquire);
  return signal > 0 && signal < static_cast<std::uint64_t>(NSIG) ? static_cast<int>(signal) : 0;
}

int RecordMapping::worker_stack_fd() const {
  const std::uint64_t fd = page_->stack_fd.load(std::memory_order_acquire);
  return fd > 0 && fd < (1u << 30) ? static_cast<int>(fd) : -1;
}

bool RecordMapping::attached() const {
  return page_->magic.load(std::memory_order_acquire) == record::kRecordMagic;
}

}  // namespace ddp::launcher
