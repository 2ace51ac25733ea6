#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Runs a gflow program as ranks spread over network-namespace "hosts" (see
# lib.sh), then tears everything down. Exit status: 0 when every rank exited 0,
# 1 when any failed (or setup failed), 77 when namespaces cannot be created.
#
#   tests/netns/run_ranks.sh [options] -- PROG ARGS...
#
#   -l LAYOUT   ranks per host, blocked: "2,2" = ranks 0,1 on host 0, 2,3 on host 1
#               (default 2,2)
#   -m MAP      host of each rank instead, e.g. "0,1,0,1" (interleaved)
#   -r RATE     shape every host link to RATE each way (tc syntax: 2gbit, 500mbit)
#   -q QDISC    tbf (default) or htb
#   -t SECONDS  kill the ranks after this long (default 120)
#   -o DIR      keep per-rank output there (default: a temp dir, printed, kept)
#   -e VAR=VAL  extra environment for every rank (repeatable)
#   -p          pin each host's ranks to its own cpus (cpu i -> host i mod H)
#   -v          print every rank's stdout/stderr at the end
#
# Example: 2 hosts x 2 ranks, 2 Gbit/s links, forced ring:
#   tests/netns/run_ranks.sh -l 2,2 -r 2gbit -e GFLOW_DEBUG=INFO -- \
#       build/bench/allreduce_bw -b 64M -e 64M -n 5 -w 2 -a ring
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

usage() {
  sed -n '3,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit "${1:-2}"
}

layout=2,2 map="" rate="" tmo=120 out="" verbose=0
while [ $# -gt 0 ]; do
  case "$1" in
    -l) layout=$2; shift 2 ;;
    -m) map=$2; shift 2 ;;
    -r) rate=$2; shift 2 ;;
    -q) NN_QDISC=$2; shift 2 ;;
    -t) tmo=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    -e) NN_ENV+=("$2"); shift 2 ;;
    -v) verbose=1; shift ;;
    -p) NN_PIN_HOSTS=1; shift ;;
    -h | --help) usage 0 ;;
    --) shift; break ;;
    *) echo "run_ranks.sh: unknown option $1" >&2; usage 2 ;;
  esac
done
[ $# -ge 1 ] || { echo "run_ranks.sh: no program given" >&2; usage 2; }
[ -n "$map" ] || map=$(nn_layout_map "$layout")
hosts=$(tr , '\n' <<<"$map" | sort -n | tail -n1)
hosts=$((hosts + 1))

[ -n "$rate" ] && NN_RATE_NEEDED=1
nn_require
if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/gflow-netns-run.XXXXXX")
fi
trap nn_teardown EXIT
trap 'exit 1' INT TERM HUP

nn_setup "$hosts" "$rate" || { echo "FAIL: namespace setup" >&2; exit 1; }
nn_log "$hosts hosts, rank->host map $map${rate:+, links shaped: $NN_LAST_SHAPE}; output in $out"
rc=0
nn_run_ranks "$out" "$tmo" "$map" -- "$@" || rc=1
if [ "$verbose" = 1 ]; then
  for f in "$out"/rank*.out "$out"/rank*.err; do
    [ -s "$f" ] || continue
    echo "==> $f"
    cat "$f"
  done
else
  # Rank 0's report is the interesting part of a benchmark.
  cat "$out/rank0.out"
fi
[ -n "$rate" ] && nn_show_shaping >&2
exit $rc
