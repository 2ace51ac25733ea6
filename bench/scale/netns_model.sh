#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The cost model (src/backend/cost_model.h) against measurement, on shaped
# links where the links, not this machine's cores, are the bottleneck.
#
# For each host count H of the fit and check sets, bench/netns/hier_vs_flat.sh
# builds H network-namespace hosts of one rank each, shapes every host link
# to RATE (tc tbf), and runs allreduce_bw with recursive doubling,
# halving-doubling and ring over the sizes. gflow_model then fits alpha,
# beta and gamma on the fit set's reports only and checks its predictions
# on the held-out set (and, for reference, on the fit set).
#
#   bench/scale/netns_model.sh [options]
#
#   -r RATE     per-host link rate, tc syntax (default 200mbit)
#   -F "H..."   host counts to fit on (default "2 4 8")
#   -C "H..."   held-out host counts to check (default "12 16")
#   -b SIZE     smallest message (default 256K: below tbf's burst, 64 KiB or more, a
#               message passes at the veth's speed, a regime the alpha-beta form does
#               not describe)
#   -e SIZE     largest message (default 4M)
#   -n ITERS    timed iterations (default 5)
#   -o DIR      where the reports and the model go (default: a new temp dir)
#   -x PATH     allreduce_bw (default: hier_vs_flat.sh's)
#   -m PATH     gflow_model (default: next to allreduce_bw's build)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rate=200mbit fit="2 4 8" held="12 16" minb=256K maxb=4M iters=5 out="" bench="" model=""
while getopts "r:F:C:b:e:n:o:x:m:" opt; do
  case $opt in
    r) rate=$OPTARG ;; F) fit=$OPTARG ;; C) held=$OPTARG ;; b) minb=$OPTARG ;;
    e) maxb=$OPTARG ;; n) iters=$OPTARG ;; o) out=$OPTARG ;; x) bench=$OPTARG ;;
    m) model=$OPTARG ;; *) sed -n '2,25p' "$0" >&2; exit 2 ;;
  esac
done
out=${out:-$(mktemp -d)}
mkdir -p "$out"
if [ -z "$model" ]; then
  for b in "$here/../../build" "$here/../../build-release"; do
    [ -x "$b/tools/gflow_model" ] && model="$b/tools/gflow_model" && break
  done
fi
[ -x "$model" ] || { echo "netns_model.sh: no gflow_model (build it, or -m PATH)" >&2; exit 2; }
xflag=()
[ -n "$bench" ] && xflag=(-x "$bench")
for h in $fit $held; do
  "$here/../netns/hier_vs_flat.sh" -H "$h" -L 1 -r "$rate" -A "rd hd ring" -b "$minb" -e "$maxb" \
    -f 4 -n "$iters" -w 2 -P 0 -o "$out/h$h" "${xflag[@]}" >"$out/h$h.md"
done
reports() { for h in "$@"; do ls "$out/h$h"/*/rank0.out; done; }
# shellcheck disable=SC2046,SC2086
"$model" fit "$out/model.txt" $(reports $fit) >"$out/fit.txt"
# shellcheck disable=SC2046,SC2086
"$model" check "$out/model.txt" $(reports $held) >"$out/check.txt"
echo "# links $rate, one rank per host; fit on H = $fit, checked on H = $held"
head -1 "$out/fit.txt"
grep '^#' "$out/check.txt" | tail -2
echo "# reports, fit and check tables in $out"
