#!/usr/bin/env bash
# Setup and a small allreduce sweep from 2 to 512 processes on this machine,
# one table row per world size from allreduce_bw's "# setup" line (maxima
# over the ranks, docs/scale.md) and the run's wall time.
#
#   bench/scale/setup_sweep.sh [-N "2 4 8 16 32 64 128 256 512"] [-s 0|1]
#                              [-r ROUNDS] [-b BUILD] [-l NOFILE]
#
#   -N      world sizes (default as above)
#   -s      GFLOW_SHM for the ranks (default 0: loopback TCP, every rank a
#           "host" of its own as far as the transport goes)
#   -r      rounds per world size (default 1; the table shows each)
#   -b      build directory with tools/gflowrun and bench/allreduce_bw
#           (default: build/ next to this script's repository)
#   -l      soft open-file limit to run under (default 1024: gflow raises it
#           to the hard limit itself)
#   -i      repeat the run this many times per round and count failures
#           (default 1; e.g. -N 128 -i 100 for 100 consecutive inits)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sizes="2 4 8 16 32 64 128 256 512" shm=0 rounds=1 build="$here/../../build" nofile=1024 repeat=1
while getopts "N:s:r:b:l:i:" opt; do
  case $opt in
    N) sizes=$OPTARG ;; s) shm=$OPTARG ;; r) rounds=$OPTARG ;; b) build=$OPTARG ;;
    l) nofile=$OPTARG ;; i) repeat=$OPTARG ;; *) sed -n '2,20p' "$0" >&2; exit 2 ;;
  esac
done
run="$build/tools/gflowrun"
bench="$build/bench/allreduce_bw"
[ -x "$run" ] && [ -x "$bench" ] || { echo "setup_sweep.sh: build $build first" >&2; exit 2; }
echo "| N | round | wall_s | failures | setup (rank 0's line) |"
echo "|---|---|---|---|---|"
for n in $sizes; do
  for r in $(seq 1 "$rounds"); do
    fails=0 line="" begin=$(date +%s.%N)
    for _ in $(seq 1 "$repeat"); do
      out=$( (ulimit -Sn "$nofile"; GFLOW_SHM=$shm timeout 900 "$run" -n "$n" "$bench" -b 4K -e 4K \
        -n 3 -w 1) 2>&1) || fails=$((fails + 1))
      line=$(echo "$out" | sed -n 's/^\[0\] # setup //p' | tail -1)
    done
    end=$(date +%s.%N)
    wall=$(awk -v a="$begin" -v b="$end" -v k="$repeat" 'BEGIN { printf "%.1f", (b - a) / k }')
    echo "| $n | $r | $wall | $fails/$repeat | $line |"
  done
done
