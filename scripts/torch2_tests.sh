#!/usr/bin/env bash
# gflow's Python package on torch 2.x: a Debian chroot (trixie: torch 2.6;
# sid: its current torch) with gflow's build dependencies, cached under the
# build directory; gflow built inside it; python/tests run there, which on
# torch 2.x includes test_torch2.py (what only 2.x has) (docs/python.md).
#
#   scripts/torch2_tests.sh [--build | --test] [trixie | sid]
#     (no option)  make or reuse the chroot, build gflow in it, run the tests
#     --build      only make or reuse the chroot and build (scripts/test.sh runs
#                  this in the background while the host's tests run)
#     --test       only the tests, on what --build made
#
# Skips, saying why on a line that starts "== torch 2.x ... SKIPPED", where
# the machine cannot make the chroot: not root, or no debootstrap and no
# way to install it, or no network to the package registry. Any other
# failure fails. GFLOW_TORCH2_CACHE overrides the cache directory
# (default: build/torch2-SUITE); the chroot is remade when the package list
# changes.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)
# Everything runs in a private mount namespace: the chroot's mounts never
# propagate to the host's (a shared /dev or /sys), and they vanish with the
# script, however it ends.
if [ -z "${GFLOW_TORCH2_NS:-}" ] && [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null; then
  exec unshare --mount --propagation private env GFLOW_TORCH2_NS=1 "$repo/scripts/torch2_tests.sh" "$@"
fi
mode=all
case "${1:-}" in --build) mode=build; shift ;; --test) mode=test; shift ;; esac
suite=${1:-trixie}
cache=$(realpath -m "${GFLOW_TORCH2_CACHE:-$repo/build/torch2-$suite}")
root=$cache/root
case "$cache" in / | "") echo "torch2_tests: refusing the cache directory '$cache'" >&2; exit 1 ;; esac
mirror=${GFLOW_DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages="g++ cmake ninja-build pkg-config libibverbs-dev libhwloc-dev libpmix-dev zlib1g-dev
python3-dev pybind11-dev python3-numpy python3-pytest python3-setuptools python3-pip
python3-wheel python3-torch libtorch-dev python3-sklearn procps iproute2"
packages=$(echo $packages)

skip() {
  echo "== torch 2.x ($suite) tests SKIPPED: $*"
  exit 0
}

# Mounts the chroot needs; undone on exit. /gflow is this checkout.
mounted=()
unmount_all() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  mounted=()
}
mount_in() {  # mount_in TARGET ARGS...
  local target=$1
  shift
  mkdir -p "$target"
  mountpoint -q "$target" || { mount "$@" "$target" && mounted+=("$target"); }
}
enter() {
  trap unmount_all EXIT
  mount_in "$root/proc" -t proc proc
  mount_in "$root/sys" --rbind /sys
  mount_in "$root/dev" --rbind /dev
  mount_in "$root/gflow" --bind "$repo"
}
# Removes a chroot this script made (its cache carries a marker), never
# while anything is mounted under it, and never across file systems.
remove_root() {
  [ -e "$root" ] || return 0
  if [ ! -f "$cache/.gflow-torch2-cache" ]; then
    echo "torch2_tests: $cache was not made by this script; not removing $root" >&2
    exit 1
  fi
  if awk -v r="$root" '$5 == r || index($5, r "/") == 1 { found = 1 } END { exit !found }' \
      /proc/self/mountinfo; then
    echo "torch2_tests: $root still has mounts; not removing it" >&2
    exit 1
  fi
  rm -rf --one-file-system "$root"
}

# Whether the mirror answers for `suite` (a failed debootstrap is a skip
# only when it does not).
mirror_reachable() {
  python3 - "$mirror/dists/$suite/Release" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=20).read(64)
PY
}

