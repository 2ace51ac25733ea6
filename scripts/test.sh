#!/usr/bin/env bash
# Runs every gflow test on a fresh Debian machine:
#   1. installs dependencies (scripts/install-deps.sh),
#   2. builds with -Werror and runs the GoogleTest suite under ctest, then the
#      Python package's pytest suite (python/tests, against build/python),
#   3. runs python/tests again on torch 2.x, in a Debian trixie chroot with
#      torch 2.6 (scripts/torch2_tests.sh: made, and gflow built in it, in
#      the background while step 2 runs; its tests in the background while
#      steps 4 and 5 compile; cached in build/torch2-trixie; skipped, saying
#      why, where the machine cannot make it),
#   4. installs gflow and builds + runs examples/ against the installed package,
#   5. rebuilds the tests with ASan + UBSan and runs them again.
# Usage: scripts/test.sh [--quick]   (--quick skips steps 3 to 5)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1

bash scripts/install-deps.sh
jobs=$(nproc)

echo "== build (RelWithDebInfo, -Werror)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGFLOW_WERROR=ON >/dev/null
cmake --build build -j "$jobs"

echo "== timing tests (ctest -L timing), with nothing else running"
# They compare gflow's skews with the test's clock to 2 ms; the background
# build below (a libtorch translation unit on both cores) once moved every
# verbs stamp by 4-7 ms.
ctest --test-dir build --output-on-failure --timeout 300 -L timing

if [ "$quick" = 0 ]; then
  echo "== torch 2.x chroot and its gflow build: in the background (build/torch2.log)"
  scripts/torch2_tests.sh --build >build/torch2.log 2>&1 &
  torch2_build=$!
  # If a later step fails, the background build does not outlive this script.
  trap 'kill "$torch2_build" 2>/dev/null || true' EXIT
fi

echo "== tests"
ctest --test-dir build --output-on-failure --timeout 300 -j 2 -LE timing

echo "== Python tests (pytest, Debian's python3)"
GFLOW_BUILD_DIR="$PWD/build" /usr/bin/python3 -m pytest -q -p no:cacheprovider python/tests

[ "$quick" = 1 ] && exit 0

echo "== Python tests on torch 2.x (scripts/torch2_tests.sh): in the background while the"
echo "   examples and the sanitizer build compile (build/torch2-test.log)"
if ! wait "$torch2_build"; then
  cat build/torch2.log
  echo "torch 2.x: making the chroot or building gflow in it failed" >&2
  exit 1
fi
grep "^== torch 2.x" build/torch2.log || true
scripts/torch2_tests.sh --test >build/torch2-test.log 2>&1 &
torch2_test=$!
trap 'kill "$torch2_test" 2>/dev/null || true' EXIT

echo "== install + examples against the installed package"
rm -rf build/install build/examples
cmake --install build --prefix "$PWD/build/install" >/dev/null
cmake -S examples -B build/examples -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/examples -j "$jobs"
LD_LIBRARY_PATH="$PWD/build/install/lib" build/install/bin/gflowrun -n 3 -- build/examples/allreduce_example
PKG_CONFIG_PATH="$PWD/build/install/lib/pkgconfig" pkg-config --exists gflow

echo "== sanitizer build (ASan + UBSan)"
# -O0: at -O1 its tests ran in about 0.75x the time, but it compiled in about
# 1.6x, for about the same total (docs/testing.md).
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DGFLOW_SANITIZE=address,undefined \
  -DGFLOW_BUILD_BENCH=OFF -DGFLOW_BUILD_PYTHON=OFF >/dev/null
cmake --build build-asan -j "$jobs"

echo "== Python tests on torch 2.x: result"
torch2_rc=0
wait "$torch2_test" || torch2_rc=$?
trap - EXIT
grep -v "^\[" build/torch2-test.log | tail -n 40
if [ "$torch2_rc" != 0 ]; then
  echo "torch 2.x: python/tests failed in the chroot (build/torch2-test.log)" >&2
  exit 1
fi

echo "== sanitizer tests"
ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp" \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --test-dir build-asan --output-on-failure --timeout 600 -j 2
