#!/usr/bin/env bash
# Every test case tagged [torch] skips, saying why, when its Python imports no torch: CI runs
# them a second time against the PyTorch 2.14 root, and where that root could not be made
# (scripts/setup-pytorch214) they must show as skipped, not fail. Runs each test program given
# with the filter "[torch]" and DDP_TEST_PYTHON=/bin/false (an interpreter that imports
# nothing); a program must exit 0 (no such case, or one that passes anyway) or 77 (skipped).
set -uo pipefail
fails=0
for program in "$@"; do
  DDP_TEST_PYTHON=/bin/false timeout 300 "$program" "[torch]" >/tmp/ddp-torch-skip.$$ 2>&1
  status=$?
  if [[ $status -ne 0 && $status -ne 77 ]]; then
    echo "FAIL: $(basename "$program") \"[torch]\" exited $status without torch:"
    tail -30 /tmp/ddp-torch-skip.$$
    fails=$((fails + 1))
  fi
done
rm -f /tmp/ddp-torch-skip.$$
echo "$# test programs, $fails with a [torch] case that fails without torch"
((fails == 0))
