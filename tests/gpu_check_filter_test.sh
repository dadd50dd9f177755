#!/usr/bin/env bash
# scripts/gpu-check's compute-sanitizer filter, without a GPU: it drops NCCL's start-up probe
# (cudaErrorNoKernelImageForDevice with ncclInitKernelsForDevice in the host backtrace) and
# nothing else. The logs below follow compute-sanitizer's report layout: "========= TEXT", the
# indented backtrace under it, a bare "=========" between reports, then "ERROR SUMMARY".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gpu_check=$here/../scripts/gpu-check
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0

probe() {  # one report of NCCL's start-up probe, with PREFIX before every line
  local prefix=${1:-}
  cat <<LOG
${prefix}========= Program hit cudaErrorNoKernelImageForDevice (error 209) due to "no kernel image is available for execution on the device" on CUDA API call to cudaFuncGetAttributes.
${prefix}=========     Saved host backtrace up to driver entry point at error
${prefix}=========         Host Frame: cudaFuncGetAttributes [0x5c4e1] in libcudart.so.13
${prefix}=========         Host Frame: ncclInitKernelsForDevice(int, int, unsigned long*) in enqueue.cc:57 [0x7fcbb] in libnccl.so.2
${prefix}=========         Host Frame: ncclCommInitRankConfig [0x9a1f0] in libnccl.so.2
${prefix}=========
LOG
}

# expect NAME "unexpected=N filtered=M summary=S" < log
expect() {
  local name=$1 want=$2 got
  cat >"$scratch/$name.log"
  got=$("$gpu_check" --count-sanitizer-reports "$scratch/$name.log" 2>/dev/null)
  if [[ $got == "$want" ]]; then
    echo "ok: $name: $got"
  else
    echo "FAILED: $name: got '$got', want '$want'"
    failures=$((failures + 1))
  fi
}

{ echo "========= COMPUTE-SANITIZER"; echo "test output"; echo "========= ERROR SUMMARY: 0 errors"; } |
  expect clean "unexpected=0 filtered=0 summary=0"

# A test's own "=====" lines (Catch2's separators) are not reports.
{ echo "========= COMPUTE-SANITIZER"; printf '=%.0s' {1..79}; echo; echo "All tests passed"
  echo "========= ERROR SUMMARY: 0 errors"; } | expect catch2-separator "unexpected=0 filtered=0 summary=0"

{ echo "========= COMPUTE-SANITIZER"; probe; probe; echo "========= ERROR SUMMARY: 2 errors"; } |
  expect nccl-probe-only "unexpected=0 filtered=2 summary=2"

# Under ddprun with a rank prefix, and the last report closed by the summary line.
{ probe "[default0]:"; echo "[default0]:========= ERROR SUMMARY: 1 error"; } |
  expect rank-prefix "unexpected=0 filtered=1 summary=1"

# Ours among NCCL's: counted.
{
  probe
  cat <<'LOG'
========= Invalid __global__ write of size 4 bytes
=========     at fmnist::cuda::relu_kernel(float *, int)+0x1f0
=========     by thread (31,0,0) in block (0,0,0)
=========     Address 0x7f0000000400 is out of bounds
=========
LOG
  echo "========= ERROR SUMMARY: 2 errors"
} | expect ours-among-nccl "unexpected=1 filtered=1 summary=2"

# The same error name from our own code is not NCCL's probe: counted.
{
  cat <<'LOG'
========= Program hit cudaErrorNoKernelImageForDevice (error 209) due to "no kernel image is available for execution on the device" on CUDA API call to cudaLaunchKernel.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: fmnist::cuda::launch_relu(float*, int, CUstream_st*) in cuda_kernels.cu:40 [0x1234] in train_fashion_mnist
=========
========= ERROR SUMMARY: 1 error
LOG
} | expect same-error-our-code "unexpected=1 filtered=0 summary=1"

# Another error from NCCL's probe function is not the known probe: counted.
{
  cat <<'LOG'
========= Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on CUDA API call to cudaFuncGetAttributes.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: ncclInitKernelsForDevice(int, int, unsigned long*) in enqueue.cc:57 [0x7fcbb] in libnccl.so.2
=========
========= ERROR SUMMARY: 1 error
LOG
} | expect other-error-nccl-function "unexpected=1 filtered=0 summary=1"

# racecheck's layout and summary.
{
  cat <<'LOG'
========= Error: Race reported between Write access at fmnist::cuda::sum_kernel(const float *, float *, int)+0x90
=========     and Read access at fmnist::cuda::sum_kernel(const float *, float *, int)+0xb0 [16 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
LOG
} | expect racecheck-hazard "unexpected=1 filtered=0 summary=1"

# More errors summed up than printed: the counts show it (gpu-check fails on the difference).
{ probe; echo "========= ERROR SUMMARY: 5 errors"; } |
  expect summary-beyond-reports "unexpected=0 filtered=1 summary=5"

# No sanitizer output at all (it did not run): no summary.
echo "bash: compute-sanitizer: command not found" | expect no-output "unexpected=0 filtered=0 summary=-1"

((failures == 0)) || { echo "$failures case(s) failed"; exit 1; }
echo "every case passed"
