#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# A training step's bucket allreduces without the training: H namespace
# hosts (one rank each, links shaped to RATE, hosts pinned to their cpus)
# run bench/netns/op_sequence.py, which submits allreduces of the given
# sizes at once and times each as it finishes, one after another on one
# communicator as DDP's buckets run on gflow. A markdown table per size list.
#
#   bench/netns/op_sequence.sh [-H 4] [-r 1gbit] [-s "8.2,31.5,26.3,26.6,9.7 ..."] [-i IDLE] [-o OP] [-W WIRE] [-P 0|1] [-p build/python]
#
#   -s LISTS   one or more comma-separated lists of MB (float32); default
#              ResNet-50's DDP buckets in launch order
#   -i IDLE    seconds idle before each step (default 0)
#   -o OP      the reduction (default avg, as DDP's hooks)
#   -W WIRE    the wire type: float16, bfloat16, qint8 or qint4 (default float32)
#   -P 0|1     pin each host to its own cpus (default 1; hosts share cpus
#              when there are more hosts than cpus)
# Needs root; exit 77 when namespaces cannot be made.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=../../tests/netns/lib.sh
source "$root/tests/netns/lib.sh"
H=4 rate=1gbit lists="8.2,31.5,26.3,26.6,9.7" idle=0 op=avg wire="" pinhosts=1 pkg="$root/build/python"
while getopts "H:r:s:i:o:W:P:p:h" o; do
  case "$o" in
    H) H=$OPTARG ;; r) rate=$OPTARG ;; s) lists=$OPTARG ;; i) idle=$OPTARG ;; o) op=$OPTARG ;; W) wire=$OPTARG ;; P) pinhosts=$OPTARG ;; p) pkg=$OPTARG ;;
    *) sed -n '3,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
[ -d "$pkg/gflow" ] || { echo "op_sequence.sh: $pkg/gflow not found (build first)" >&2; exit 1; }
NN_RATE_NEEDED=1
nn_require
trap nn_teardown EXIT
NN_PIN_HOSTS=$pinhosts
NN_ENV=("PYTHONPATH=$pkg")
nn_setup "$H" "$rate" || { echo "namespace setup failed" >&2; exit 1; }
out=$(mktemp -d "${TMPDIR:-/tmp}/gflow-opseq.XXXXXX")
status=0
for sizes in $lists; do
  echo "# $H hosts, links $rate, ops of $sizes MB, idle $idle s, wire ${wire:-float32}"
  nn_run_ranks "$out" 300 "$(seq -s, 0 $((H - 1)))" -- /usr/bin/python3 "$here/op_sequence.py" \
    --sizes "$sizes" --rate "$rate" --idle "$idle" --op "$op" ${wire:+--wire "$wire"}
  wait
  if grep -q '^| all' "$out/rank0.out"; then cat "$out/rank0.out"; else status=1; cat "$out"/rank*.err; fi
done
rm -rf "$out"
exit $status
