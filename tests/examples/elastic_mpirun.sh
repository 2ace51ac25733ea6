#!/bin/bash
# elastic_train under Open MPI's mpirun --enable-recovery, with the store
# served outside the job (gflowrun --serve-store; docs/elastic.md, "Under
# mpirun or srun"): rank 2 of 4 kills itself with SIGKILL at step 8; the
# survivors must shrink to 3 ranks and go on, a replacement started by hand
# (GFLOW_JOIN=1) must join, and all 4 must end with equal parameter digests,
# mpirun exiting 0.
#   elastic_mpirun.sh GFLOWRUN ELASTIC_TRAIN
# Exit: 0 pass, 1 fail, 77 skip (no mpirun).
set -uo pipefail
gflowrun=$1
train=$2
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (openmpi-bin)"; exit 77; }
out=$(mktemp -d)
store_pid=
joiner=
cleanup() {
  [ -n "$joiner" ] && pkill -P "$joiner" 2>/dev/null
  [ -n "$store_pid" ] && kill "$store_pid" 2>/dev/null
  rm -rf "$out"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $1"
  for f in "$out"/*.log; do echo "--- $f"; tail -n 30 "$f"; done
  exit 1
}

umask 077
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$out/token"
export GFLOW_JOB_TOKEN
GFLOW_JOB_TOKEN=$(cat "$out/token")
"$gflowrun" --serve-store >"$out/store.out" 2>"$out/store.log" &
store_pid=$!
for _ in $(seq 100); do
  grep -q ':' "$out/store.out" 2>/dev/null && break
  sleep 0.1
done
root=$(head -n 1 "$out/store.out")
case "$root" in *:*) ;; *) fail "gflowrun --serve-store printed no address" ;; esac

args=(--steps 150 --step-ms 40 --count 65536 --kill-rank 2 --kill-at 8)
# The replacement, as a watchdog would start it once the survivors shrank:
# it waits at the store until the members grow, at their next step.
(
  for _ in $(seq 600); do
    grep -q 'shrunk' "$out/mpirun.log" 2>/dev/null && break
    sleep 0.1
  done
  GFLOW_JOIN=1 GFLOW_ROOT=$root GFLOW_ROOT_EXTERNAL=1 GFLOW_TIMEOUT=3s \
    timeout 120 "$train" "${args[@]}" >"$out/joiner.log" 2>&1
) &
joiner=$!
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  timeout -k 5 120 mpirun --oversubscribe --enable-recovery -np 4 \
  -x GFLOW_ROOT="$root" -x GFLOW_ROOT_EXTERNAL=1 -x GFLOW_JOB_TOKEN -x GFLOW_TIMEOUT=3s \
  "$train" "${args[@]}" >"$out/mpirun.log" 2>&1 </dev/null
rc=$?
wait "$joiner" || fail "the replacement exited non-zero"
[ "$rc" = 0 ] || fail "mpirun exited $rc"
grep -q 'shrunk .* size 3' "$out/mpirun.log" || fail "no shrink"
grep -q 'grew .* size 4' "$out/mpirun.log" || fail "no grow"
grep -q 'joined .* rank 3' "$out/joiner.log" || fail "the replacement did not join"
digests=$(cat "$out/mpirun.log" "$out/joiner.log" | grep -o 'digest [0-9a-f]*' | awk '{print $2}')
n=$(echo "$digests" | grep -c .)
distinct=$(echo "$digests" | sort -u | grep -c .)
if [ "$n" != 4 ] || [ "$distinct" != 1 ]; then fail "$n digests ($distinct distinct), want 4 equal"; fi
echo "ok mpirun --enable-recovery: shrunk, joined, 4 equal digests"
