#!/usr/bin/env bash
# A real two-node Slurm cluster on this host (slurmctld and two slurmd on loopback, all state
# in a temp dir, stopped and removed on exit whatever happens), used through srun as users
# of a cluster do. See /work/shared/slurm-on-one-host.md for the recipe.
#
# Usage: run_slurm_test.sh MODE [DDPRUN]
#   env     `srun -N2` runs a command once per node with the SLURM_* variables ddprun reads
#           (SLURM_JOB_ID, SLURM_NNODES, SLURM_NODEID 0 and 1, SLURM_JOB_NODELIST).
#   ddprun  `srun -N2 --ntasks-per-node=1 DDPRUN --nproc_per_node=2 worker`: 4 workers ran
#           with RANK 0..3 and WORLD_SIZE 4, and each node printed the line saying what it
#           took from Slurm. Skipped while this ddprun refuses --nnodes=2.
#   sbatch  the batch script in docs/multi-node.md (section Slurm) through `sbatch --wait`:
#           the same checks on the sample worker's lines. Skipped as ddprun.
# Exit status: 0 passed, 77 skipped (CTest's SKIP_RETURN_CODE; the reason is printed),
# anything else failed.
#
# Authentication is auth/none rather than munge: no system-wide munged (and its socket in
# /run/munge, shared with whatever else runs on the host) is needed, and the cluster only
# listens on loopback for the length of one test.
set -euo pipefail

mode=${1:?usage: run_slurm_test.sh env|ddprun|sbatch [DDPRUN]}
here=$(cd "$(dirname "$0")" && pwd)
ddprun=${2:-$here/../../../../build/bin/ddprun}
readonly start_timeout_s=60   # daemons up and both nodes idle
readonly job_timeout_s=120    # one srun, start to end

skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAILED: $*" >&2; exit 1; }

# --- can Slurm run here? -------------------------------------------------------------------
for tool in slurmctld slurmd srun sbatch sinfo squeue scancel; do
  command -v "$tool" >/dev/null || skip "Slurm's $tool is not installed (scripts/setup installs slurm-wlm)"
done
[[ $(id -u) -eq 0 ]] || skip "slurmd must run as root to start jobs (this test runs as $(id -un))"
node_a=$(hostname)
node_b="$node_a-b"  # sorts after node_a, so node_a is node 0 and the job's master address
getent hosts "$node_a" >/dev/null || skip "this host's name '$node_a' does not resolve"
if [[ $mode == ddprun || $mode == sbatch ]]; then
  [[ -x $ddprun ]] || fail "no ddprun at $ddprun"
  # Refused at once today; once multi-node is in, it gives up on the closed port after 1 s.
  probe=$(timeout 10 "$ddprun" --nnodes=2 --node_rank=1 --master_addr=127.0.0.1 \
          --master_port=1 --rdzv_conf timeout=1 --no_python true 2>&1 || true)
  if grep -q "not implemented" <<<"$probe"; then
    skip "multi-node ddprun not available in this build ($(head -n1 <<<"$probe"))"
  fi
fi

