#pragma once
// ddp::InplaceJob: in-place recovery for native programs (docs/inplace.md). Under
// `ddprun --restart_policy=inplace`, when a rank dies the others keep their processes and
// memory, ddprun starts one replacement with the same RANK, and the job goes on from the
// highest step that any rank committed: the survivors and the replacement form a new
// Context, and the replacement receives the job's state from a survivor instead of reading a
// checkpoint. The protocol is the Python package's (ddprun.inplace), with the same store keys.
//
// A training loop adopts it in a few lines:
//
//   ddp::InplaceJob job(options);                 // the Context, in the current generation
//   job.keep(save_state, load_state);              // what a replacement receives
//   job.on_context([&](ddp::Context& ctx) { reducer = make_reducer(ctx); },
//                  [&] { reducer.reset(); });      // what uses the Context
//   while (job.step() < steps) {
//     job.attempt([&](ddp::Context& ctx) {         // a lost peer: recover, run it again
//       train_one_batch(job.step());
//       job.commit();                              // the step is done: step() + 1
//     });
//   }
//
// Under torchrun, or ddprun with another --restart_policy, the same program runs as a plain
// one: the Context is ddp::init()'s, and an error propagates out of attempt() unchanged.
//
// Threading: one thread (the training loop's) calls everything here; a watcher thread of the
// job aborts the current Context once ddprun begins the next generation, so that a rank
// waiting on a survivor (which waits too) is freed at once.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ddp/context.hpp"
#include "ddp/types.hpp"

namespace ddp {

// A rank of the job was lost and this rank cannot recover in place: not under
// --restart_policy=inplace, or ddprun started no next generation in time (it falls back to
// restarting every worker then).
class PeerLost : public CommError {
 public:
  using CommError::CommError;
};

struct InplaceOptions {
  InitOptions init;  // each generation's Context (its init_timeout bounds the first one)
  // How long a survivor waits for ddprun to begin the next generation, and then for every
  // rank of it (the replacement included) to join, before it gives up with PeerLost.
  std::chrono::milliseconds recovery_timeout = std::chrono::seconds(60);
};

// This rank's state as of its last commit, as bytes; and how to take such bytes from the
// rank that sends them. Both run at a recovery, on the training loop's thread.
using SaveState = std::function<std::vector<std::byte>()>;
using LoadState = std::function<void(std::span<const std::byte>)>;

class InplaceJob {
 public:
  // Forms the Context: ddp::init() when not under in-place recovery; otherwise in the
  // generation DDPRUN_INPLACE_GENERATION names, under its store prefix. Throws as init() does.
  explicit InplaceJob(InplaceOptions options = {});
  ~InplaceJob();  // stops the watcher; the Context goes (after what on_context built)
  InplaceJob(const InplaceJob&) = delete;
  InplaceJob& operator=(const InplaceJob&) = delete;

  // Whether this worker recovers in place (ddprun --restart_policy=inplace).
  bool recovers() const { return recovers_; }
  // The generation of the current Context (0 for the round's first workers).
  int generation() const { return generation_; }
  // A replacement: it started in a later generation and receives the job's state at its
  // first attempt(), so it reads no checkpoint and runs none of the start-up's collectives.
  bool is_replacement() const { return replacement_; }
  // The current generation's Context. A replacement receives the state at its first
  // attempt(), so use the Context inside attempt() (or after ready()). Throws PeerLost after
  // a recovery failed (the rank left its generation and joined no other).
  Context& context();

  // Steps committed (the state a recovery restores is as of the last one).
  std::int64_t step() const { return step_; }
  // Sets the step, e.g. after reading a checkpoint at the start (before the first attempt).
  void set_step(std::int64_t step) { step_ = step; }
  // The step is done on this rank: step() grows by one.
  void commit() { ++step_; }

  // Registers the state a replacement (and a survivor behind the others) receives from the
  // rank with the highest committed step. save() must give the state as of the last commit:
  // change the state only after a step's last collective (as a DDP step does).
  void keep(SaveState save, LoadState load);
  // formed(context) runs once each generation's Context has formed and holds the job's state
  // (the first time at the first attempt): build what uses it (a Reducer). leaving() runs
  // before a broken generation's Context is destroyed: drop what uses it.
  void on_context(std::function<void(Context&)> formed, std::function<void()> leaving = {});

  // Takes the state where it must come from another rank, and runs formed() for a new
  // Context. attempt() calls it first; call it to use the Context outside an attempt.
  void ready();

  // Runs one step: ready(), then step(context()). Returns true when it ran to its end;
  // false when a peer was lost and this rank recovered: the state of the highest committed
  // step is in hand, so run the step for step() again. Under in-place recovery an error is a
  // lost peer when it is a CommError of a lost connection or ddprun has begun the next
  // generation; any other error, and every error otherwise, propagates unchanged. Throws
  // PeerLost when this rank cannot recover.
  bool attempt(const std::function<void(Context&)>& step);

  // Leaves the broken generation and joins the next (attempt() calls it): runs leaving(),
  // aborts and destroys the Context, waits for ddprun's next generation, forms it with the
  // survivors and the replacement, and takes the state. Throws PeerLost (naming `why`) when
  // this rank cannot recover in place.
  void recover(const std::string& why);

  int recoveries() const { return recoveries_; }  // recoveries this process took part in
  // From the lost peer to the state in hand, in the last recovery (nullopt: none yet).
  std::optional<std::chrono::duration<double>> last_recovery_time() const {
    return last_recovery_time_;
  }

 private:
  class Watcher;

  std::string key(int generation, const std::string& name) const;
  void join();  // forms the current generation's Context
  void mark_joined();
  void take_state();
  bool announced();  // ddprun began the generation after the current one
  bool lost_peer(const std::exception& error);

  InplaceOptions options_;
  LaunchEnv env_;
  bool recovers_ = false;
  bool replacement_ = false;
  int generation_ = 0;
  std::int64_t step_ = 0;
  bool holds_state_ = false;  // this rank holds the job's state (a replacement: not yet)
  bool needs_state_ = false;  // the state is to be taken at the next ready()
  bool formed_called_ = false;
  int recoveries_ = 0;
  std::optional<std::chrono::duration<double>> last_recovery_time_;
  SaveState save_;
  LoadState load_;
  std::function<void(Context&)> formed_;
  std::function<void()> leaving_;
  std::string root_;                     // the store prefix of this round's generations
  std::shared_ptr<store::Store> store_;  // the workers' store (the agent's)
  std::shared_ptr<void> keep_alive_;
  std::unique_ptr<Watcher> watcher_;
  std::unique_ptr<Context> context_;  // last: it goes first
};

}  // namespace ddp
