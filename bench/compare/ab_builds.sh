#!/usr/bin/env bash
# ab_builds.sh: two builds of gflow (e.g. before and after a change) side by
# side by the interleaved method: each round runs the same allreduce_bw sweep
# with build A, then with build B, for every configuration; the table shows,
# per size and configuration, the median over rounds of B's bus bandwidth
# divided by A's (in-place). A ratio above 1 means B is faster.
#
#   bench/compare/ab_builds.sh BUILD_A BUILD_B [rounds]
#
# A build is a build directory, or a copy of its tools/gflowrun,
# bench/allreduce_bw and libgflow*.so* (the libraries are taken from the
# build's own directory, whatever its run path says).
#
# Environment (defaults in brackets): NPS world sizes ["2 4"], MINB/MAXB
# [4K/64M], FACTOR [4], ITERS [20], WARMUP [5], PATHS ["tcp shm"] (tcp:
# GFLOW_SHM=0, shm: the default one-host path).
set -euo pipefail
A=${1:?build A}
B=${2:?build B}
ROUNDS=${3:-5}
NPS=${NPS:-"2 4"}
MINB=${MINB:-4K}
MAXB=${MAXB:-64M}
FACTOR=${FACTOR:-4}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
PATHS=${PATHS:-"tcp shm"}
work=$(mktemp -d)

run() {  # build path n round
  local shm=1
  [ "$2" = tcp ] && shm=0
  GFLOW_SHM=$shm LD_LIBRARY_PATH="$1" timeout 600 "$1/tools/gflowrun" -n "$3" -- "$1/bench/allreduce_bw" -b "$MINB" \
    -e "$MAXB" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -c 0 --csv 2>&1 |
    sed -n 's/^\[0\] gflow,/gflow,/p' >"$work/$5-$2-$3-$4.csv"
}

for r in $(seq 1 "$ROUNDS"); do
  for p in $PATHS; do
    for n in $NPS; do
      run "$A" "$p" "$n" "$r" A
      run "$B" "$p" "$n" "$r" B
    done
  done
done

python3 - "$work" "$ROUNDS" "$PATHS" "$NPS" <<'PY'
import csv, statistics, sys
work, rounds, paths, nps = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
def busbw(f):
    out = {}
    for row in csv.reader(open(f)):
        out[int(row[3])] = float(row[13])  # ip_busbw (GB/s)
    return out
cols = [(p, n) for p in paths for n in nps]
sizes = None
ratio = {}
for p, n in cols:
    per = []
    for r in range(1, rounds + 1):
        a, b = busbw(f"{work}/A-{p}-{n}-{r}.csv"), busbw(f"{work}/B-{p}-{n}-{r}.csv")
        per.append({s: b[s] / a[s] for s in a if s in b and a[s] > 0})
    sizes = sorted(per[0])
    for s in sizes:
        ratio[(p, n, s)] = statistics.median(x[s] for x in per if s in x)
def fmt(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
print("| size | " + " | ".join(f"{p} n={n}" for p, n in cols) + " |")
print("|---" * (len(cols) + 1) + "|")
for s in sizes:
    print(f"| {fmt(s)} | " + " | ".join(f"{ratio[(p, n, s)]:.3f}" for p, n in cols) + " |")
print(f"\n{rounds} rounds, median of per-round ratios (B/A, in-place bus bandwidth); raw CSV in {work}")
PY
