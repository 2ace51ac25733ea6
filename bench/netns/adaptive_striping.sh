#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Adaptive striping: two TCP flows of very different speed between two hosts.
#
# Builds two network-namespace hosts (tests/netns/lib.sh) with one rank each
# and GFLOW_SOCKETS_PER_PEER=2. Each host's veth0 egress gets an htb qdisc
# with two classes: FAST (the default) and SLOW. Once the ranks have
# connected, a u32 filter on one data connection's port (found with `ss`)
# moves that flow, in both directions, into the SLOW class; the other stays
# in FAST. Each leaf queue holds 20 ms at its rate (bfifo), as a tbf with
# latency 20ms would. Then allreduce_bw runs, alternately:
#
#   adaptive   GFLOW_STRIPE_CHUNK default: sockets take units as they drain
#   equal      GFLOW_STRIPE_CHUNK=0: equal shares assigned up front (the
#              behaviour before adaptive striping)
#   one        reference: one socket per peer on a single class of FAST + SLOW
#              (what one link of the summed capacity gives this algorithm)
#
# and the script prints, per mode, the median in-place busbw, its ratio to the
# sum of the two caps (2 ranks: busbw = algbw, every byte of the op crosses
# the link once each way), and the bytes the slow and the fast class carried
# after the filter was in place (tc class counters; both hosts' egress).
#
#   bench/netns/adaptive_striping.sh [options]
#
#   -F RATE     fast flow cap, tc syntax (default 400mbit)
#   -S RATE     slow flow cap (default 100mbit)
#   -b SIZE     message size, allreduce_bw -b = -e (default 64M)
#   -n ITERS    timed iterations (default 3)
#   -w ITERS    warm-up iterations (default 1)
#   -a ALGO     allreduce algorithm (default: gflow's choice)
#   -M "MODES"  modes in run order (default "equal adaptive")
#   -R N        rounds, modes alternating; medians over rounds (default 1)
#   -x PATH     allreduce_bw (default: build/, build-release/, build-netns/)
#   -X PATH     allreduce_bw for "equal" instead (e.g. a main build, run with
#               its default GFLOW_STRIPE_CHUNK)
#   -T RATIO    exit 1 unless adaptive busbw >= RATIO x (FAST + SLOW)
#   -C RATIO    exit 1 unless, in every adaptive run, fast bytes >= RATIO x
#               slow bytes (the slow flow carried fewer bytes; no timing)
#   -t SECONDS  limit per run (default 300)
#   -o DIR      keep rank outputs in DIR
#   -E VAR=VAL  extra environment for every rank (repeatable)
#
# Exit: 0 when every run succeeded with exact results (and met -T/-C), 1
# otherwise, 77 when namespaces cannot be created.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../tests/netns/lib.sh
source "$here/../../tests/netns/lib.sh"

usage() {
  sed -n '3,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit "${1:-2}"
}

fast=400mbit slow=100mbit size=64M iters=3 warm=1 algo="" modes="equal adaptive" reps=1
benchpath="" equalbench="" target="" splitratio="" tmo=300 keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    -F) fast=$2; shift 2 ;;
    -S) slow=$2; shift 2 ;;
    -b) size=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    -w) warm=$2; shift 2 ;;
    -a) algo=$2; shift 2 ;;
    -M) modes=$2; shift 2 ;;
    -R) reps=$2; shift 2 ;;
    -x) benchpath=$2; shift 2 ;;
    -X) equalbench=$2; shift 2 ;;
    -T) target=$2; shift 2 ;;
    -C) splitratio=$2; shift 2 ;;
    -t) tmo=$2; shift 2 ;;
    -o) keep=$2; shift 2 ;;
    -E) NN_ENV+=("$2"); shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "adaptive_striping.sh: unknown option $1" >&2; usage 2 ;;
  esac
done
bench=$(nn_find_bench "$benchpath") || { echo "allreduce_bw not found (use -x)" >&2; exit 1; }
NN_RATE_NEEDED=1
nn_require
if [ -n "$keep" ]; then
  mkdir -p "$keep" && NN_TMP=$(cd "$keep" && pwd)
else
  NN_TMP=$(mktemp -d "${TMPDIR:-/tmp}/gflow-adaptive-striping.XXXXXX")
fi
trap 'nn_teardown; [ -n "$keep" ] || rm -rf "$NN_TMP"' EXIT
trap 'exit 1' INT TERM HUP

# Data listeners in a range of their own, so `ss` tells data connections
# from the store's.
ports_lo=29900 ports_hi=29999
NN_ENV+=("GFLOW_SOCKETS_PER_PEER=2" "GFLOW_PORT_RANGE=$ports_lo-$ports_hi")
NN_PIN_HOSTS=1
nn_setup 2 || { echo "namespace setup failed" >&2; exit 1; }

