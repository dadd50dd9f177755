#pragma once
// Visible skips for Catch2 v2, which has none: a test that cannot run here says why and
// CTest reports it "Skipped", never "Passed".

#include <string>

namespace ddp::test {

// The exit status of a test binary whose every test case that ran was skipped. CTest runs
// one test case per process and has SKIP_RETURN_CODE set to it (tests/CMakeLists.txt).
inline constexpr int kSkipReturnCode = 77;

// Marks the running test case skipped and prints the reason (a Catch WARN). The caller
// returns at once: `if (!torch_available()) return ddp::test::skip("no torch");`.
// Call it on the test's main thread, before any assertion.
void skip(const std::string& reason);

// For catch_main.cpp: a test case started (clears its skip mark), and the verdict.
void note_test_case_started();
// True when at least one test case ran and every one of them called skip().
bool every_test_case_skipped();

}  // namespace ddp::test
