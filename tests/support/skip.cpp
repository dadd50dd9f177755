#include "skip.hpp"

#include <catch2/catch.hpp>

namespace ddp::test {
namespace {

// One test binary's tally; Catch runs its test cases one after another on one thread.
struct SkipTally {
  int started = 0;
  int skipped = 0;
  bool current_skipped = false;
};

SkipTally& tally() {
  static SkipTally instance;
  return instance;
}

}  // namespace

void skip(const std::string& reason) {
  WARN("SKIPPED: " << reason);
  SkipTally& t = tally();
  if (!t.current_skipped) {
    t.current_skipped = true;
    ++t.skipped;
  }
}

void note_test_case_started() {
  SkipTally& t = tally();
  ++t.started;
  t.current_skipped = false;
}

bool every_test_case_skipped() {
  const SkipTally& t = tally();
  return t.started > 0 && t.skipped == t.started;
}

}  // namespace ddp::test