fastb=$(nn_rate_bytes "$fast") slowb=$(nn_rate_bytes "$slow")
[ "$fastb" != bad ] && [ "$slowb" != bad ] || { echo "bad rate" >&2; exit 2; }
sumrate="$(((fastb + slowb) * 8))bit"
caps_gbs=$(awk -v f="$fastb" -v s="$slowb" 'BEGIN { printf "%.4f", (f + s) / 1e9 }')

# htb on both hosts' egress: 1:10 FAST (default), 1:20 SLOW, each leaf a
# bfifo of 20 ms at its rate (at least 128 KiB: two GSO super-packets).
shape_host() {
  local ns=$1 q b
  ip netns exec "$ns" tc qdisc replace dev "$NN_IFNAME" root handle 1: htb default 10 || return 1
  for q in "10 $fast $fastb" "20 $slow $slowb"; do
    set -- $q
    b=$(($3 / ${NN_QUEUE_DIV:-50}))
    [ "$b" -ge 131072 ] || b=131072
    ip netns exec "$ns" tc class add dev "$NN_IFNAME" parent 1: classid "1:$1" htb \
      rate "$2" ceil "$2" burst 64k cburst 64k quantum 65536 || return 1
    ip netns exec "$ns" tc qdisc add dev "$NN_IFNAME" parent "1:$1" handle "$1:" bfifo \
      limit "$b" || return 1
  done
}
for h in 0 1; do shape_host "$(nn_host_ns "$h")" || { echo "tc setup failed" >&2; exit 1; }; done

# Source ports (on host 1, which dials host 0) of the established data
# connections, one per line, ascending.
data_ports() {
  ip netns exec "$(nn_host_ns 1)" ss -Htn state established \
    "( dport >= :$ports_lo and dport <= :$ports_hi )" |
    awk '{ n = split($3, a, ":"); print a[n] }' | sort -n
}
# Bytes sent so far by class 1:$1, summed over both hosts' egress.
class_bytes() {
  local h sum=0 b
  for h in 0 1; do
    b=$(ip netns exec "$(nn_host_ns "$h")" tc -s class show dev "$NN_IFNAME" classid "1:$1" |
      awk '/Sent/ { print $2; exit }')
    sum=$((sum + ${b:-0}))
  done
  echo "$sum"
}
# Moves the flow with host-1 port $1 into the slow class, both directions.
slow_filter() {
  ip netns exec "$(nn_host_ns 1)" tc filter replace dev "$NN_IFNAME" parent 1: protocol ip \
    prio 1 u32 match ip sport "$1" 0xffff flowid 1:20 &&
    ip netns exec "$(nn_host_ns 0)" tc filter replace dev "$NN_IFNAME" parent 1: protocol ip \
      prio 1 u32 match ip dport "$1" 0xffff flowid 1:20
}
# Sets the FAST class's rate (the "one" reference runs on FAST + SLOW).
fast_class() {
  local h
  for h in 0 1; do
    ip netns exec "$(nn_host_ns "$h")" tc class change dev "$NN_IFNAME" parent 1: classid 1:10 \
      htb rate "$1" ceil "$1" burst 64k cburst 64k quantum 65536 || return 1
  done
}
clear_filters() {
  local h
  for h in 0 1; do
    ip netns exec "$(nn_host_ns "$h")" tc filter del dev "$NN_IFNAME" parent 1: prio 1 2>/dev/null
  done
  return 0
}

echo "# adaptive_striping: 2 hosts x 1 rank, GFLOW_SOCKETS_PER_PEER=2, flows capped at" \
  "$fast and $slow (htb + u32 on one connection's port), sum $caps_gbs GB/s, $(uname -r)"
echo "# command: allreduce_bw -b $size -e $size -n $iters -w $warm ${algo:+-a $algo }--csv"

