#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Hierarchical vs flat allreduce across shaped "hosts" on one machine.
#
# Builds H network-namespace hosts (tests/netns/lib.sh: a bridge in its own
# namespace, one veth per host) with L ranks each, shapes every host link to
# RATE in each direction (tc tbf, or htb with -q htb; traffic between ranks
# of one host is not shaped), runs allreduce_bw once per algorithm on the
# same topology, and prints a markdown table from rank 0's CSV report.
#
#   bench/netns/hier_vs_flat.sh [options]
#
#   -H N        hosts (default 2)
#   -L N        ranks per host (default 2)
#   -r RATE     per-host link rate, tc syntax (default 2gbit; 0 or none: unshaped)
#   -q QDISC    tbf (default) or htb
#   -b SIZE     smallest message (default 64M)
#   -e SIZE     largest message (default 64M)
#   -f FACTOR   size factor (default 2)
#   -n ITERS    timed iterations (default 5)
#   -w ITERS    warm-up iterations (default 2)
#   -d TYPE     data type (default float32)
#   -A "ALGOS"  algorithms, first is the baseline (default "ring hier")
#   -x PATH     allreduce_bw (default: build/, build-release/, build-netns/)
#   -R N        repetitions, algorithms alternating; the table shows medians (default 1)
#   -t SECONDS  limit per run (default 600)
#   -o DIR      keep rank outputs in DIR
#   -E VAR=VAL  extra environment for every rank (repeatable)
#   -P 0|1      pin each host's ranks to its own cpus (taskset; cpu i -> host
#               i mod H, hosts beyond the cpu count share round-robin), as real
#               hosts have their own cores (default 1). Unpinned (-P 0), every
#               "host" competes for every core, and ranks of one host that
#               busy-wait (shared memory) take cpu from the other hosts.
#   -T RATIO    target: exit 1 unless every other algorithm reaches RATIO x the
#               baseline's in-place busbw at every size (e.g. -T 1.35)
#
# Hosts x rate should stay below ~8 Gbit/s: veth + bridge on one machine tops
# out around 9-10 Gbit/s in aggregate, beyond which the numbers measure the
# machine, not the algorithm. The "link bound" column is the busbw each
# algorithm would reach if host links were the only limit: RATE for a ring
# over blocked ranks (each host link carries 2(N-1)/N of the data), and
# RATE x (N-1)/N x H/(H-1) for hierarchical (only 2(H-1)/H crosses hosts).
# Exit: 0 when every run succeeded with exact results (and met -T), 1
# otherwise, 77 when namespaces cannot be created. An algorithm the library
# does not accept is listed as n/a (a failure only with -T).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../tests/netns/lib.sh
source "$here/../../tests/netns/lib.sh"

usage() {
  sed -n '3,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit "${1:-2}"
}

H=2 L=2 rate=2gbit minb=64M maxb=64M factor=2 iters=5 warm=2 dtype=float32
algos="ring hier" benchpath="" tmo=600 keep="" reps=1 target="" pinhosts=1
while [ $# -gt 0 ]; do
  case "$1" in
    -H) H=$2; shift 2 ;;
    -L) L=$2; shift 2 ;;
    -r) rate=$2; shift 2 ;;
    -q) NN_QDISC=$2; shift 2 ;;
    -b) minb=$2; shift 2 ;;
    -e) maxb=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    -w) warm=$2; shift 2 ;;
    -d) dtype=$2; shift 2 ;;
    -A) algos=$2; shift 2 ;;
    -x) benchpath=$2; shift 2 ;;
    -t) tmo=$2; shift 2 ;;
    -R) reps=$2; shift 2 ;;
    -T) target=$2; shift 2 ;;
    -P) pinhosts=$2; shift 2 ;;
    -o) keep=$2; shift 2 ;;
    -E) NN_ENV+=("$2"); shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "hier_vs_flat.sh: unknown option $1" >&2; usage 2 ;;
  esac
done
case "$rate" in 0 | none | "") rate="" ;; esac
NN_PIN_HOSTS=${pinhosts:-1}
bench=$(nn_find_bench "$benchpath") || { echo "allreduce_bw not found (use -x)" >&2; exit 1; }
[ -n "$rate" ] && NN_RATE_NEEDED=1
nn_require
if [ -n "$keep" ]; then
  mkdir -p "$keep" && NN_TMP=$(cd "$keep" && pwd)
else
  NN_TMP=$(mktemp -d "${TMPDIR:-/tmp}/gflow-hier-vs-flat.XXXXXX")
fi
trap 'nn_teardown; [ -n "$keep" ] || rm -rf "$NN_TMP"' EXIT
trap 'exit 1' INT TERM HUP

