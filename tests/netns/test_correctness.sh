#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Multi-host correctness: allreduce_bw (which checks every element against the
# exact expected value) on ranks spread over network-namespace hosts.
#
#   tests/netns/test_correctness.sh [path/to/allreduce_bw]
#
# Layouts (ranks per host): 2,2 / 2,2,2 / 2,1 (unequal) / 0,1,0,1 (interleaved
# rank->host map). Per layout, with the default algorithm choice:
#   - float32 sum, 4 B .. 4 MiB x4 (1 .. 1Mi elements),
#   - float32 sum at odd element counts 7, 49, ..., 7^7 (-b 28 -f 7),
#   - every dtype x op at 3 B, 300 B, 30 kB, 3 MB (odd counts for uint8),
# then the first and last again with every algorithm in NN_FORCE_ALGOS
# (default "hier") on the equal and interleaved layouts, and every dtype x op
# on 2x2 with GFLOW_SHM=0 (ranks of a host joined by TCP, not shared memory).
# Exit: 0 pass, 1 fail, 77 skip (not root, no ip, no namespaces).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

bench=$(nn_find_bench "${1:-}") || { echo "FAIL: allreduce_bw not found (pass its path)"; exit 1; }
nn_begin_test
force_algos=${NN_FORCE_ALGOS-hier}
tmo=${NN_RUN_TIMEOUT:-180}

nn_setup 3 || { echo "FAIL: namespace setup"; exit 1; }
NN_ENV=(GFLOW_DEBUG=INFO)
nn_default_timeout 30s

fails=0 runs=0
known_algos=""
for algo in $force_algos; do
  if nn_algo_known "$bench" "$algo"; then
    known_algos+=" $algo"
  else
    echo "FAIL: the library rejects -a $algo (unknown allreduce algorithm); its runs are left out"
    fails=$((fails + 1))
  fi
done
run_case() {  # name map args...
  local name=$1 map=$2 out rows algos t0
  shift 2
  out="$NN_TMP/$name"
  runs=$((runs + 1))
  t0=$SECONDS
  if nn_run_ranks "$out" "$tmo" "$map" -- "$bench" "$@" && rows=$(nn_check_bench "$out"); then
    algos=$(nn_allreduce_algos "$out" 0 | cut -d: -f2 | sort -u | tr '\n' ' ')
    echo "ok   $name: map $map, $rows rows, #wrong 0, $((SECONDS - t0)) s" \
      "(allreduce algorithms rank 0 logged: ${algos% })"
  else
    echo "FAIL $name: map $map, $((SECONDS - t0)) s: $bench $* (outputs in $out)"
    fails=$((fails + 1))
  fi
}

layouts=("2x2:$(nn_layout_map 2,2)" "3x2:$(nn_layout_map 2,2,2)"
  "2+1:$(nn_layout_map 2,1)" "interleaved:0,1,0,1")
for entry in "${layouts[@]}"; do
  lname=${entry%%:*} map=${entry#*:}
  run_case "$lname-pow4" "$map" -b 4 -e 4M -f 4 -n 2 -w 1
  run_case "$lname-odd" "$map" -b 28 -e 4M -f 7 -n 2 -w 1
  run_case "$lname-alltypes" "$map" -d all -o all -b 3 -e 3000000 -f 100 -n 1 -w 0
  [ "$lname" = "2+1" ] && continue
  for algo in $known_algos; do
    run_case "$lname-$algo-pow4" "$map" -a "$algo" -b 4 -e 4M -f 4 -n 2 -w 1
    run_case "$lname-$algo-alltypes" "$map" -a "$algo" -d all -o all -b 3 -e 3000000 -f 100 -n 1 -w 0
  done
done
# The same on 2x2 with the ranks of a host joined by TCP instead of shared memory.
saved_env=("${NN_ENV[@]}")
NN_ENV+=(GFLOW_SHM=0)
run_case "2x2-noshm-alltypes" "$(nn_layout_map 2,2)" -d all -o all -b 3 -e 3000000 -f 100 -n 1 -w 0
NN_ENV=("${saved_env[@]}")

if [ "$fails" -ne 0 ]; then
  echo "FAIL: $fails failure(s) in $runs runs"
  exit 1
fi
echo "PASS: $runs runs, every result exact"