make_chroot() {
  local stamp=$root/.gflow-packages
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$packages" ]; then
    echo "== torch 2.x ($suite): chroot cached in $root"
    return
  fi
  [ "$(id -u)" -eq 0 ] || skip "not root (debootstrap and chroot need root)"
  if ! command -v debootstrap >/dev/null; then
    apt-get install -y -qq --no-install-recommends debootstrap >/dev/null 2>&1 ||
      skip "debootstrap is not installed and apt-get could not install it"
  fi
  remove_root
  local t0
  t0=$(date +%s)
  echo "== torch 2.x ($suite): debootstrap into $root"
  if ! debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$cache/debootstrap.log" 2>&1; then
    tail -n 5 "$cache/debootstrap.log"
    remove_root
    mirror_reachable || skip "the package registry $mirror does not answer for $suite" \
      "(no network?); log: $cache/debootstrap.log"
    echo "torch2_tests: debootstrap $suite failed although $mirror answers;" \
      "log: $cache/debootstrap.log" >&2
    exit 1
  fi
  cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
  echo "== torch 2.x ($suite): installing $packages"
  # A mirror that is a snapshot serves Release files past their
  # Valid-Until; only then, and saying so, is the check off.
  local update="apt-get update -qq"
  if ! chroot "$root" sh -c "$update" >"$cache/apt.log" 2>&1 && grep -q "is expired" "$cache/apt.log"; then
    echo "== torch 2.x ($suite): the mirror's Release file has expired (a snapshot?);" \
      "reading it without the Valid-Until check"
    update="apt-get -o Acquire::Check-Valid-Until=false update -qq"
  fi
  if ! chroot "$root" sh -c "$update && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends $packages" >>"$cache/apt.log" 2>&1; then
    tail -n 20 "$cache/apt.log"
    echo "torch2_tests: installing the packages into the $suite chroot failed; log: $cache/apt.log" >&2
    exit 1
  fi
  chroot "$root" apt-get clean
  echo "$packages" >"$stamp"
  echo "== torch 2.x ($suite): chroot made in $(($(date +%s) - t0)) s"
}

# Without -Werror: the host's build is the warnings gate, and a newer
# compiler's false positives (gcc 14's -Wfree-nonheap-object at -O3) must
# not stop the torch 2.x tests.
build_inside() {
  enter
  local jobs
  jobs=$(nproc)
  chroot "$root" sh -c "cmake -S /gflow -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DGFLOW_BUILD_TESTS=OFF -DGFLOW_BUILD_BENCH=OFF -DGFLOW_BUILD_PYTHON=ON \
      -DGFLOW_BUILD_TORCH=ON -DGFLOW_WERROR=OFF >/dev/null && cmake --build /build -j $jobs"
  unmount_all
  trap - EXIT
}

run_tests() {
  # (The package's .py files are links into /gflow: look for the module.)
  compgen -G "$root/build/python/gflow/_gflow_torch*.so" >/dev/null ||
    { echo "torch2_tests: no gflow build in $root (run --build first)" >&2; exit 1; }
  enter
  chroot "$root" python3 -c \
    'import sys, torch; print("== torch 2.x: torch", torch.__version__, "python", sys.version.split()[0])'
  # Debian's torch is built without libuv: its TCPStore must not ask for it.
  chroot "$root" env USE_LIBUV=0 GFLOW_BUILD_DIR=/build sh -c \
    "cd /gflow && python3 -m pytest -q -p no:cacheprovider python/tests"
}

[ "$(id -u)" -eq 0 ] || skip "not root (debootstrap and chroot need root)"
# A cache directory this script creates carries a marker: remove_root
# removes a chroot only from there.
if [ ! -e "$cache" ]; then
  mkdir -p "$cache"
  touch "$cache/.gflow-torch2-cache"
fi
# One run at a time per cache (scripts/test.sh's background --build and a
# --test after it, or two checkouts' runs).
exec 9>"$cache/.lock"
flock 9
if [ "$mode" != test ]; then
  make_chroot
  build_inside
fi
if [ "$mode" != build ]; then
  # --test after a --build that skipped: the same reason holds.
  [ -f "$root/.gflow-packages" ] || skip "no chroot was made (see the --build output)"
  run_tests
fi
