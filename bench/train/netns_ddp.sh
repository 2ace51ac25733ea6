#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Synthetic DDP training on H network-namespace hosts (one rank each) with
# every host link shaped to a rate: images/s of each gradient-exchange mode
# against the compute bound (no exchange), in interleaved rounds, as a
# markdown table and a PNG plot (bench/train/report.py).
#
#   bench/train/netns_ddp.sh [options]
#
#   -H N        hosts, one rank each (default 4)
#   -r "RATES"  link rates, tc syntax; "none" for unshaped (default "1gbit")
#   -m "MODELS" torchvision models (default resnet50)
#   -M "MODES"  modes of bench/train/ddp_synthetic.py (default: none ddp-noop
#               gloo gloo-fp16 gflow gflow-dense gflow-fp16 gflow-bf16
#               gflow-int8 gflow-int4 gflow-csc gflow-auto)
#   -R N        rounds; within a round every mode runs once, in order (default 2)
#   -s N        timed steps per run (default 10)
#   -w N        untimed warm-up steps (default 3)
#   -b N        batch per rank (default 16)
#   -B "MBS"    DDP bucket caps in MB (bucket_cap_mb), each a run of every
#               mode (default "25", DDP's own)
#   -V          DDP with gradient_as_bucket_view=True in every mode (the
#               gradients are views into the buckets: no copy into them
#               before the exchange and out of them after it; with -E this
#               leaves the host what a GPU node's host has, where those
#               copies are device copies: docs/performance.md)
#   -P 0|1      pin each host to its own cpus (default 1, as real hosts have)
#   -E          emulated GPU compute (ddp_synthetic.py --emulate-gpu): forward
#               and backward wait out the per-call times of
#               bench/models/<model>.profile instead of computing, leaving
#               the cpus to communication as a GPU node's host does; each
#               result's bound_s is the step's lower bound at the link rate
#   -T          trace each bucket's launch and completion on every rank and
#               write where the exchange went (bench/train/trace_report.py)
#               to each run's trace.md (modes without a hook of their own
#               then run torch's allreduce_hook, as DDP does without one)
#   -o DIR      results (results.jsonl, table.md, plot.png, rank outputs;
#               default a new directory under /tmp)
#   -t SECONDS  limit per run (default 900)
#   -p DIR      the gflow Python package's directory (default build/python)
#
# Needs root (namespaces), the gflow Python package (-p) and Debian's
# python3-torchvision and python3-matplotlib (scripts/install-deps.sh).
# Exit: 0 when every run finished with parameters identical on every rank
# (except modes none and ddp-noop, where they must differ), 1 otherwise, 77
# when namespaces cannot be made.
#
# Efficiency is against mode none. With more ranks than cores (4 hosts on 2
# cores, pinned), ranks that never wait for each other run slower than ranks
# that meet at every bucket (none 46.9, ddp-noop 58.2, gflow-csc 72.3 img/s
# on ResNet-50 here), so there "efficiency" above 100% measures the cores'
# sharing, not communication: compare the modes with each other there.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=../../tests/netns/lib.sh
source "$root/tests/netns/lib.sh"

usage() {
  sed -n '3,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit "${1:-2}"
}

H=4 rates="1gbit" models="resnet50" rounds=2 steps=10 warm=3 batch=16 buckets=25 pinhosts=1 out="" tmo=900 trace=0 view=()
pkg="$root/build/python" emulate=()
modes="none ddp-noop gloo gloo-fp16 gflow gflow-dense gflow-fp16 gflow-bf16 gflow-int8 gflow-int4 gflow-csc gflow-auto"
while [ $# -gt 0 ]; do
  case "$1" in
    -H) H=$2; shift 2 ;;
    -r) rates=$2; shift 2 ;;
    -m) models=$2; shift 2 ;;
    -M) modes=$2; shift 2 ;;
    -R) rounds=$2; shift 2 ;;
    -s) steps=$2; shift 2 ;;
    -w) warm=$2; shift 2 ;;
    -b) batch=$2; shift 2 ;;
    -B) buckets=$2; shift 2 ;;
    -P) pinhosts=$2; shift 2 ;;
    -T) trace=1; shift ;;
    -V) view=(--bucket-view); shift ;;
    -E) emulate=(--emulate-gpu); shift ;;
    -o) out=$2; shift 2 ;;
    -t) tmo=$2; shift 2 ;;
    -p) pkg=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "netns_ddp.sh: unknown option $1" >&2; usage 2 ;;
  esac
