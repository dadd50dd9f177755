#!/usr/bin/env bash
# scripts/check-architecture passes on the tree, and fails on a copy of its rooms where the
# store includes an agent header, libddp includes the launcher, or a launcher header has no
# room.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
check=$root/scripts/check-architecture
"$check" >/dev/null || { echo "FAIL: the tree itself crosses an arrow"; "$check"; exit 1; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fails() {  # fails NAME FILE LINE: the check must fail once LINE is added to FILE
  rm -rf "$scratch/tree" && mkdir -p "$scratch/tree"
  cp -r "$root/common" "$root/rendezvous" "$root/runtime" "$root/launcher" "$scratch/tree/"
  echo "$3" >>"$scratch/tree/$2"
  if "$check" --root "$scratch/tree" >"$scratch/out"; then
    echo "FAIL: $1: the check passed"; exit 1
  fi
  grep -q "cross an arrow\|no room" "$scratch/out" || { echo "FAIL: $1: no reason given"; exit 1; }
  echo "ok: $1: $(grep -m1 -- '->\|no room' "$scratch/out")"
}
fails "store -> agent" rendezvous/store/server.cpp '#include "ddp/launcher/agent.hpp"'
fails "runtime -> launcher" runtime/reducer.cpp '#include "ddp/launcher/cli.hpp"'
fails "store -> elastic" rendezvous/include/ddp/store/store.hpp '#include "ddp/elastic/rendezvous.hpp"'
fails "process -> agent (relative)" launcher/process/worker.cpp '#include "../agent/agent_machine.hpp"'
fails "a launcher header without a room" launcher/include/ddp/launcher/new_thing.hpp '#pragma once'
echo "architecture check: 6 passed, 0 failed"
