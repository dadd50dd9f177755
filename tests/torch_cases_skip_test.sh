#!/usr/bin/env bash
# Every test case tagged [torch] skips, saying why, when its Python imports no torch: CI runs
# them a second time against the PyTorch 2.14 root, and where that root could not be made
# (scripts/setup-pytorch214) they must show as skipped, neither fail nor pass. Runs each test
# program given that has [torch] cases with the filter "[torch]" and DDP_TEST_PYTHON=/bin/false
# (an interpreter that imports nothing); it must exit 77, Catch's every-case-skipped status
# (tests/support/skip.hpp).
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fails=0 checked=0
for program in "$@"; do
  cases=$("$program" --list-test-names-only "[torch]" 2>/dev/null | grep -c '[^[:space:]]')
  ((cases == 0)) && continue
  checked=$((checked + 1))
  DDP_TEST_PYTHON=/bin/false timeout 300 "$program" "[torch]" >"$log" 2>&1
  status=$?
  if [[ $status -ne 77 ]]; then
    echo "FAIL: $(basename "$program") \"[torch]\" exited $status without torch (77: all skipped):"
    tail -30 "$log"
    fails=$((fails + 1))
  fi
done
echo "$checked test programs with [torch] cases, $fails of them not all skipped without torch"
((fails == 0 && checked > 0))
