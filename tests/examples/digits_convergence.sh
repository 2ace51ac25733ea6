#!/usr/bin/env bash
# Convergence on real data (issues: dense float32, float16 wire, int8 and
# int4 blocks with error feedback and CSC at 10% density each reach a
# held-out accuracy within 1 point of dense): runs
# examples/digits_train on 4 ranks under gflowrun in each mode and compares
# the accuracy rank 0 prints. digits_train itself fails if the parameters
# differ across ranks. Exit 77 (skipped) without the digits data.
#   digits_convergence.sh GFLOWRUN DIGITS_TRAIN
set -euo pipefail
gflowrun=$1
train=$2
data=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
if [ ! -r "$data" ]; then
  echo "SKIP: $data not found (Debian's python3-sklearn ships it; scripts/install-deps.sh installs it)"
  exit 77
fi
declare -A acc
for mode in dense fp16 bf16 int8 int4 csc csc16; do
  line=$("$gflowrun" -n 4 --no-prefix -- "$train" --mode "$mode" | grep '^mode=')
  echo "$line"
  acc[$mode]=$(sed -n 's/.* accuracy=\([0-9.]*\).*/\1/p' <<<"$line")
done
status=0
for mode in fp16 bf16 int8 int4 csc csc16; do
  if ! awk -v a="${acc[$mode]}" -v d="${acc[dense]}" 'BEGIN { exit !(a >= d - 0.01) }'; then
    echo "FAIL: $mode accuracy ${acc[$mode]} is more than 1 point below dense ${acc[dense]}"
    status=1
  fi
done
awk -v d="${acc[dense]}" 'BEGIN { exit !(d >= 0.9) }' || { echo "FAIL: dense accuracy ${acc[dense]} < 0.90"; status=1; }
[ $status -eq 0 ] && echo "OK: every mode within 1 point of dense (${acc[dense]})"
exit $status