map=$(nn_layout_map "$(printf "$L%.0s," $(seq "$H") | sed 's/,$//')")
world=$((H * L))
nn_setup "$H" "$rate" || { echo "namespace setup failed" >&2; exit 1; }
link="${rate:-unshaped}"
shape_desc=${rate:+$NN_LAST_SHAPE}
shape_desc=${shape_desc:-unshaped}
rate_gbs=""
[ -n "$rate" ] && rate_gbs=$(awk -v b="$(nn_rate_bytes "$rate")" 'BEGIN {printf "%.4f", b / 1e9}')

pindesc="hosts share all $(nproc) cpus"
[ "$NN_PIN_HOSTS" = 1 ] && pindesc="hosts pinned to cpus (cpu i -> host i mod $H, $(nproc) cpus)"
echo "# hier_vs_flat: $H hosts x $L ranks, links $shape_desc," \
  "$dtype $minb..$maxb, -n $iters -w $warm, $pindesc, $(uname -r)"
echo "# command: $bench -b $minb -e $maxb -f $factor -n $iters -w $warm -d $dtype -a ALGO --csv"

# Bytes all hosts sent to the switch so far (veth tx_bytes).
tx_bytes() {
  local h sum=0 b
  for ((h = 0; h < H; h++)); do
    b=$(ip netns exec "$(nn_host_ns "$h")" cat "/sys/class/net/$NN_IFNAME/statistics/tx_bytes")
    sum=$((sum + b))
  done
  echo "$sum"
}
# One size (-b = -e)? Then host egress per allreduce can be derived.
nsizes=0
minbytes=$(numfmt --from=iec "${minb%[bB]}" 2>/dev/null || echo 0)
maxbytes=$(numfmt --from=iec "${maxb%[bB]}" 2>/dev/null || echo 1)
[ "$minbytes" = "$maxbytes" ] && nsizes=1

rows=()     # algo|size|ip_time_us|ip_busbw|oop_busbw|wrong|egress, one per run and size
status=()   # algo|n/a or algo|failed
failed=0
declare -A skip=()
for ((rep = 1; rep <= reps; rep++)); do
  # Algorithms alternate within a repetition, so slow drifts of the machine
  # (other load, thermal) hit all of them alike.
  for algo in $algos; do
    [ -n "${skip[$algo]:-}" ] && continue
    out="$NN_TMP/$algo-$rep"
    tx0=$(tx_bytes)
    if ! nn_run_ranks "$out" "$tmo" "$map" -- "$bench" -a "$algo" -b "$minb" -e "$maxb" \
      -f "$factor" -n "$iters" -w "$warm" -d "$dtype" --csv; then
      if grep -q "unknown allreduce algorithm" "$out/rank0.err" 2>/dev/null; then
        status+=("$algo|n/a")
        echo "# -a $algo: not accepted by this build of the library" >&2
      else
        status+=("$algo|failed")
        failed=1
      fi
      skip[$algo]=1
      continue
    fi
    # CSV: library,algorithm,world_size,size,count,type,redop,
    #      oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,ip_algbw,ip_busbw,ip_wrong
    tx=$(($(tx_bytes) - tx0))
    while IFS=, read -r _ _ _ size _ _ _ _ _ ob ow it _ ib iw _; do
      [[ $size =~ ^[0-9]+$ ]] || continue
      wrong=$((${ow:-0} + ${iw:-0}))
      # Host egress per allreduce: only meaningful with a single size, where
      # (warm-up + timed + check) x (out-of-place + in-place) ops of it ran.
      per=""
      [ "$nsizes" = 1 ] && per=$(awk -v t="$tx" -v h="$H" -v n=$((2 * (warm + iters + 1))) \
        'BEGIN { printf "%.1f", t / h / n / 1048576 }')
      rows+=("$algo|$size|$it|$ib|$ob|$wrong|$per")
      [ "$wrong" = 0 ] || failed=1
    done <"$out/rank0.out"
  done
done

fmt_size() { awk -v b="$1" 'BEGIN { u = "B"; if (b >= 1048576) { b /= 1048576; u = "MiB" }
  else if (b >= 1024) { b /= 1024; u = "KiB" }; printf "%g %s", b, u }'; }
bound() {  # algo -> link-bound busbw in GB/s ("" when unshaped or unknown)
  [ -n "$rate_gbs" ] || return 0
  case "$1" in
    ring) echo "$rate_gbs" ;;
    hier | hierarchical) awk -v r="$rate_gbs" -v n="$world" -v h="$H" \
      'BEGIN { if (h > 1) printf "%.4f", r * (n - 1) / n * h / (h - 1) }' ;;
  esac
}

