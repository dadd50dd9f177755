#pragma once
// The agent's side of one worker's collective record page (common's collective_record.hpp):
// an anonymous shared-memory file the agent creates before the spawn, hands to the worker
// (SpawnOptions::inherit_fds, its number in DDPRUN_RECORD_FD) and keeps mapped after the worker
// exited, so that a dead rank's last collectives can still be read. Beside it, a second
// anonymous file (DDPRUN_STACK_FD) into which ddprun's Python probe has faulthandler write the
// worker's Python stacks when ddprun sends the signal the page names (stack_signal): the
// stacks never pass through the worker's stderr. Internal to the launcher.

#include <cstdint>
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

  // The page's descriptor, for the worker to inherit (close-on-exec in the agent).
  int fd() const { return fd_.get(); }
  // DDPRUN_RECORD_FD=<fd>, for the worker's environment.
  std::string variable() const;
  // The stack file's descriptor and DDPRUN_STACK_FD=<fd>: for Python workers (the probe).
  int stack_fd() const { return stack_fd_.get(); }
  std::string stack_variable() const;
  // The stack file's size: where the next dump will start.
  std::uint64_t stack_size() const;
  // What the worker wrote into the stack file from offset on (at most 1 MiB).
  std::string stacks_since(std::uint64_t offset) const;
  // The signal on which the worker dumps its Python stacks, 0 when it has registered none
  // (no probe): ddprun sends no worker a signal it has not asked for.
  int stack_signal() const;
  // The descriptor of the worker on which its probe registered the stack file (the page's
  // stack_fd: a copy of stack_fd() the probe made where programs do not reach it); -1 when
  // none is said. Check that the worker still holds the stack file there before signalling.
  int worker_stack_fd() const;
  // The page as the worker writes it; read it with record::read_stable and atomics.
  const record::RecordPage& page() const { return *page_; }
  // True once a libddp communicator attached to the page.
  bool attached() const;
  // Asks the worker to stop: the job hung (RecordPage::stop_requested); libddp aborts its
  // NCCL communicators.
  void request_stop() { page_->stop_requested.store(1, std::memory_order_release); }

 private:
  UniqueFd fd_;
  UniqueFd stack_fd_;
  record::RecordPage* page_ = nullptr;
};

}  // namespace ddp::launcher
