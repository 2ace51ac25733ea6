#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Faults across hosts, on 2 hosts x 2 ranks running back-to-back 16 MiB
# allreduces. Once they are under way:
#   kill       rank 3 (host 1, local rank 1) gets SIGKILL. Every other rank
#              must exit nonzero by itself with a gflow peer_lost error, sooner
#              than GFLOW_TIMEOUT (20 s), instead of hanging.
#   partition  host 1's cable is pulled (its switch port goes down; nothing is
#              reset, packets just vanish). Every rank, on both sides, must exit
#              nonzero with a gflow timeout or peer_lost error within
#              GFLOW_TIMEOUT (10 s) + the liveness probe (3 x 2 s) + 5 s.
# Scenarios (NN_FAULT_CASES, default "kill:auto kill:ring partition:auto"):
# auto is hierarchical on this layout once the library has it.
#
#   tests/netns/test_fault.sh [path/to/allreduce_bw]
#
# Exit: 0 pass, 1 fail, 77 skip.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

bench=$(nn_find_bench "${1:-}") || { echo "FAIL: allreduce_bw not found (pass its path)"; exit 1; }
nn_begin_test
nn_setup 2 || { echo "FAIL: namespace setup"; exit 1; }
map=0,0,1,1
world=4

alive() {  # pid: running (not gone, not a zombie)
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

fails=0
run_case() {  # kind algo
  local kind=$1 algo=$2 name="$1-$2" gt limit victim=-1 expect out i r started bad=0
  if [ "$kind" = kill ]; then
    gt=20 victim=3 expect="peer_lost"
    limit=$gt
  else
    gt=10 expect="timeout|peer_lost"
    limit=$((gt + 6 + 5))
  fi
  out="$NN_TMP/$name"
  NN_ENV=(GFLOW_DEBUG=INFO "GFLOW_TIMEOUT=${gt}s")
  # The wrappers' own kill comes far beyond what a pass needs.
  if ! nn_start_ranks "$out" $((limit * 3 + 30)) "$map" -- "$bench" -a "$algo" -b 16M -e 16M \
    -n 1000000 -w 0 -c 0 -m 0; then
    echo "FAIL $name: could not start ranks"
    fails=$((fails + 1))
    return
  fi
  local pid=() t_end=()
  for ((r = 0; r < world; r++)); do pid[r]=$(nn_rank_pid "$r"); done
  # Under way: rank 0 printed the report header (the communicator exists),
  # then a moment of back-to-back allreduces.
  started=0
  for ((i = 0; i < 300; i++)); do
    if grep -q "allreduce_bw: world size" "$out/rank0.out" 2>/dev/null; then
      started=1
      break
    fi
    sleep 0.1
  done
  if [ "$started" != 1 ]; then
    echo "FAIL $name: the ranks never got going (outputs in $out)"
    nn_kill_ranks
    fails=$((fails + 1))
    return
  fi
  sleep 1.5
  for ((r = 0; r < world; r++)); do
    if ! alive "${pid[$r]}"; then
      echo "FAIL $name: rank $r exited before the fault (outputs in $out)"
      bad=1
    fi
  done
  local t0 now left took rc err why
  if [ "$kind" = kill ]; then
    kill -9 "${pid[$victim]}"
  else
    ip -n "$(nn_switch_ns)" link set p1 down
  fi
  t0=$(date +%s.%N)
  # Poll until every other rank is gone (or well past the limit).
  while :; do
    left=0
    now=$(date +%s.%N)
    for ((r = 0; r < world; r++)); do
      [ "$r" = "$victim" ] && continue
      [ -n "${t_end[$r]:-}" ] && continue
      if alive "${pid[$r]}"; then left=1; else t_end[r]=$now; fi
    done
    [ "$left" = 0 ] && break
    awk -v a="$now" -v b="$t0" -v l="$limit" 'BEGIN {exit !(a - b > l + 10)}' && break
    sleep 0.05
  done
  nn_kill_ranks
  [ "$kind" = partition ] && ip -n "$(nn_switch_ns)" link set p1 up
  for ((r = 0; r < world; r++)); do
    [ "$r" = "$victim" ] && continue
    rc=$(cat "$out/rank$r.rc" 2>/dev/null || echo "?")
    if [ -n "${t_end[$r]:-}" ]; then
      took=$(awk -v a="${t_end[$r]}" -v b="$t0" 'BEGIN {printf "%.2f", a - b}')
    else
      took=never
    fi
    err=$(grep -m1 "^allreduce_bw: gflow" "$out/rank$r.err" || grep -m1 "gflow [a-z_]*:" "$out/rank$r.err")
    err=${err#allreduce_bw: }
    why=""
    if [ "$took" = never ] || [ "$rc" = 124 ] || [ "$rc" = 137 ] || [ "$rc" = 143 ]; then
      why="hung (stopped by the test after $((limit + 10)) s)"
    elif [ "$rc" = 0 ]; then
      why="exited 0"
    elif awk -v t="$took" -v l="$limit" 'BEGIN {exit !(t >= l)}'; then
      why="took $took s, limit $limit s"
    elif ! grep -Eq "gflow ($expect):" "$out/rank$r.err"; then
      why="no '$expect' error"
    fi
    if [ -n "$why" ]; then
      echo "FAIL $name: rank $r (host ${NN_RANK_HOST[$r]}): $why; status $rc; ${err:-no gflow error printed}"
      bad=1
    else
      echo "ok   $name: rank $r (host ${NN_RANK_HOST[$r]}) exited $rc after $took s: $err"
    fi
  done
  if [ "$bad" != 0 ]; then
    echo "     outputs in $out"
    fails=$((fails + 1))
  fi
}

cases=${NN_FAULT_CASES:-kill:auto kill:ring partition:auto}
for c in $cases; do
  run_case "${c%%:*}" "${c#*:}"
done

if [ "$fails" -ne 0 ]; then
  echo "FAIL: $fails scenario(s) did not fail cleanly"
  exit 1
fi
echo "PASS: every rank raised the expected error in time ($cases)"