# Median over repetitions per (algorithm, size), in the order first seen;
# with several repetitions the in-place busbw range is shown too.
summary=$(printf '%s\n' "${rows[@]}" | awk -F'|' -v reps="$reps" '
  function med(list,   n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  function lo(list,   n, a, i, m) { n = split(list, a, " "); m = a[1]; for (i = 2; i <= n; i++) if (a[i] + 0 < m + 0) m = a[i]; return m }
  function hi(list,   n, a, i, m) { n = split(list, a, " "); m = a[1]; for (i = 2; i <= n; i++) if (a[i] + 0 > m + 0) m = a[i]; return m }
  NF >= 6 {
    k = $1 "|" $2
    if (!(k in t)) order[++n] = k
    t[k] = t[k] " " $3; ib[k] = ib[k] " " $4; ob[k] = ob[k] " " $5; w[k] += $6; cnt[k]++
    if ($7 != "") eg[k] = eg[k] " " $7
  }
  END {
    for (i = 1; i <= n; i++) {
      k = order[i]
      range = cnt[k] > 1 ? sprintf("%.3f-%.3f", lo(ib[k]), hi(ib[k])) : ""
      e = (k in eg) ? sprintf("%.1f", med(eg[k])) : ""
      printf "%s|%.1f|%.3f|%.3f|%d|%s|%d|%s\n", k, med(t[k]) / 1000, med(ib[k]), med(ob[k]), w[k], range, cnt[k], e
    }
  }')

baseline=${algos%% *}
declare -A base=()
while IFS="|" read -r algo size tms ib ob wrong range _ eg; do
  [ -n "$algo" ] && [ "$algo" = "$baseline" ] && base[$size]=$ib
done <<<"$summary"

echo
hdr="| layout | link | size | algorithm | time (ms) | busbw (GB/s) |"
sep="|---|---|---|---|---|---|"
[ "$reps" -gt 1 ] && { hdr+=" busbw range |"; sep+="---|"; }
hdr+=" out-of-place busbw | link bound | host egress/op (MiB) | vs $baseline |"
sep+="---|---|---|---|"
echo "$hdr"
echo "$sep"
missed=()
while IFS='|' read -r algo size tms ib ob wrong range _ eg; do
  [ -n "$algo" ] || continue
  ratio=""
  [ -n "${base[$size]:-}" ] && ratio=$(awk -v a="$ib" -v b="${base[$size]}" 'BEGIN { if (b > 0) printf "%.2fx", a / b }')
  if [ -n "$target" ] && [ "$algo" != "$baseline" ] &&
    ! awk -v r="${ratio%x}" -v t="$target" 'BEGIN { exit !(r != "" && r + 0 >= t + 0) }'; then
    missed+=("$algo at $(fmt_size "$size"): ${ratio:-no baseline} < ${target}x")
  fi
  label=$algo
  [ "$wrong" = 0 ] || label="$algo (#wrong $wrong)"
  line="| ${H}x$L | $link | $(fmt_size "$size") | $label | $tms | $ib |"
  [ "$reps" -gt 1 ] && line+=" $range |"
  line+=" $ob | $(bound "$algo") | $eg | $ratio |"
  echo "$line"
done <<<"$summary"
for st in "${status[@]}"; do
  IFS='|' read -r algo what <<<"$st"
  [ -n "$target" ] && missed+=("$algo: $what")
  line="| ${H}x$L | $link | - | $algo | $what | |"
  [ "$reps" -gt 1 ] && line+=" |"
  echo "$line | | | |"
done
echo
echo "time and busbw: in-place, max over ranks of the mean of $iters iterations" \
  "(allreduce_bw's definition); median of $reps run(s) per algorithm."
if [ "$nsizes" = 1 ]; then
  awk -v s="$maxbytes" -v n="$world" -v h="$H" 'BEGIN {
    printf "host egress/op: bytes each host sent to the switch per allreduce (veth tx_bytes);"
    printf " ideal %.1f MiB for a ring over blocked ranks (2(N-1)/N x size),", 2 * (n - 1) / n * s / 1048576
    if (h > 1) printf " %.1f MiB for hierarchical (2(H-1)/H x size).", 2 * (h - 1) / h * s / 1048576
    printf "\n" }'
fi
if [ -n "$target" ]; then
  if [ "${#missed[@]}" -eq 0 ]; then
    echo "target ${target}x vs $baseline: met"
  else
    (IFS=";"; echo "target ${target}x vs $baseline: MISSED (${missed[*]})")
    failed=1
  fi
fi
exit $failed
