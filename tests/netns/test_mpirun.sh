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
worker=$(nn_find_worker "$bench" "${2:-}") ||
  { echo "FAIL: fault_worker not found (pass its path second)"; exit 1; }
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
  local out=$1
  shift
  nn_clean_env
  # One shell command string (nn_exec_named): every word quoted.
  nn_exec_named 0 "exec env -i $(printf '%q ' "${NN_CLEAN_ENV[@]}") OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 120 mpirun -np 4 \
    --host nnhost0:2,nnhost1:2 --mca plm_rsh_agent $(printf '%q' "$agent") $(printf '%q ' "$@")" \
    >"$out.out" 2>"$out.err" </dev/null
  echo $? >"$out.rc"
}

mp_ports() { mapfile -t nn_ports < <(nn_listening_ports 0 fault_worker); }

nn_launch_bench mp_run mpirun "$bench"
nn_launch_attacked mp_run mp_ports "$bench" "$worker"
if [ "$NN_FAILS" -ne 0 ]; then
  echo "FAIL: $NN_FAILS check(s) failed"
  exit 1
fi
echo "PASS: mpirun across 2 namespace hosts with no gflow variables, strangers refused"
