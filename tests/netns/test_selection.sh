#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Algorithm selection across hosts: with GFLOW_DEBUG=INFO every rank logs
#   rank R: allreduce #N (67108864 bytes xW ranks): path P, algorithm A
# for a 64 MiB float32 allreduce under the default choice (auto); X below is
# P, or A on the network path (nn_allreduce_algos). Expected X:
#   0,0,1,1 / 0,0,1,1,2,2 / 0,1,0,1 (>1 host, >1 rank per host): hierarchical
#   0,0,1 (unequal hosts): hierarchical, or a flat algorithm (ring/rd) when
#       some logged line says why it fell back (contains "fall")
#   0,1,2,3 (1 rank per host) and 0,0,0,0 (1 host): not hierarchical
#
#   tests/netns/test_selection.sh [path/to/allreduce_bw]
#
# Exit: 0 pass, 1 fail, 77 skip.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

bench=$(nn_find_bench "${1:-}") || { echo "FAIL: allreduce_bw not found (pass its path)"; exit 1; }
nn_begin_test
nn_setup 4 || { echo "FAIL: namespace setup"; exit 1; }
NN_ENV=(GFLOW_DEBUG=INFO)
nn_default_timeout 30s
bytes=$((64 << 20))

# Algorithm rank R used for the 64 MiB allreduce: its own line, else (the
# choice did not change, so nothing was logged) the one allreduce logged
# before it, at communicator creation.
algo_of() {
  local out=$1 r=$2 a
  a=$(nn_allreduce_algos "$out" "$r" | awk -F: -v b="$bytes" '$1 == b {print $2; exit}')
  [ -n "$a" ] || a=$(nn_allreduce_algos "$out" "$r" | head -n1 | cut -d: -f2)
  echo "$a"
}

fails=0
check() {  # map expectation(hier|not-hier|hier-or-fallback)
  local map=$1 want=$2 out="$NN_TMP/sel-${1//,/_}" world r a algos=() fall="" notes ok=1 summary
  if ! nn_run_ranks "$out" 120 "$map" -- "$bench" -b 64M -e 64M -n 1 -w 0 -c 0 -m 0; then
    echo "FAIL map $map: the run failed (outputs in $out)"
    fails=$((fails + 1))
    return
  fi
  world=$(tr , '\n' <<<"$map" | wc -l)
  for ((r = 0; r < world; r++)); do
    a=$(algo_of "$out" "$r")
    algos+=("${a:-?}")
  done
  summary=$(printf '%s\n' "${algos[@]}" | sort | uniq -c | awk '{printf "%s%s x%s", s, $2, $1; s=", "}')
  fall=$(cat "$out"/rank*.err | grep -i "fall" | sed 's/^gflow [A-Z]* *\[pid [0-9]*\] //' | sort -u | head -n 3)
  # What rank 0 said about the layout (e.g. unequal hosts), for the record.
  notes=$(grep -iE "hierarch|fall" "$out/rank0.err" | grep -v ": path " |
    sed 's/^gflow [A-Z]* *\[pid [0-9]*\] //' | head -n 3)
  for a in "${algos[@]}"; do
    case "$want" in
      hier) [ "$a" = hierarchical ] || ok=0 ;;
      not-hier) [ "$a" != hierarchical ] && [ "$a" != "?" ] || ok=0 ;;
      hier-or-fallback)
        if [ "$a" != hierarchical ]; then
          { [ "$a" = ring ] || [ "$a" = rd ]; } && [ -n "$fall" ] || ok=0
        fi
        ;;
    esac
  done
  if [ "$ok" = 1 ]; then
    echo "ok   map $map: 64 MiB allreduce used $summary (expected $want)"
  else
    echo "FAIL map $map: 64 MiB allreduce used $summary (expected $want; outputs in $out)"
    fails=$((fails + 1))
  fi
  # shellcheck disable=SC2001 # prefix every line
  [ -z "$notes$fall" ] || printf '%s\n' "$notes" "$fall" | sort -u | sed '/^$/d; s/^/       logged: /'
}

check 0,0,1,1 hier
check 0,0,1,1,2,2 hier
check 0,1,0,1 hier
check 0,0,1 hier-or-fallback
check 0,1,2,3 not-hier
check 0,0,0,0 not-hier

if [ "$fails" -ne 0 ]; then
  echo "FAIL: $fails layout(s) chose an unexpected algorithm"
  exit 1
fi
echo "PASS: algorithm selection matches every layout"
