#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Host grouping: ranks in one network namespace (one GFLOW_HOST_ID) form one
# host. Checks each rank's GFLOW_DEBUG=INFO line
#   rank R/N ready (host h/H, local l/L, identity from ...)
# against the layout:
#   - H is the number of namespaces used; h in [0, H); ranks share h exactly
#     when they share a namespace (any numbering of hosts is accepted; whether
#     it follows the order of each host's lowest rank is printed);
#   - l is the rank's position among its host's ranks in rank order, L their count.
#
#   tests/netns/test_grouping.sh [path/to/allreduce_bw]
#
# Maps (host of each rank): 0,0,1,1  0,0,1,1,2,2  0,0,1  0,1,0,1  1,0,0,1  0,1,2,3
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

fails=0
missing_host=0
check_map() {
  local map=$1 out="$NN_TMP/map-${1//,/_}" hosts=() r h n world line
  local -A count=() index_of=() ns_of_index=()
  IFS=, read -r -a hosts <<<"$map"
  world=${#hosts[@]}
  if ! nn_run_ranks "$out" 120 "$map" -- "$bench" -b 4 -e 4 -n 1 -w 0; then
    echo "FAIL map $map: the run failed (outputs in $out)"
    fails=$((fails + 1))
    return
  fi
  local nhosts=0 order=()
  for ((r = 0; r < world; r++)); do
    h=${hosts[$r]}
    if [ -z "${count[$h]:-}" ]; then
      count[$h]=0
      nhosts=$((nhosts + 1))
      order+=("$h")
    fi
    count[$h]=$((count[$h] + 1))
  done
  local bad=0 local_bad=0 first_order=1 got_h got_H got_l got_L exp_l
  for ((r = 0; r < world; r++)); do
    h=${hosts[$r]}
    # Expected local rank: ranks before r on the same namespace.
    exp_l=0
    for ((n = 0; n < r; n++)); do [ "${hosts[$n]}" = "$h" ] && exp_l=$((exp_l + 1)); done
    line=$(grep -m1 "rank $r/$world ready (" "$out/rank$r.err")
    if [ -z "$line" ]; then
      echo "  rank $r: no 'rank $r/$world ready (...)' line (GFLOW_DEBUG=INFO)"
      bad=1 local_bad=1
      continue
    fi
    if [[ $line =~ ready\ \(host\ ([0-9]+)/([0-9]+),\ local\ ([0-9]+)/([0-9]+) ]]; then
      got_h=${BASH_REMATCH[1]} got_H=${BASH_REMATCH[2]}
      got_l=${BASH_REMATCH[3]} got_L=${BASH_REMATCH[4]}
    elif [[ $line =~ ready\ \(local\ ([0-9]+)/([0-9]+) ]]; then
      got_h="" got_H=""
      got_l=${BASH_REMATCH[1]} got_L=${BASH_REMATCH[2]}
      missing_host=1
      echo "  rank $r: the ready line has no 'host h/H' part: ${line#*communicator.cc:[0-9]* }"
      bad=1
    else
      echo "  rank $r: unrecognised ready line: $line"
      bad=1 local_bad=1
      continue
    fi
    if [ "$got_l" != "$exp_l" ] || [ "$got_L" != "${count[$h]}" ]; then
      echo "  rank $r (namespace h$h): local $got_l/$got_L, expected $exp_l/${count[$h]}"
      bad=1 local_bad=1
    fi
    [ -n "$got_h" ] || continue
    if [ "$got_H" != "$nhosts" ] || [ "$got_h" -ge "$nhosts" ]; then
      echo "  rank $r: host $got_h/$got_H, expected an index in [0, $nhosts) of $nhosts hosts"
      bad=1
    fi
    if [ -n "${index_of[$h]:-}" ] && [ "${index_of[$h]}" != "$got_h" ]; then
      echo "  rank $r: host index $got_h, but another rank of namespace h$h has ${index_of[$h]}"
      bad=1
    fi
    if [ -n "${ns_of_index[$got_h]:-}" ] && [ "${ns_of_index[$got_h]}" != "$h" ]; then
      echo "  rank $r: host index $got_h is also used by namespace h${ns_of_index[$got_h]}"
      bad=1
    fi
    index_of[$h]=$got_h
    ns_of_index[$got_h]=$h
  done
  if [ "$bad" = 0 ]; then
    for ((n = 0; n < ${#order[@]}; n++)); do
      [ "${index_of[${order[$n]}]:-}" = "$n" ] || first_order=0
    done
    local how="numbered in order of their lowest rank"
    [ "$first_order" = 1 ] || how="not numbered by lowest rank (accepted)"
    echo "ok   map $map: $nhosts hosts, local ranks/sizes right, hosts $how"
  else
    local lw=right
    [ "$local_bad" = 0 ] || lw=WRONG
    echo "FAIL map $map (local ranks/sizes $lw; outputs in $out)"
    fails=$((fails + 1))
  fi
}

for map in 0,0,1,1 0,0,1,1,2,2 0,0,1 0,1,0,1 1,0,0,1 0,1,2,3; do
  check_map "$map"
done

if [ "$fails" -ne 0 ]; then
  [ "$missing_host" = 1 ] &&
    echo "note: the ready lines lack 'host h/H' (a library feature this test requires)"
  echo "FAIL: $fails map(s) failed"
  exit 1
fi
echo "PASS: host grouping matches every layout"