done
py=/usr/bin/python3
[ -d "$pkg/gflow" ] || { echo "netns_ddp.sh: $pkg/gflow not found (build first)" >&2; exit 1; }
"$py" -c "import torchvision, matplotlib" 2>/dev/null ||
  { echo "netns_ddp.sh: needs python3-torchvision and python3-matplotlib" >&2; exit 1; }
for r in $rates; do case "$r" in none) ;; *) NN_RATE_NEEDED=1 ;; esac; done
nn_require
out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/gflow-ddp.XXXXXX")}
mkdir -p "$out" && out=$(cd "$out" && pwd)
trap 'nn_teardown' EXIT
trap 'exit 1' INT TERM HUP
NN_PIN_HOSTS=$pinhosts
# torch's gloo finds its address from the hostname (127.0.0.1 in a namespace).
NN_ENV=("PYTHONPATH=$pkg" "PYTHONUNBUFFERED=1" "GLOO_SOCKET_IFNAME=$NN_IFNAME")
map=$(seq -s, 0 $((H - 1)))
results="$out/results.jsonl"
: >"$results"
echo "# netns_ddp: $H hosts x 1 rank, rates '$rates', models '$models', $rounds rounds," \
  "$steps steps (+$warm warm-up), batch $batch, buckets '$buckets' MB${view:+ (bucket views)}${emulate:+, emulated GPU compute}, $(nproc) cpus, pinned $pinhosts" | tee "$out/header"
failed=0

# One run of $mode on $model at $rate with DDP buckets of $bucket MB, round $round.
run_one() {
  local dir="$out/$rate-$model-$mode-b$bucket-$round" line traced=() link=()
  [ "$trace" = 1 ] && [ "$mode" != none ] && traced=(--trace "$dir")
  [ "$rate" != none ] && link=(--link-rate "$rate")
  rm -f "$dir"/trace-rank*.json
  if ! nn_run_ranks "$dir" "$tmo" "$map" -- "$py" "$root/bench/train/ddp_synthetic.py" --model "$model" \
    --mode "$mode" --batch "$batch" --steps "$steps" --warmup "$warm" --bucket-mb "$bucket" "${view[@]}" "${emulate[@]}" "${link[@]}" "${traced[@]}"; then
    failed=1
    echo "# $rate $model $mode bucket $bucket MB round $round: failed (outputs in $dir)" >&2
    return
  fi
  line=$(grep '^{' "$dir/rank0.out" | tail -n 1)
  echo "${line%\}}, \"rate\": \"$rate\", \"round\": $round}" >>"$results"
  echo "# $rate $model $mode bucket $bucket MB round $round: $(echo "$line" |
    "$py" -c 'import json,sys; d=json.load(sys.stdin); print("%.1f img/s" % d["images_per_s"])')"
  if [ ${#traced[@]} -gt 0 ] && ! "$py" "$here/trace_report.py" "$dir" --rate "$rate" >"$dir/trace.md"; then
    failed=1
    echo "# $rate $model $mode bucket $bucket MB round $round: no trace report" >&2
  fi
}

for rate in $rates; do
  shape=$rate
  [ "$rate" = none ] && shape=""
  nn_setup "$H" "$shape" || { echo "namespace setup failed" >&2; exit 1; }
  for model in $models; do
    for ((round = 1; round <= rounds; round++)); do
      for bucket in $buckets; do
        for mode in $modes; do
          run_one
        done
      done
    done
  done
  nn_teardown
done
"$py" "$here/report.py" "$results" --plot "$out/plot.png" | tee "$out/table.md"
echo "# results in $out"
exit $failed
