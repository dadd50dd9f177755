#pragma once
// The agent's side of one worker's collective record page (common's collective_record.hpp):
// an anonymous shared-memory file the agent creates before the spawn, hands to the worker
// (SpawnOptions::inherit_fd, its number in DDPRUN_RECORD_FD) and keeps mapped after the worker
// exited, so that a dead rank's last collectives can still be read. Internal to the launcher.

#include <string>

#include "ddp/common/collective_record.hpp"
#include "ddp/launcher/unique_fd.hpp"

namespace ddp::launcher {

class RecordMapping {
 public:
  // Creates the zeroed page. Throws std::system_error (out of memory or descriptors).
  RecordMapping();
  ~RecordMapping();
  RecordMapping(const RecordMapping&) = delete;
  RecordMapping& operator=(const RecordMapping&) = delete;

  // The descriptor the worker inherits (close-on-exec in the agent).
  int fd() const { return fd_.get(); }
  // DDPRUN_RECORD_FD=<fd>, for the worker's environment.
  std::string variable() const;
  // The page as the worker writes it; read it with record::read_stable and atomics.
  const record::RecordPage& page() const { return *page_; }
  // True once a libddp communicator attached to the page.
  bool attached() const;
  // Asks the worker to stop: the job hung (RecordPage::stop_requested); libddp aborts its
  // NCCL communicators.
  void request_stop() { page_->stop_requested.store(1, std::memory_order_release); }

 private:
  UniqueFd fd_;
  record::RecordPage* page_ = nullptr;
};

}  // namespace ddp::launcher
