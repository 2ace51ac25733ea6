#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The synthetic DDP training benchmark (bench/train/netns_ddp.sh) end to end,
# small: 2 namespace hosts on 200 Mbit/s links, mobilenet_v3_small on 4 images a
# rank, one round of no exchange, gloo, the gflow backend and the gflow
# float16, int8 and CSC hooks, then DDP's no-op hook, the gflow backend and
# the float16 hook with 1 MB DDP buckets (-B) that hold the gradients (-V),
# traced (-T), then none, gloo and the float16 hook on emulated GPU compute
# (-E). Every run finishes, the parameters end identical on
# every rank (and differ without an exchange), the table has a row per mode
# with DDP's phases and exchange time, the plot is a PNG, and the traced
# run's trace.md splits the exchange and has a row per bucket, and the
# emulated runs record the step's bound.
#
#   tests/netns/test_ddp_bench.sh [build/python]
# Exit: 0 pass, 1 fail, 77 skip (no namespaces, or no torchvision/matplotlib).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
nn_require
/usr/bin/python3 -c "import torchvision, matplotlib" 2>/dev/null ||
  nn_skip "python3-torchvision or python3-matplotlib missing"
pkg=$(cd "${1:-$root/build/python}" 2>/dev/null && pwd) || pkg=""
if [ -z "$pkg" ] || [ ! -d "$pkg/gflow" ]; then nn_skip "the Python package is not built"; fi
out=$(mktemp -d "${TMPDIR:-/tmp}/gflow-ddp-test.XXXXXX")
modes="none gloo gflow gflow-fp16 gflow-int8 gflow-csc"
if ! bash "$root/bench/train/netns_ddp.sh" -p "$pkg" -H 2 -r 200mbit -m mobilenet_v3_small -M "$modes" -R 1 \
  -s 2 -w 1 -b 4 -t 200 -o "$out" >"$out/log" 2>&1; then
  echo "FAIL: netns_ddp.sh failed; its output:"
  tail -n 30 "$out/log"
  exit 1
fi
fails=0
for mode in $modes; do
  grep -q "^| $mode | " "$out/table.md" || { echo "FAIL: no row for $mode"; fails=1; }
done
# DDP's rows carry the phases (forward / backward / optimizer ms) and DDP's
# exchange beside the bytes' time at the link rate.
grep -qE '^\| gloo \|.*\| [0-9]+ / [0-9]+ / [0-9]+ \| [0-9]+ \([0-9]+\) \|' "$out/table.md" ||
  { echo "FAIL: no phases or exchange time for gloo:"; cat "$out/table.md"; fails=1; }
# -B: DDP's bucket cap reaches DDP and labels the row; -V likewise
# gradient_as_bucket_view. -T: the trace's split of the exchange (six times and the launches' bound)
# and its buckets (at least two: 1 MB caps).
if bash "$root/bench/train/netns_ddp.sh" -p "$pkg" -H 2 -r 200mbit -m mobilenet_v3_small -M "ddp-noop gflow gflow-fp16" \
  -B 1 -V -T -R 1 -s 2 -w 1 -b 4 -t 200 -o "$out/b1" >"$out/b1.log" 2>&1; then
  for mode in ddp-noop gflow gflow-fp16; do
    grep -q "^| $mode, 1 MB buckets, bucket views | " "$out/b1/table.md" ||
      { echo "FAIL: no $mode row with 1 MB buckets and bucket views"; fails=1; }
  done
  [ "$(grep -c '"bucket_mb": 1.0, "bucket_view": true' "$out/b1/results.jsonl")" = 3 ] ||
    { echo "FAIL: bucket cap or views not recorded"; fails=1; }
  trace=$(find "$out/b1" -name trace.md | head -n 1)
  if [ -z "$trace" ] || ! grep -qE '^(\| [0-9]+ ){7}\|$' "$trace" ||
    [ "$(grep -cE '^\| [0-9]+ \| [0-9.]+ \|( [0-9]+ \|){4} [0-9.]+ \|$' "$trace")" -lt 2 ]; then
    echo "FAIL: no trace report, or not as expected:"
    cat "$trace" 2>/dev/null
    fails=1
  fi
else
  echo "FAIL: netns_ddp.sh -B 1 failed:"
  tail -n 30 "$out/b1.log"
  fails=1
fi
# -E: emulated GPU compute (bench/models/mobilenet_v3_small.profile, batch
# 4): every run finishes, the table names the emulation, and each row and
# result carries the step's bound.
emu_modes="none gloo gflow-fp16"
if bash "$root/bench/train/netns_ddp.sh" -p "$pkg" -H 2 -r 200mbit -m mobilenet_v3_small -M "$emu_modes" \
  -E -R 1 -s 2 -w 1 -b 4 -t 200 -o "$out/emu" >"$out/emu.log" 2>&1; then
  grep -q "^mobilenet_v3_small (emulated GPU compute), links 200mbit" "$out/emu/table.md" ||
    { echo "FAIL: no emulated table"; fails=1; }
  for mode in $emu_modes; do
    grep -qE "^\| $mode \|.*\| [0-9.]+ \([0-9.]+; [0-9.]+\) \|" "$out/emu/table.md" ||
      { echo "FAIL: no step bound for $mode (emulated)"; fails=1; }
  done
  [ "$(grep -cE '"emulate_gpu": true, "bound_s": [0-9.]+' "$out/emu/results.jsonl")" = 3 ] ||
    { echo "FAIL: emulate_gpu or bound_s not recorded"; cat "$out/emu/results.jsonl"; fails=1; }
else
  echo "FAIL: netns_ddp.sh -E failed:"
  tail -n 30 "$out/emu.log"
  fails=1
fi
grep -q "WRONG" "$out/table.md" "$out/b1/table.md" "$out/emu/table.md" && { echo "FAIL: parameters:"; cat "$out"/table.md "$out"/b1/table.md "$out"/emu/table.md; fails=1; }
head -c 8 "$out/plot.png" | od -An -c | grep -q "P   N   G" || { echo "FAIL: no PNG"; fails=1; }
[ "$fails" = 0 ] && { echo "PASS: $(grep -cE '^\| (none|gloo|gflow)' "$out/table.md") modes"; rm -rf "$out"; }
exit $fails
