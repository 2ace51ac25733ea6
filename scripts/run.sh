#!/usr/bin/env bash
# The main job on a fresh Debian machine: installs dependencies, builds gflow
# (Release) and runs a 4-rank allreduce_bw sweep on this machine.
# Extra arguments go to allreduce_bw (e.g. -b 4K -e 256M -d float16).
# Environment: NP (ranks, default 4).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release -DGFLOW_BUILD_TESTS=OFF >/dev/null
cmake --build build-release -j "$(nproc)"
np=${NP:-4}
if [ $# -eq 0 ]; then set -- -b 8 -e 64M -f 4 -n 20 -w 5; fi
exec build-release/tools/gflowrun -n "$np" -- build-release/bench/allreduce_bw "$@"
