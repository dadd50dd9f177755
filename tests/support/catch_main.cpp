// The tests' main: Catch2's, plus visible skips (skip.hpp): a run whose every test case was
// skipped exits with kSkipReturnCode, which CTest reports as "Skipped". Sets PET_EXIT_CODE.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdlib>

#include "skip.hpp"

namespace {

struct SkipListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    TestEventListenerBase::testCaseStarting(info);
    ddp::test::note_test_case_started();
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(SkipListener)

int main(int argc, char* argv[]) {
  // Every ddprun the tests start exits with the root cause's status (--exit_code=root_cause),
  // which says more than torchrun's 1: the tests check which worker failed how. The tests of
  // the default (torchrun's 0 or 1) give --exit_code=torchrun, which the variable yields to.
  ::setenv("PET_EXIT_CODE", "root_cause", /*overwrite=*/0);
  const int failures = Catch::Session().run(argc, argv);
  if (failures != 0) {  // never mistaken for a skip
    return failures == ddp::test::kSkipReturnCode ? failures + 1 : failures;
  }
  return ddp::test::every_test_case_skipped() ? ddp::test::kSkipReturnCode : 0;
}
