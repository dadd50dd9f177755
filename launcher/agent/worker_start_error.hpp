#pragma once
// What WorkerGroup::start throws when a worker of the round cannot be started (its log
// directory cannot be made, no descriptor, pipe or process is left, the exec fails): the
// failure as the report shows it (its message names the worker, the cause and what to do),
// and how many workers of the group did start before it (each reports its exit as usual, so
// the agent stops them like any group). Internal to the launcher.

#include <stdexcept>
#include <utility>

#include "ddp/launcher/failure_report.hpp"

namespace ddp::launcher {

class WorkerStartError : public std::runtime_error {
 public:
  WorkerStartError(WorkerFailure failure, int started)
      : std::runtime_error(failure.error ? failure.error->message
                                         : "a worker could not be started"),
        failure_(std::move(failure)),
        started_(started) {}

  // The worker that could not be started, as the root cause of a report.
  const WorkerFailure& failure() const { return failure_; }
  // Workers of the group that did start (local ranks 0 .. started-1).
  int started() const { return started_; }

 private:
  WorkerFailure failure_;
  int started_ = 0;
};

}  // namespace ddp::launcher
