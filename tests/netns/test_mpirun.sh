#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# A real multi-host launch: Open MPI's mpirun, started in namespace host
# nnhost0, starts 2 ranks there and 2 on nnhost1 through its rsh launcher (an
# agent script that enters the host's namespace and UTS namespace, as ssh
# would log in). No gflow variable is set anywhere: every rank finds its
# identity, its host, rank 0's store and the job token through the PMIx
# server of mpirun (docs/launching.md). Checks:
#   1. allreduce_bw (auto and hierarchical algorithms): 2 hosts of 2 ranks,
#      every value right, and no "this job has no token" warning;
#   2. rank 0's store listens on the data interface, not on every interface;
#   3. while a job runs, a stranger on a third host is refused at every port
#      the job listens on (wrong token, no token, random bytes), and the job
#      finishes with every value right.
#
#   tests/netns/test_mpirun.sh path/to/allreduce_bw path/to/fault_worker
# Exit: 0 pass, 1 fail, 77 skip.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

bench=$(nn_find_bench "${1:-}") || { echo "FAIL: allreduce_bw not found (pass its path)"; exit 1; }
worker=${2:-$(dirname "$bench")/../tests/faults/fault_worker}
[ -x "$worker" ] || { echo "FAIL: fault_worker not found (pass its path second)"; exit 1; }
command -v mpirun >/dev/null 2>&1 || nn_skip "Open MPI's mpirun not found (Debian: openmpi-bin)"
command -v unshare >/dev/null 2>&1 || nn_skip "util-linux's unshare not found"
command -v ss >/dev/null 2>&1 || nn_skip "iproute2's ss not found"
nn_begin_test
nn_setup 3 || { echo "FAIL: namespace setup"; exit 1; }
nn_name_hosts || { echo "FAIL: /etc/netns host files"; exit 1; }

# The rsh agent: mpirun runs `AGENT HOST COMMAND...` to start its daemon on
# HOST; this one runs COMMAND in HOST's namespace under HOST's hostname.
agent=$NN_TMP/rsh_agent.sh
cat >"$agent" <<AGENT
#!/bin/sh
host=\$1
shift
exec ip netns exec "${NN_PREFIX}h\${host#nnhost}" unshare --uts sh -c "hostname \$host && \$*"
AGENT
chmod +x "$agent"

# mp_run OUT PROG ARGS...: mpirun on nnhost0, 2 ranks on each of nnhost0 and
# nnhost1, with a clean environment (no GFLOW_*); output in OUT.{out,err,rc}.
mp_run() {
  local out=$1 keep=(PATH="$PATH" HOME="${HOME:-/root}" LANG="${LANG:-C.UTF-8}") var
  shift
  for var in LD_LIBRARY_PATH ASAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS LSAN_OPTIONS; do
    [ -n "${!var:-}" ] && keep+=("$var=${!var}")
  done
  nn_exec_named 0 "exec env -i ${keep[*]} OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 240 mpirun -np 4 \
    --host nnhost0:2,nnhost1:2 --mca plm_rsh_agent $agent $*" >"$out.out" 2>"$out.err" </dev/null
  echo $? >"$out.rc"
}

fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}

# ---- 1. allreduce_bw, auto and hierarchical -------------------------------
for algo in auto hier; do
  out=$NN_TMP/bench-$algo
  mp_run "$out" "$bench" -a "$algo" -b 4 -e 4M -n 5 -w 2
  rc=$(cat "$out.rc")
  if [ "$rc" != 0 ]; then
    fail "mpirun ($algo) exited $rc; stderr ends:"
    tail -n 8 "$out.err" | sed 's/^/    /'
    continue
  fi
  head=$(grep -m1 '^# gflow .*hosts' "$out.out")
  [[ $head == *"hosts 2, local size 2"* ]] ||
    fail "($algo) rank 0 reports '$head', expected 2 hosts of 2 ranks (grouping from the launcher)"
  rows=$(awk '!/^#/ && NF >= 12' "$out.out" | wc -l)
  bad=$(awk '!/^#/ && NF >= 12 && ($8 != "0" || $12 != "0")' "$out.out")
  if [ "$rows" -lt 10 ] || [ -n "$bad" ] || ! grep -q "Out of bounds values : 0 OK" "$out.out"; then
    fail "($algo) wrong or missing results ($rows rows):"
    echo "$bad" | sed 's/^/    /'
  fi
  if grep -q "has no token" "$out.err"; then
    fail "($algo) the job ran without a token: $(grep -m1 'has no token' "$out.err")"
  fi
  [ "$rc" = 0 ] && echo "ok   mpirun 2x2, $algo: $rows sizes right, 2 hosts of 2, authenticated"
done

# ---- 2 and 3. strangers against a running job -----------------------------
out=$NN_TMP/job
( mp_run "$out" "$worker" loop 400 65536 20 ) &
job=$!
ports=()
for ((i = 0; i < 300; i++)); do
  mapfile -t ports < <(nn_listening_ports 0 fault_worker)
  [ "${#ports[@]}" -ge 1 ] && grep -q "GFLOW_PROGRESS" "$out.out" 2>/dev/null && break
  sleep 0.1
done
if [ "${#ports[@]}" -eq 0 ]; then
  fail "no listening socket of the job's ranks found on nnhost0 (is the job running?)"
else
  echo "the job listens on nnhost0 at: ${ports[*]}"
  for p in "${ports[@]}"; do
    case "$p" in
      0.0.0.0:* | \[::\]:* | \*:*) fail "a rank listens on every interface ($p), not the data interface" ;;
    esac
  done
  nn_probe_strangers 2 "$bench" "${ports[@]}" || fail "a stranger was not refused"
fi
wait "$job"
rc=$(cat "$out.rc" 2>/dev/null)
done_ranks=$(grep -c "^GFLOW_DONE" "$out.out" 2>/dev/null)
if [ "$rc" != 0 ] || [ "$done_ranks" != 4 ]; then
  fail "the attacked job exited $rc with $done_ranks of 4 ranks done; stderr ends:"
  tail -n 8 "$out.err" | sed 's/^/    /'
else
  echo "ok   the attacked job finished: 4 ranks, 400 verified allreduces each"
fi

if [ "$fails" -ne 0 ]; then
  echo "FAIL: $fails check(s) failed"
  exit 1
fi
echo "PASS: mpirun across 2 namespace hosts with no gflow variables, strangers refused"
