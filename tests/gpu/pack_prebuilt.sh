#!/usr/bin/env bash
# Packs what tests/gpu/run_gpu_checks.sh runs, from a build tree made here,
# for a GPU machine that has a driver and CUDA but not gflow's build
# dependencies (googletest, hwloc): stripped binaries and libraries in the
# build tree's layout, the public headers the Python extension is compiled
# against there, and the shared libraries the binaries need that such a
# machine may lack. Then, on the GPU machine:
#
#   tests/gpu/run_gpu_checks.sh --prebuilt DIR
#
#   tests/gpu/pack_prebuilt.sh [build-dir] [out-dir]   (default build, .gpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
out=${2:-.gpu}
rm -rf "$out" && mkdir -p "$out/build/tests" "$out/build/bench/compare" "$out/build/tools" \
  "$out/build/include" "$out/lib"
for f in tests/gflow_gpu_tests bench/allreduce_bw bench/compare/nccl_allreduce_bw tools/gflowrun \
  libgflow.so.0 libgflow_cuda.so.0; do
  [ -e "$build/$f" ] || { echo "missing $build/$f (build it first)" >&2; exit 1; }
  strip -o "$out/build/$f" "$(readlink -f "$build/$f")"
done
cp -r "$build/include/gflow" "$out/build/include/"
for lib in libhwloc.so.15 libudev.so.1; do
  cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')" "$out/lib/$lib"
done
du -sh "$out"