# --- the cluster, in a temp dir --------------------------------------------------------------
# Nothing of the caller's own Slurm job (CI may itself run under Slurm) or PET_* leaks in.
while read -r name; do unset "$name"; done < <(compgen -e | grep -E '^(SLURM_|PET_)' || true)
dir=$(mktemp -d "${TMPDIR:-/tmp}/ddp-slurm.XXXXXX")
pids=()
cleanup() {
  local status=$?
  if [[ -n ${SLURM_CONF:-} ]] && ((${#pids[@]})); then
    timeout 10 scancel --user=root >/dev/null 2>&1 || true
    for _ in $(seq 50); do  # until the jobs are gone, bounded: their steps then have ended
      [[ -z $(timeout 5 squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.1
    done
  fi
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if ((status != 0 && status != 77)); then
    for log in "$dir"/*.log; do [[ -f $log ]] && { echo "--- $log"; tail -n 8 "$log"; }; done
  fi
  rm -rf "$dir"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# reserve_port NAME: sets NAME to a TCP port for a server of this test: below the kernel's
# ephemeral range (no outgoing connection of a concurrent test takes it meanwhile), clear of
# torchrun's defaults, free when picked, and reserved against the other tests by a lock held
# until this script exits (the same locks as reserve_port() in tests/support/test_support.hpp).
reserve_port() {
  # (its locals start with rp_: printf -v sets the caller's variable, which a local of the
  # same name would hide)
  local rp_low rp_locks=${TMPDIR:-/tmp}/ddp-test-ports rp_port rp_fd rp_attempt
  read -r rp_low _ </proc/sys/net/ipv4/ip_local_port_range
  mkdir -p "$rp_locks"
  for ((rp_attempt = 0; rp_attempt < 1000; rp_attempt++)); do
    rp_port=$((10000 + (RANDOM * 32768 + RANDOM) % (rp_low - 10000)))
    ((rp_port >= 29400 && rp_port <= 29600)) && continue
    exec {rp_fd}>>"$rp_locks/$rp_port.lock" || continue
    if flock -n "$rp_fd" && python3 -c '
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))' "$rp_port" 2>/dev/null; then
      printf -v "$1" '%s' "$rp_port"
      return 0
    fi
    exec {rp_fd}>&-
  done
  fail "no free port to reserve below $rp_low"
}

# Three ports for slurmctld and the two slurmd.
reserve_port ctld_port
reserve_port node_a_port
reserve_port node_b_port

mkdir -p "$dir/state" "$dir/spool-$node_a" "$dir/spool-$node_b"
cat >"$dir/slurm.conf" <<EOF
ClusterName=ddptest
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$node_a_port
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
MpiDefault=none
MailProg=/bin/true
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/ctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/ctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ReturnToService=2
NodeName=$node_a NodeAddr=127.0.0.1 Port=$node_a_port CPUs=1 State=UNKNOWN
NodeName=$node_b NodeAddr=127.0.0.1 Port=$node_b_port CPUs=1 State=UNKNOWN
PartitionName=p Nodes=$node_a,$node_b Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$dir/slurm.conf

# In the foreground (-D) as our own children, so that they are stopped by PID.
slurmctld -D -i -f "$SLURM_CONF" >"$dir/ctld.stderr" 2>&1 &
pids+=($!)
for node in "$node_a" "$node_b"; do
  slurmd -D -f "$SLURM_CONF" -N "$node" >"$dir/slurmd-$node.stderr" 2>&1 &
  pids+=($!)
done

# Slurm offers no event for "node idle": poll sinfo, bounded by the deadline.
deadline=$((SECONDS + start_timeout_s))
until [[ $(timeout 5 sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$') == 2 ]]; do
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || fail "a Slurm daemon (pid $pid) exited while starting"
  done
  ((SECONDS < deadline)) || fail "both Slurm nodes not idle after ${start_timeout_s} s: $(sinfo -N 2>&1 | tr '\n' ' ')"
  sleep 0.2
done
echo "Slurm cluster up: nodes $node_a and $node_b"

# --- the checks ------------------------------------------------------------------------------
# Runs srun with the given arguments, bounded; its output (both streams) is in $dir/srun.out
# and on this script's stdout.
run_srun() {
  if ! timeout "$job_timeout_s" srun -N2 --ntasks-per-node=1 "$@" >"$dir/srun.out" 2>&1; then
    cat "$dir/srun.out"
    fail "srun $* failed or ran past ${job_timeout_s} s"
  fi
  cat "$dir/srun.out"
}

check_env() {
  local output expected lines
  run_srun sh -c 'echo "slurm-env JOB=$SLURM_JOB_ID NNODES=$SLURM_NNODES NODEID=$SLURM_NODEID LIST=$SLURM_JOB_NODELIST NODE=$SLURMD_NODENAME"'
  output=$(cat "$dir/srun.out")
  lines=$(grep '^slurm-env ' <<<"$output" | sed 's/JOB=[0-9]* //' | sort)
  expected="slurm-env NNODES=2 NODEID=0 LIST=$node_a,$node_b NODE=$node_a
slurm-env NNODES=2 NODEID=1 LIST=$node_a,$node_b NODE=$node_b"
  [[ $lines == "$expected" ]] || fail "per-node SLURM_* variables: expected
$expected
got
$lines"
  [[ $(grep -o 'JOB=[0-9]*' <<<"$output" | sort -u | wc -l) == 1 ]] || fail "the two nodes saw different SLURM_JOB_IDs"
}

# Checks a two-node ddprun job's output in file $1: the four workers' lines (grep pattern
# $2 followed by the rank, then $3 before the world size) and each node's Slurm line.
check_world() {
  local output ranks job expected=""
  output=$(cat "$1")
  ranks=$(grep -o "$2[0-9]*$3[0-9]*" <<<"$output" | sort)
  for rank in 0 1 2 3; do expected+="$2$rank${3}4"$'\n'; done
  [[ $ranks == "${expected%$'\n'}" ]] || fail "expected 4 workers with RANK 0..3 and WORLD_SIZE 4, got:
$ranks"
  job=$(grep -o 'ddprun: from Slurm job [0-9]*' <<<"$output" | head -n1 | grep -o '[0-9]*$') ||
    fail "no 'ddprun: from Slurm job' line"
  for rank in 0 1; do
    local line="ddprun: from Slurm job $job: --nnodes=2 --node_rank=$rank --master_addr=$node_a --rdzv_id=$job"
    grep -qF -- "$line" <<<"$output" || fail "missing the line: $line"
  done
}

check_ddprun() {
  local port
  reserve_port port
  run_srun "$ddprun" --nproc_per_node=2 --master_port="$port" "$here/print_env_worker.sh"
  check_world "$dir/srun.out" "slurm-test-worker RANK=" " WORLD_SIZE="
}

# The batch script of docs/multi-node.md (section Slurm), submitted as written but for
# build/bin/, which becomes DDPRUN's directory, and the port, a free one.
check_sbatch() {
  local docs=$here/../../../../docs/multi-node.md bin_dir port
  reserve_port port
  bin_dir=$(cd "$(dirname "$ddprun")" && pwd)
  awk '/^## /{slurm = ($0 == "## Slurm")} slurm && /^```bash$/{inside = 1; next}
       inside && /^```$/{exit} inside' "$docs" |
    sed -e "s|build/bin/|$bin_dir/|g" -e "s|--master_port=29500|--master_port=$port|" \
      >"$dir/job.sbatch"
  grep -q '^srun ' "$dir/job.sbatch" || fail "no sbatch script with srun in $docs (section Slurm)"
  cat "$dir/job.sbatch"
  (cd "$dir" && timeout "$job_timeout_s" sbatch --wait --output="$dir/sbatch.out" job.sbatch) ||
    { cat "$dir/sbatch.out" 2>/dev/null; fail "sbatch --wait failed or ran past ${job_timeout_s} s"; }
  cat "$dir/sbatch.out"
  check_world "$dir/sbatch.out" "hello from rank " " of "
}

case $mode in
  env) check_env ;;
  ddprun) check_ddprun ;;
  sbatch) check_sbatch ;;
  *) fail "unknown mode $mode (env, ddprun or sbatch)" ;;
esac
echo "passed: $mode"
