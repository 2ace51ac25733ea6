#!/usr/bin/env bash
# GPU checks, for a machine with NVIDIA GPUs (run from the repository root):
# builds gflow with the CUDA component and NCCL, runs every GPU test and a
# short allreduce_bw sweep on device buffers. Prints a summary to paste into
# docs/performance.md. Exit status: non-zero if anything failed. About 3-5
# minutes on one GPU (most of it the build).
#
#   tests/gpu/run_gpu_checks.sh [build-dir]      (default build-gpu)
#   tests/gpu/run_gpu_checks.sh --prebuilt DIR   (no build: DIR is the build
#       tree packed by tests/gpu/pack_prebuilt.sh on another machine, for GPU
#       machines without gflow's build dependencies; the Python extension is
#       compiled there against that python's pybind11, and the torch backend,
#       which needs Debian's libtorch 1.13 API, is skipped)
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
#   - gflow's NCCL backend against NCCL itself (bench/compare/nccl_allreduce_bw,
#     the same sweep straight over NCCL), in interleaved rounds, and gflow
#     with its op check off (GFLOW_NCCL_VERIFY=0);
#   - where /usr/bin/python3's torch has CUDA: torch CUDA tensors through the
#     Python API, the torch backend (batch_isend_irecv included) and DDP
#     (tests/gpu/torch_cuda_check.py).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
prebuilt=0
if [ "${1:-}" = --prebuilt ]; then
  prebuilt=1
  build=${2:?--prebuilt needs the packed build directory}
else
  build=${1:-build-gpu}
fi
start=$(date +%s)
status=0
# Interpreter: /usr/bin/python3 where its torch has CUDA, else python3.
py=/usr/bin/python3
cuda_torch() { "$1" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }
cuda_torch "$py" || py=$(command -v python3 || echo /usr/bin/python3)
echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -8
/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || ngpu=0
[ "$ngpu" -ge 1 ] || ngpu=1
# libnccl.so.2 from the loader's path, else from the nvidia-nccl wheel.
if ! ldconfig -p | grep -q 'libnccl.so.2 '; then
  nccl=$("$py" -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  [ -n "$nccl" ] && export LD_LIBRARY_PATH="$nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ $prebuilt = 1 ]; then
  build=$(cd "$build" && pwd)
  export LD_LIBRARY_PATH="$build:$build/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== prebuilt ($build); LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
else
  echo "== build ($build)"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGFLOW_WITH_CUDA=ON \
    -DGFLOW_WITH_NCCL=ON -DGFLOW_BUILD_BENCH=ON -DGFLOW_BUILD_TOOLS=ON >/dev/null || exit 1
  cmake --build "$build" -j "$(nproc)" --target gflow_gpu_tests allreduce_bw nccl_allreduce_bw \
    gflowrun || exit 1
  build=$(cd "$build" && pwd)
fi
export GFLOW_CUDA_PLUGIN="$build/libgflow_cuda.so.0"
echo "== gflow_gpu_tests (kernels, staged collectives, NCCL, device reducer)"
timeout 300 "$build/tests/gflow_gpu_tests" --gtest_brief=1 || status=1
echo "== allreduce_bw --device cuda on NCCL: $ngpu process(es), one per GPU"
GFLOW_DEVICE_BACKEND=nccl timeout 300 "$build/tools/gflowrun" -n "$ngpu" -- \
  "$build/bench/allreduce_bw" --device cuda -b 8 -e 256M -f 4 -w 5 -n 20 -c 1 || status=1
echo "== gflow on NCCL against NCCL itself: 3 interleaved rounds, $ngpu process(es)"
for round in 1 2 3; do
  for who in gflow gflow-nocheck nccl; do
    case $who in
      gflow) env=(GFLOW_DEVICE_BACKEND=nccl) bin=allreduce_bw flags=(--device cuda) ;;
      gflow-nocheck) env=(GFLOW_DEVICE_BACKEND=nccl GFLOW_NCCL_VERIFY=0) bin=allreduce_bw flags=(--device cuda) ;;
      nccl) env=() bin=compare/nccl_allreduce_bw flags=() ;;
    esac
    echo "-- round $round: $who"
    env "${env[@]}" timeout 120 "$build/tools/gflowrun" -n "$ngpu" -- \
      "$build/bench/$bin" "${flags[@]}" -b 8 -e 256M -f 16 -w 10 -n 50 -c 0 || status=1
  done
done
echo "== allreduce_bw --device cuda staged over TCP: 2 processes sharing GPU 0"
CUDA_VISIBLE_DEVICES=0 GFLOW_DEVICE_BACKEND=staged GFLOW_SHM=0 timeout 300 "$build/tools/gflowrun" -n 2 -- \
  "$build/bench/allreduce_bw" --device cuda -b 8 -e 64M -f 8 -w 2 -n 5 -c 1 || status=1
echo "== python ($py): torch CUDA tensors (gflow API, torch backend, DDP), 2 processes"
if ! cuda_torch "$py"; then
  echo "SKIP: $py's torch has no CUDA"
elif [ $prebuilt = 0 ]; then
  cmake -S . -B "$build" -DGFLOW_BUILD_PYTHON=ON -DPython_EXECUTABLE="$py" >/dev/null && \
    cmake --build "$build" -j "$(nproc)" --target _gflow _gflow_torch || status=1
  PYTHONPATH="$build/python" timeout 300 "$build/tools/gflowrun" -n 2 -- \
    "$py" tests/gpu/torch_cuda_check.py || status=1
else
  # The _gflow extension against this python's pybind11 and prebuilt libgflow.
  pkg=$(mktemp -d)/gflow && mkdir -p "$pkg" && ln -s "$PWD"/python/gflow/*.py "$pkg/"
  ext=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  read -r -a pyinc <<<"$("$py" -m pybind11 --includes)"
  flags=(-O2 -std=c++17 -fPIC -fvisibility=hidden "${pyinc[@]}" -Iinclude -I"$build/include" -Isrc)
  for f in python/src/*.cc; do c++ "${flags[@]}" -c "$f" -o "$pkg/$(basename "$f").o" & done
  wait
  if c++ -shared -o "$pkg/_gflow$ext" "$pkg"/*.o "$build/libgflow.so.0" -Wl,-rpath,"$build"; then
    PYTHONPATH="$(dirname "$pkg")" timeout 300 "$build/tools/gflowrun" -n 2 -- \
      "$py" tests/gpu/torch_cuda_check.py || status=1
  else
    echo "FAIL: the _gflow extension did not build"; status=1
  fi
fi
echo "== done in $(( $(date +%s) - start )) s, status $status"
exit $status
