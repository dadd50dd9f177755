// The static rendezvous's store: which write closes a round after the first, so that the last
// attempt's worker keys go there before any worker of the next attempt starts.

#include <catch2/catch.hpp>

#include "ddp/elastic/round_state.hpp"
#include "host/rendezvous_host.hpp"

using ddp::elastic::round_closed_by;
namespace elastic = ddp::elastic;

TEST_CASE("static store reset: the state of a closed round, or its closed key, names the round") {
  elastic::RoundState state;
  state.round = 2;
  state.phase = elastic::Phase::kOpen;
  CHECK(round_closed_by("/ddprun/job/state", elastic::encode_state(state)) == 0);
  state.phase = elastic::Phase::kRunning;
  CHECK(round_closed_by("/ddprun/job/state", elastic::encode_state(state)) == 2);
  state.phase = elastic::Phase::kFinished;
  CHECK(round_closed_by("/ddprun/job/state", elastic::encode_state(state)) == 2);
  CHECK(round_closed_by("/ddprun/job/round_3/closed", "1") == 3);
  CHECK(round_closed_by("/ddprun/job/round_0/closed", "1") == 0);
  // Anything else is no round's close: a worker's keys, garbage, other keys of ours.
  CHECK(round_closed_by("/ddprun/job/state", "not json") == 0);
  CHECK(round_closed_by("default_pg/state", elastic::encode_state(state)) == 0);
  CHECK(round_closed_by("/ddprun/job/round_3/end", "1") == 0);
  CHECK(round_closed_by("/ddprun/job/round_x/closed", "1") == 0);
  CHECK(round_closed_by("/ddprun/job/round_/closed", "1") == 0);
  CHECK(round_closed_by("/worker/attempt_0/round_1/closed", "1") == 0);
}
