#include "record_mapping.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

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
}

RecordMapping::~RecordMapping() {
  if (page_) ::munmap(page_, sizeof(record::RecordPage));
}

std::string RecordMapping::variable() const {
  return std::string(record::kRecordFdVariable) + "=" + std::to_string(fd_.get());
}

bool RecordMapping::attached() const {
  return page_->magic.load(std::memory_order_acquire) == record::kRecordMagic;
}

}  // namespace ddp::launcher
