#!/bin/sh
# run_if_torch.sh PYTHON SCRIPT ARGS...: runs SCRIPT with PYTHON, or skips (77, CTest's
# SKIP_RETURN_CODE here) saying why when PYTHON cannot import torch.distributed: a peer that is
# missing is a visible skip, as in the C++ [torch] tests, never a failure.
python=$1
shift
if ! why=$("$python" -c 'import torch.distributed' 2>&1); then
  echo "SKIP: $python cannot import torch.distributed: $(printf '%s\n' "$why" | tail -n 1)"
  exit 77
fi
exec "$python" "$@"
