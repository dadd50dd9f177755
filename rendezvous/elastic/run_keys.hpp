#pragma once
// The store keys of one run, all under /ddprun/<run_id>/ so that runs never mix:
//   state              the RoundState as JSON, changed only with compare-and-set
//   hb/<node_id>       heartbeat counter: the node ADDs 1 every keep_alive_interval
//   round_<r>/closed   SET once round r closed (joiners WAIT on it)
//   round_<r>/end      how running round r ended, first writer wins (compare_set from ""):
//                      a StopReason, or {"finished":true} once the exit barrier passed
//   round_<r>/done     exit barrier counter: members ADD 1 when their workers succeeded

#include <string>

namespace ddp::elastic {

class RunKeys {
 public:
  explicit RunKeys(const std::string& run_id) : prefix_("/ddprun/" + run_id + "/") {}

  std::string state() const { return prefix_ + "state"; }
  std::string heartbeat(const std::string& node_id) const { return prefix_ + "hb/" + node_id; }
  std::string closed(int round) const { return round_key(round, "closed"); }
  std::string end(int round) const { return round_key(round, "end"); }
  std::string done(int round) const { return round_key(round, "done"); }

 private:
  std::string round_key(int round, const char* name) const {
    return prefix_ + "round_" + std::to_string(round) + "/" + name;
  }
  std::string prefix_;
};

}  // namespace ddp::elastic
