#!/usr/bin/env bash
# The wheel: packaging/wheel/build_wheel.py makes it from the programs of the build in $1 (no
# rebuild); a fresh virtualenv over the tests' PyTorch python (DDP_TEST_PYTHON, default Debian's
# /usr/bin/python3; --system-site-packages, so that its torch is visible in it) installs it
# with `pip install --no-index`; its bin/ddprun is
# the native program (not a Python wrapper) and runs a 2-rank PyTorch job with the venv
# activated, the workers started with the venv's python3 as a user's would be.
#
# Usage: wheel_test.sh BUILD_DIR. Exit status: 0 passed, 77 skipped (the reason is printed),
# anything else failed.
set -euo pipefail
build=$(cd "${1:?usage: wheel_test.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
# Debian's python3 builds the wheel (python3-setuptools, python3-wheel); the venv is made over
# the python whose PyTorch the suite tests (tests/CMakeLists.txt passes DDP_TEST_PYTHON).
builder=/usr/bin/python3
python=${DDP_TEST_PYTHON:-/usr/bin/python3}
readonly job_timeout_s=120

skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAILED: $*" >&2; exit 1; }

[[ -x $builder ]] || skip "no $builder (Debian's python3)"
[[ -x $python ]] || skip "no $python (DDP_TEST_PYTHON)"
command -v objdump >/dev/null || skip "objdump is not installed (binutils, in build-essential)"
"$builder" -c 'import setuptools, wheel' 2>/dev/null ||
  skip "$builder lacks setuptools or wheel (scripts/setup installs python3-setuptools python3-wheel)"
"$python" -c 'import ensurepip, venv' 2>/dev/null ||
  skip "$python cannot make a virtualenv (scripts/setup installs python3-venv)"
for target in ddprun ddpstore; do
  [[ -x $build/bin/$target ]] || fail "$build/bin/$target is not built (build the tree first)"
done
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

"$builder" "$source_dir/packaging/wheel/build_wheel.py" --bin-dir "$build/bin" \
  --dist-dir "$scratch/dist" --version "$version" >"$scratch/wheel.log" 2>&1 ||
  { cat "$scratch/wheel.log"; fail "build_wheel.py failed"; }
cat "$scratch/wheel.log"
shopt -s nullglob
wheels=("$scratch"/dist/ddprun-"$version"-py3-none-*.whl)
((${#wheels[@]} == 1)) || fail "expected one ddprun-$version-py3-none-*.whl, got: $(ls "$scratch/dist")"
wheel=${wheels[0]}
# The tag is honest: manylinux only when the programs and the plugin load nothing but glibc.
if [[ $wheel == *manylinux* ]]; then
  for elf in "$build/bin/ddprun" "$build/bin/ddpstore" "$build/lib/libddprun-nccl-profiler.so"; do
    [[ -f $elf ]] || continue
    needed=$(objdump -p "$elf" | awk '$1 == "NEEDED" {print $2}' | sort -u | tr '\n' ' ')
    if grep -q 'libstdc++\|libssl\|libcrypto\|libgcc_s' <<<"$needed"; then
      fail "tagged manylinux while ${elf##*/} loads: $needed"
    fi
  done
fi

"$python" -m venv --system-site-packages "$scratch/venv" >"$scratch/venv.log" 2>&1 ||
  { cat "$scratch/venv.log"; fail "$python -m venv failed"; }
# A venv made by a venv's python sees the base interpreter's packages, not that venv's (where
# its torch is): a .pth file adds them, as --system-site-packages does for a system python.
parent_site=$("$python" -c 'import site, sys
if sys.prefix != sys.base_prefix: print("\n".join(site.getsitepackages()))')
if [[ -n $parent_site ]]; then
  venv_site=$("$scratch/venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
  printf '%s\n' "$parent_site" >"$venv_site/ddp-test-parent.pth"
fi
"$scratch/venv/bin/pip" install --no-index --disable-pip-version-check -q "$wheel" \
  >"$scratch/pip.log" 2>&1 || { cat "$scratch/pip.log"; fail "pip install --no-index failed"; }
venv_ddprun=$scratch/venv/bin/ddprun
[[ -x $venv_ddprun ]] || fail "the wheel put no ddprun into the venv's bin/"
[[ -x $scratch/venv/bin/ddpstore ]] || fail "the wheel put no ddpstore into the venv's bin/"
[[ $(head -c 4 "$venv_ddprun" | od -An -c | tr -d ' ') == 177ELF ]] ||
  fail "the venv's ddprun is not the native program"
cmp -s "$venv_ddprun" "$build/bin/ddprun" || fail "the venv's ddprun differs from the built one"
[[ -f $scratch/venv/share/ddprun/python/sitecustomize.py ]] ||
  fail "the wheel put no Python probe into the venv's share/ddprun/python"

# The user's view: the venv activated, `ddprun` found on PATH; workers run the venv's python3.
activate() { PATH=$scratch/venv/bin:$PATH VIRTUAL_ENV=$scratch/venv "$@"; }
found=$(activate bash -c 'command -v ddprun')
[[ $found == "$venv_ddprun" ]] || fail "ddprun on the venv's PATH is $found"
activate ddprun --version >/dev/null || fail "ddprun --version failed in the venv"
echo "ok: the wheel installed ddprun and ddpstore into the venv's bin/"

activate python3 -c 'import torch.distributed' 2>/dev/null ||
  skip "the wheel installs; the PyTorch job needs torch visible in a venv over $python (scripts/setup installs python3-torch)"
out=$(activate timeout "$job_timeout_s" ddprun --standalone --nproc_per_node=2 \
  "$source_dir/tests/launcher/agent/python/torch_allreduce.py" 2>&1) ||
  { echo "$out"; fail "the PyTorch job failed under the venv's ddprun"; }
[[ $(grep -c 'world=2 sum=3$' <<<"$out") -eq 2 ]] || { echo "$out"; fail "expected sum=3 on 2 ranks"; }
grep -q "Python probe is off" <<<"$out" && { echo "$out"; fail "the venv's ddprun did not load its probe"; }
echo "ok: a 2-rank PyTorch job ran under the venv's ddprun: sum=3"