rows=()   # mode|busbw|slow bytes|fast bytes
failed=0
for ((rep = 1; rep <= reps; rep++)); do
  for mode in $modes; do
    out="$NN_TMP/$mode-$rep"
    prog=$bench
    extra=()
    case "$mode" in
      adaptive) ;;
      one) extra=(GFLOW_SOCKETS_PER_PEER=1) ;;
      equal) if [ -n "$equalbench" ]; then prog=$equalbench; else extra=(GFLOW_STRIPE_CHUNK=0); fi ;;
      *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    clear_filters
    if [ "$mode" = one ]; then fast_class "$sumrate"; else fast_class "$fast"; fi
    saved=("${NN_ENV[@]}")
    NN_ENV+=("${extra[@]}")
    nn_start_ranks "$out" "$tmo" "0,1" -- "$prog" -b "$size" -e "$size" -n "$iters" \
      -w "$warm" ${algo:+-a "$algo"} --csv
    NN_ENV=("${saved[@]}")
    # Shape one flow as soon as both data connections exist (the warm-up
    # iterations run while this happens).
    ports=""
    for ((i = 0; i < 200; i++)); do
      [ "$mode" = one ] && break
      ports=$(data_ports)
      [ "$(echo "$ports" | grep -c .)" -ge 2 ] && break
      sleep 0.05
    done
    if [ "$mode" = one ]; then
      :
    elif [ "$(echo "$ports" | grep -c .)" -lt 2 ]; then
      echo "# $mode round $rep: data connections not found (ss saw: $ports)" >&2
      nn_kill_ranks
      failed=1
      continue
    fi
    if [ "$mode" != one ] && ! slow_filter "$(echo "$ports" | head -n1)"; then
      nn_kill_ranks
      failed=1
      continue
    fi
    s0=$(class_bytes 20) f0=$(class_bytes 10)
    if ! nn_wait_ranks; then
      failed=1
      continue
    fi
    sb=$(($(class_bytes 20) - s0)) fb=$(($(class_bytes 10) - f0))
    # CSV: library,algorithm,world_size,size,count,type,redop,
    #      oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,ip_algbw,ip_busbw,ip_wrong
    while IFS=, read -r _ _ _ sz _ _ _ _ _ _ ow _ _ ib iw; do
      [[ $sz =~ ^[0-9]+$ ]] || continue
      if [ "$((${ow:-0} + ${iw:-0}))" != 0 ]; then
        echo "# $mode round $rep: wrong results" >&2
        failed=1
      fi
      rows+=("$mode|$ib|$sb|$fb")
      echo "# $mode round $rep: busbw $ib GB/s, slow class $sb bytes, fast class $fb bytes"
    done <"$out/rank0.out"
  done
done

echo
echo "| mode | rounds | busbw (GB/s), median | range | vs sum of caps ($caps_gbs GB/s) |" \
  "slow flow bytes | fast flow bytes | slow share |"
echo "|---|---|---|---|---|---|---|---|"
missed=()
for mode in $modes; do
  line=$(printf '%s\n' "${rows[@]}" | awk -F'|' -v m="$mode" -v caps="$caps_gbs" '
    function med(list,   n, a, i, j, t) {
      n = split(list, a, " ")
      for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    $1 == m { n++; b = b " " $2; s = s " " $3; f = f " " $4
      if (lo == "" || $2 + 0 < lo) lo = $2 + 0; if ($2 + 0 > hi) hi = $2 + 0 }
    END { if (!n) exit
      mb = med(b); ms = med(s); mf = med(f)
      share = (ms + mf > 0) ? ms / (ms + mf) : 0
      printf "%s|%d|%.4f|%.4f-%.4f|%.2fx|%.0f|%.0f|%.2f\n", m, n, mb, lo, hi, mb / caps, ms, mf, share }')
  [ -n "$line" ] || { echo "| $mode | 0 | failed | | | | | |"; continue; }
  IFS='|' read -r _ n mb range ratio ms mf share <<<"$line"
  echo "| $mode | $n | $mb | $range | $ratio | $ms | $mf | $share |"
  if [ "$mode" = adaptive ] && [ -n "$target" ] &&
    ! awk -v r="${ratio%x}" -v t="$target" 'BEGIN { exit !(r + 0 >= t + 0) }'; then
    missed+=("adaptive busbw ${ratio} of the caps < ${target}x")
  fi
done
if [ -n "$splitratio" ]; then
  for row in "${rows[@]}"; do
    IFS='|' read -r mode _ sb fb <<<"$row"
    [ "$mode" = adaptive ] || continue
    if ! awk -v s="$sb" -v f="$fb" -v r="$splitratio" 'BEGIN { exit !(f >= r * s && f > 0) }'; then
      missed+=("adaptive run: fast flow $fb bytes < ${splitratio} x slow flow $sb bytes")
    fi
  done
fi
echo
echo "busbw: in-place, allreduce_bw's (max over ranks of the mean of $iters iterations);" \
  "flow bytes: tc class counters of both hosts' egress (payload + headers) after the filter."
if [ "${#missed[@]}" -gt 0 ]; then
  (IFS=";"; echo "targets MISSED: ${missed[*]}")
  failed=1
elif [ -n "$target$splitratio" ]; then
  echo "targets met${target:+ (adaptive >= ${target}x the caps)}${splitratio:+ (fast >= ${splitratio}x slow bytes)}"
fi
exit $failed
