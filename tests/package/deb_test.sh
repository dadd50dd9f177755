#!/usr/bin/env bash
# The Debian packages: cpack makes ddprun and libddp-dev from the build in $1 (built
# already: no target is rebuilt); their Depends are what the programs load and what
# find_package(ddp) finds, and apt accepts them on this host (simulated). Both are unpacked
# into a scratch root with `dpkg-deb -x`, where the installed ddprun runs a 2-rank PyTorch job
# and a find_package(ddp) project builds against the installed files and runs on 2 ranks.
#
# A real `apt-get install ./ddprun_*.deb` into a clean Debian 11 root is scripts/test-packages'
# (run by scripts/test as root); here, on this host, `apt-get --simulate install` checks the
# dependencies against its package database without changing a machine other builds share,
# and dpkg-deb -x puts the files where dpkg would put them, under a prefix.
#
# Usage: deb_test.sh BUILD_DIR. Exit status: 0 passed, 77 skipped (the reason is printed),
# anything else failed.
set -euo pipefail
build=$(cd "${1:?usage: deb_test.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
readonly job_timeout_s=120

skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAILED: $*" >&2; exit 1; }

for tool in cpack dpkg-deb dpkg-shlibdeps cmake objdump ldconfig pkg-config; do
  command -v "$tool" >/dev/null ||
    skip "$tool is not installed (cmake and dpkg-dev: scripts/setup installs them)"
done
for target in ddprun ddpstore; do
  [[ -x $build/bin/$target ]] || fail "$build/bin/$target is not built (build the tree first)"
done

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# --- the packages ------------------------------------------------------------------------
cpack --config "$build/CPackConfig.cmake" -B "$scratch/cpack" >"$scratch/cpack.log" 2>&1 ||
  { cat "$scratch/cpack.log"; fail "cpack failed"; }
shopt -s nullglob
runtime_debs=("$scratch"/cpack/ddprun_*.deb)
dev_debs=("$scratch"/cpack/libddp-dev_*.deb)
((${#runtime_debs[@]} == 1 && ${#dev_debs[@]} == 1)) ||
  fail "expected ddprun_*.deb and libddp-dev_*.deb, got: $(ls "$scratch/cpack")"
runtime_deb=${runtime_debs[0]}
dev_deb=${dev_debs[0]}

expect_files() {  # expect_files DEB PATH...: each PATH is in DEB
  local deb=$1 listing
  shift
  listing=$(dpkg-deb -c "$deb" | awk '{print $6}')
  for path in "$@"; do
    grep -qx "\./$path" <<<"$listing" || fail "$(basename "$deb") does not hold $path"
  done
}
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$build/CMakeCache.txt")
expect_files "$runtime_deb" usr/bin/ddprun usr/bin/ddpstore
expect_files "$dev_deb" usr/include/ddp/runtime.hpp usr/include/ddp/store/client.hpp \
  "usr/$libdir/libddp_runtime.a" "usr/$libdir/libddp_store.a" \
  "usr/$libdir/cmake/ddp/ddpConfig.cmake" "usr/$libdir/pkgconfig/ddp.pc"
if dpkg-deb -c "$runtime_deb" | grep -q '\.hpp$\|\.a$'; then
  fail "$(basename "$runtime_deb") holds development files"
fi

# Depends: libc6 always (every program loads it), from dpkg-shlibdeps; the -dev package's
# from what ddpConfig.cmake finds.
runtime_depends=$(dpkg-deb -f "$runtime_deb" Depends)
dev_depends=$(dpkg-deb -f "$dev_deb" Depends)
echo "ddprun Depends: $runtime_depends"
echo "libddp-dev Depends: $dev_depends"
grep -q 'libc6 (>= 2\.[0-9]*)' <<<"$runtime_depends" || fail "ddprun's Depends lacks libc6"
owner() {  # owner LIBRARY: the Debian package that ships it on this host, or nothing
  local path
  path=$(ldconfig -p | awk -v l="$1" '$1 == l {print $NF; exit}')
  [[ -n $path ]] || return 0
  { dpkg -S "$path" || dpkg -S "$(readlink -f "$path")"; } 2>/dev/null | head -1 | cut -d: -f1
}
for lib in $(objdump -p "$build/bin/ddprun" | awk '$1 == "NEEDED" {print $2}'); do
  package=$(owner "$lib")
  [[ -n $package ]] || fail "no package owns $lib, which ddprun loads"
  grep -q "\b$package\b" <<<"$runtime_depends" ||
    fail "ddprun loads $lib (package $package) but does not depend on $package"
done
for package in libboost-dev libgloo-dev libssl-dev; do
  grep -q "\b$package\b" <<<"$dev_depends" || fail "libddp-dev does not depend on $package"
done
if command -v apt-get >/dev/null; then
  apt-get --simulate install "$runtime_deb" "$dev_deb" >"$scratch/apt.log" 2>&1 ||
    { cat "$scratch/apt.log"; fail "apt-get --simulate install refuses the packages"; }
  echo "apt-get --simulate install: accepted ($(grep -c '^Inst' "$scratch/apt.log") to install)"
fi

# --- installed into a scratch root ----------------------------------------------------------
root=$scratch/root
dpkg-deb -x "$runtime_deb" "$root"
dpkg-deb -x "$dev_deb" "$root"
ddprun=$root/usr/bin/ddprun
"$ddprun" --version >/dev/null || fail "the installed ddprun does not run"
"$root/usr/bin/ddpstore" --help >/dev/null || fail "the installed ddpstore does not run"
probe=$root/usr/share/ddprun/python/sitecustomize.py
[[ -f $probe ]] || fail "the ddprun package has no Python probe at /usr/share/ddprun/python"
[[ $(stat -c %a "$probe") == 644 ]] || fail "the Python probe is mode $(stat -c %a "$probe"), not 644"

# A find_package(ddp) project against the installed files, and its program on 2 ranks.
project=$scratch/user
mkdir -p "$project"
cp "$source_dir/apps/examples/sum.cpp" "$project/main.cpp"
cat >"$project/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.20)
project(user CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(ddp REQUIRED)
message(STATUS "ddp found in ${ddp_DIR}")
add_executable(sum main.cpp)
target_link_libraries(sum PRIVATE ddp::runtime)
CMAKE
cmake -S "$project" -B "$project/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$scratch/user.log" 2>&1 ||
  { cat "$scratch/user.log"; fail "the user project does not configure with find_package(ddp)"; }
grep -q "ddp found in $root/usr/" "$scratch/user.log" ||
  fail "find_package(ddp) found another ddp: $(grep 'ddp found' "$scratch/user.log")"
cmake --build "$project/build" >>"$scratch/user.log" 2>&1 ||
  { cat "$scratch/user.log"; fail "the user project does not build against the installed libddp"; }
pc_include=$(PKG_CONFIG_PATH=$root/usr/$libdir/pkgconfig pkg-config --cflags-only-I ddp | sed 's/^ *-I//; s/ *$//')
[[ $(readlink -f "$pc_include") == "$root/usr/include" ]] ||
  fail "pkg-config ddp points to $pc_include, not the installed root's include/"
out=$(timeout "$job_timeout_s" "$ddprun" --standalone --nproc_per_node=2 "$project/build/sum" 2>&1) ||
  { echo "$out"; fail "the user program failed under the installed ddprun"; }
[[ $(grep -c 'world=2 sum=2$' <<<"$out") -eq 2 ]] || { echo "$out"; fail "expected sum=2 on 2 ranks"; }
echo "ok: a find_package(ddp) program built against the package ran on 2 ranks: sum=2"

# A 2-rank PyTorch job under the installed ddprun, with the suite's PyTorch (DDP_TEST_PYTHON).
python=${DDP_TEST_PYTHON:-/usr/bin/python3}
"$python" -c 'import torch.distributed' 2>/dev/null ||
  skip "the packages pass; the PyTorch job needs $python with torch (scripts/setup installs python3-torch)"
out=$(PYTHON_EXEC=$python timeout "$job_timeout_s" "$ddprun" --standalone --nproc_per_node=2 \
  "$source_dir/tests/launcher/agent/python/torch_allreduce.py" 2>&1) ||
  { echo "$out"; fail "the PyTorch job failed under the installed ddprun"; }
[[ $(grep -c 'world=2 sum=3$' <<<"$out") -eq 2 ]] || { echo "$out"; fail "expected sum=3 on 2 ranks"; }
grep -q "Python probe is off" <<<"$out" && { echo "$out"; fail "the installed ddprun did not load its probe"; }
echo "ok: a 2-rank PyTorch job ran under the installed ddprun: sum=3"
