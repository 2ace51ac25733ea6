#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU (run from the repository root):
# builds gflow with the CUDA component and runs every GPU test. Prints a
# summary to paste into docs/performance.md. Exit status: that of the tests.
#
#   tests/gpu/run_gpu_checks.sh [build-dir]      (default build-gpu)
#
# What it covers today (gflow_gpu_tests): the CUDA kernels against their CPU
# twins, and every collective on device tensors staged through the host
# backends (several ranks sharing the GPU). The NCCL backend is not built yet
# (issue 7 is in progress); this script grows with it.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
start=$(date +%s)
echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4
/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1
echo "== build ($build)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGFLOW_WITH_CUDA=ON \
  -DGFLOW_BUILD_BENCH=OFF -DGFLOW_BUILD_TOOLS=ON >/dev/null || exit 1
cmake --build "$build" -j "$(nproc)" --target gflow_gpu_tests || exit 1
echo "== GPU kernels vs CPU twins, staged device-tensor collectives"
"$build/tests/gflow_gpu_tests" --gtest_brief=1
rc=$?
echo "== done in $(( $(date +%s) - start )) s, status $rc"
exit $rc
