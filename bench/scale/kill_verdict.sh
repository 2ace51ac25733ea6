#!/usr/bin/env bash
# One rank killed in an N-process allreduce loop: does every survivor raise
# the same verdict (code, op, culprit)? Prints each distinct verdict (the
# code, culprit and op of fault_worker's GFLOW_ERROR line) with the number
# of ranks that raised it, so a consistent verdict is one line with N-1
# ranks (docs/errors.md, "One verdict"; docs/scale.md).
#
#   bench/scale/kill_verdict.sh [-n N] [-k RANK] [-b BYTES] [-c all|lazy|auto]
#                               [-s SIGNAL] [-t SECONDS] [-d BUILD]
#
#   -n  processes (default 128), started directly (not under gflowrun, which
#       ends the job at the first exit) over loopback TCP (GFLOW_SHM=0)
#   -k  the rank to kill (default 17)
#   -t  when, in seconds after the start (default 4; 0.5 stops it before
#       the others have connected to it)
#   -b  allreduce bytes (default 65536; float32 sum, verified)
#   -c  GFLOW_CONNECT (default auto: on demand above 64 ranks)
#   -s  the signal (default KILL; STOP leaves the rank stalled: the others
#       fail at GFLOW_TIMEOUT, 10 s here)
#   -d  build directory with tests/faults/fault_worker (default build/)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
n=128 victim=17 bytes=65536 connect=auto sig=KILL build="$here/../../build" at=4
while getopts "n:k:b:c:s:t:d:" opt; do
  case $opt in
    n) n=$OPTARG ;; k) victim=$OPTARG ;; b) bytes=$OPTARG ;; c) connect=$OPTARG ;;
    s) sig=$OPTARG ;; t) at=$OPTARG ;; d) build=$OPTARG ;; *) sed -n '2,22p' "$0" >&2; exit 2 ;;
  esac
done
worker="$build/tests/faults/fault_worker"
[ -x "$worker" ] || { echo "kill_verdict.sh: build $build (with tests) first" >&2; exit 2; }
out=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT
port=$((20000 + RANDOM % 20000))
pids=()
for r in $(seq 0 $((n - 1))); do
  GFLOW_SHM=0 GFLOW_CONNECT=$connect GFLOW_RANK=$r GFLOW_WORLD_SIZE=$n \
    GFLOW_ROOT=127.0.0.1:$port GFLOW_JOB_TOKEN=kill-verdict GFLOW_TIMEOUT=10s \
    "$worker" loop 0 "$bytes" 5 >"$out/$r.out" 2>&1 &
  pids+=($!)
done
sleep "$at"
kill -"$sig" "${pids[$victim]}"
for r in $(seq 0 $((n - 1))); do
  [ "$r" = "$victim" ] || wait "${pids[$r]}" || true
done
kill -9 "${pids[$victim]}" 2>/dev/null || true
sed -n 's/^GFLOW_ERROR code=\([a-z_]*\) rank=[0-9]* peer=\([-0-9]*\) op=\([a-z]*\) seq=\([0-9]*\).*/\1, culprit \2, \3 #\4/p' \
  "$out"/*.out | sort | uniq -c | sort -rn
