#!/bin/bash
# elastic_train under gflowrun --elastic --max-restarts 1 (examples/elastic_train.cc):
# rank 2 of 4 kills itself with SIGKILL at step 8; the survivors must shrink
# to 3 ranks and go on, the replacement must join (4 ranks again), and the
# job must end with 4 equal parameter digests, exit 0. Over shared memory,
# TCP (GFLOW_SHM=0) and two pretend hosts (hierarchical). Then a job with no
# restarts left ends with 3 equal digests, and one whose gradients travel as
# int8 with error feedback (the survivors' reducers rebuilt, residuals kept).
#   elastic.sh GFLOWRUN ELASTIC_TRAIN
set -euo pipefail
gflowrun=$1
train=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# run NAME RESTARTS EXPECTED_DIGESTS [gflowrun args...] -- [train args...]
run() {
  local name=$1 restarts=$2 want=$3
  shift 3
  local log="$out/$name.log"
  if ! timeout 120 "$gflowrun" -n 4 --elastic --max-restarts "$restarts" --timeout 100 \
      --env GFLOW_TIMEOUT=3s "$@" >"$log" 2>&1; then
    echo "FAIL $name: gflowrun exited non-zero"; cat "$log"; exit 1
  fi
  local digests n distinct
  digests=$(grep -o 'digest [0-9a-f]*' "$log" | awk '{print $2}')
  n=$(echo "$digests" | grep -c . || true)
  distinct=$(echo "$digests" | sort -u | grep -c . || true)
  if [ "$n" != "$want" ] || [ "$distinct" != 1 ]; then
    echo "FAIL $name: $n digests ($distinct distinct), want $want equal"; cat "$log"; exit 1
  fi
  grep -q 'shrunk .* size 3' "$log" || { echo "FAIL $name: no shrink"; cat "$log"; exit 1; }
  if [ "$restarts" -gt 0 ]; then
    grep -q 'grew .* size 4' "$log" || { echo "FAIL $name: no grow"; cat "$log"; exit 1; }
    grep -q 'joined .* rank 3' "$log" || { echo "FAIL $name: no join"; cat "$log"; exit 1; }
  fi
  echo "ok $name: $n equal digests"
}

args=(--steps 30 --count 65536 --kill-rank 2 --kill-at 8)
run shm 1 4 -- "$train" "${args[@]}"
run tcp 1 4 --env GFLOW_SHM=0 -- "$train" "${args[@]}"
run hier 1 4 -- "$train" "${args[@]}" --hosts 2
run shm_no_restart 0 3 -- "$train" "${args[@]}"
run shm_int8 1 4 -- "$train" "${args[@]}" --wire int8
