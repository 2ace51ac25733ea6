#!/usr/bin/env bash
# GPU checks, for a machine with NVIDIA GPUs (run from the repository root):
# builds gflow with the CUDA component and NCCL, runs every GPU test and a
# short allreduce_bw sweep on device buffers. Prints a summary to paste into
# docs/performance.md. Exit status: non-zero if anything failed. About 3-5
# minutes on one GPU (most of it the build).
#
#   tests/gpu/run_gpu_checks.sh [build-dir]      (default build-gpu)
#
# Covered (gflow_gpu_tests + allreduce_bw):
#   - the CUDA kernels against their CPU twins (kernels_gpu_test.cc);
#   - every collective staged through the host backends, several ranks
#     sharing GPU 0, and AllreduceOptions on device tensors against the cpu
#     path bit for bit (staged_collectives_gpu_test.cc);
#   - every collective on NCCL, one rank per GPU (GFLOW_DEVICE_BACKEND=nccl;
#     NCCL refuses two ranks on one GPU), and the GradientReducer's fusion,
#     compression and CSC kernels against the cpu reducer, staged and on NCCL
#     (nccl_gpu_test.cc);
#   - allreduce_bw --device cuda, one process per GPU on NCCL and, on one
#     GPU, 2 processes staged over TCP (GFLOW_SHM=0), with the result check on (-c 1);
#   - where /usr/bin/python3's torch has CUDA: torch CUDA tensors through the
#     Python API, the torch backend (batch_isend_irecv included) and DDP
#     (tests/gpu/torch_cuda_check.py).
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
start=$(date +%s)
status=0
echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -8
/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || ngpu=0
[ "$ngpu" -ge 1 ] || ngpu=1
echo "== build ($build)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGFLOW_WITH_CUDA=ON \
  -DGFLOW_WITH_NCCL=ON -DGFLOW_BUILD_BENCH=ON -DGFLOW_BUILD_TOOLS=ON >/dev/null || exit 1
cmake --build "$build" -j "$(nproc)" --target gflow_gpu_tests allreduce_bw gflowrun || exit 1
export GFLOW_CUDA_PLUGIN="$PWD/$build/libgflow_cuda.so.0"
echo "== gflow_gpu_tests (kernels, staged collectives, NCCL, device reducer)"
"$build/tests/gflow_gpu_tests" --gtest_brief=1 || status=1
echo "== allreduce_bw --device cuda on NCCL: $ngpu process(es), one per GPU"
GFLOW_DEVICE_BACKEND=nccl timeout 300 "$build/tools/gflowrun" -n "$ngpu" -- \
  "$build/bench/allreduce_bw" --device cuda -b 8 -e 256M -f 4 -w 5 -n 20 -c 1 || status=1
echo "== allreduce_bw --device cuda staged over TCP: 2 processes sharing GPU 0"
CUDA_VISIBLE_DEVICES=0 GFLOW_DEVICE_BACKEND=staged GFLOW_SHM=0 timeout 300 "$build/tools/gflowrun" -n 2 -- \
  "$build/bench/allreduce_bw" --device cuda -b 8 -e 64M -f 8 -w 2 -n 5 -c 1 || status=1
echo "== python: torch CUDA tensors (gflow API, torch backend, DDP), 2 processes"
if /usr/bin/python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  cmake -S . -B "$build" -DGFLOW_BUILD_PYTHON=ON >/dev/null && \
    cmake --build "$build" -j "$(nproc)" --target _gflow _gflow_torch || status=1
  PYTHONPATH="$PWD/$build/python" timeout 300 "$build/tools/gflowrun" -n 2 -- \
    /usr/bin/python3 tests/gpu/torch_cuda_check.py || status=1
else
  echo "SKIP: /usr/bin/python3's torch has no CUDA"
fi
echo "== done in $(( $(date +%s) - start )) s, status $status"
exit $status
