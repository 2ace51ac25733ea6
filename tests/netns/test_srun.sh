#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# A real multi-host launch under Slurm: a throwaway cluster of two namespace
# hosts, nnhost0 (slurmctld and a slurmd) and nnhost1 (a slurmd), and
# `srun --mpi=pmix -N2 -n4` from nnhost0 starts 2 ranks on each. No gflow
# variable is set anywhere: every rank finds its identity, its host, rank 0's
# store and the job token through the PMIx server in Slurm's slurmstepd
# (docs/launching.md). Checks:
#   1. allreduce_bw (auto and hierarchical algorithms): 2 hosts of 2 ranks,
#      every value right, and no "this job has no token" warning;
#   2. rank 0's store listens on the data interface, not on every interface;
#   3. while a job runs, a stranger on a third host (nnhost2, not in the
#      cluster) is refused at every port the job listens on (wrong token, no
#      token, random bytes), and the job finishes with every value right.
#
# How the cluster runs: auth/none and cred/none (no munge), every daemon in
# the foreground with its state, spool and logs in a fresh directory under
# NN_TMP. Each daemon (and srun) enters its host's network namespace with
# nsenter, not `ip netns exec` (which remounts /sys and hides the cgroup
# tree slurmd wants), and gets a mount and UTS namespace of its own where the
# host's /etc/netns/<ns>/hosts is bound on /etc/hosts, a per-host directory on
# /var/tmp (slurm.conf's TmpFS: the PMIx plugin's directories there would
# clash in a shared /tmp) and the hostname is nnhost<i>.
#
#   tests/netns/test_srun.sh path/to/allreduce_bw path/to/fault_worker
# Exit: 0 pass, 1 fail, 77 skip.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

bench=$(nn_find_bench "${1:-}") || { echo "FAIL: allreduce_bw not found (pass its path)"; exit 1; }
worker=$(nn_find_worker "$bench" "${2:-}") ||
  { echo "FAIL: fault_worker not found (pass its path second)"; exit 1; }
for cmd in slurmctld slurmd srun sinfo; do
  command -v "$cmd" >/dev/null 2>&1 ||
    nn_skip "Slurm's $cmd not found (Debian: slurmctld slurmd slurm-client)"
done
command -v nsenter >/dev/null 2>&1 || nn_skip "util-linux's nsenter not found"
command -v unshare >/dev/null 2>&1 || nn_skip "util-linux's unshare not found"
command -v ss >/dev/null 2>&1 || nn_skip "iproute2's ss not found"
nn_begin_test

# ---- the cluster's configuration ------------------------------------------
sl_dir=$NN_TMP/slurm
conf=$sl_dir/slurm.conf
mkdir -p "$sl_dir/ctl/state" || { echo "FAIL: cannot create $sl_dir"; exit 1; }
for h in 0 1; do
  mkdir -p "$sl_dir/$(nn_host_name "$h")/spool" "$sl_dir/$(nn_host_name "$h")/vartmp" ||
    { echo "FAIL: cannot create $sl_dir"; exit 1; }
done
# config_overrides: nodes take CPUs=2 from here, not from their hardware, so
# a machine with fewer cores does not drain them (the ranks just share cores).
cat >"$conf" <<CONF
ClusterName=gflownetns
SlurmctldHost=$(nn_host_name 0)($(nn_host_ip 0))
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$sl_dir/ctl/state
SlurmctldPidFile=$sl_dir/ctl/slurmctld.pid
SlurmctldLogFile=$sl_dir/ctl/slurmctld.log
SlurmdSpoolDir=$sl_dir/%n/spool
SlurmdPidFile=$sl_dir/%n/slurmd.pid
SlurmdLogFile=$sl_dir/%n/slurmd.log
TmpFS=/var/tmp
NodeName=$(nn_host_name 0) NodeAddr=$(nn_host_ip 0) CPUs=2 State=UNKNOWN
NodeName=$(nn_host_name 1) NodeAddr=$(nn_host_ip 1) CPUs=2 State=UNKNOWN
PartitionName=p Nodes=$(nn_host_name 0),$(nn_host_name 1) Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$conf
mpis=$(srun --mpi=list 2>&1)
[[ $mpis == *pmix* ]] || nn_skip "Slurm's srun has no PMIx plugin (srun --mpi=list: ${mpis//$'\n'/ })"

nn_setup 3 || { echo "FAIL: namespace setup"; exit 1; }
nn_name_hosts || { echo "FAIL: /etc/netns host files"; exit 1; }

# sl_exec H CMD...: execs CMD in host H's network namespace, in mount and UTS
# namespaces of its own (hosts file, /var/tmp, hostname of host H). It
# replaces the calling shell, so call it in a subshell: ( sl_exec ... ).
sl_exec() {
  local h=$1
  shift
  # shellcheck disable=SC2016 # $0.. belong to the inner sh
  exec nsenter --net="/run/netns/$(nn_host_ns "$h")" unshare --mount --uts sh -c \
    'mount --bind "$0" /etc/hosts && mount --bind "$1" /var/tmp && hostname "$2" &&
     shift 2 && exec "$@"' \
    "/etc/netns/$(nn_host_ns "$h")/hosts" "$sl_dir/$(nn_host_name "$h")/vartmp" \
    "$(nn_host_name "$h")" "$@"
}

# The daemons' pids (each is the daemon itself: every wrapper execs). The
# exit trap stops them before nn_teardown kills whatever is left in the
# namespaces (job steps included).
sl_pids=()
sl_stop() {
  local p
  for p in "${sl_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  nn_reap "${sl_pids[@]}"
  sl_pids=()
}
trap 'rc=$?; sl_stop; nn__on_exit $rc' EXIT

( sl_exec 0 slurmctld -D -i -f "$conf" ) >"$sl_dir/ctl/stdout" 2>&1 </dev/null &
sl_pids+=($!)
for h in 0 1; do
  ( sl_exec "$h" slurmd -D -N "$(nn_host_name "$h")" -f "$conf" ) \
    >"$sl_dir/$(nn_host_name "$h")/stdout" 2>&1 </dev/null &
  sl_pids+=($!)
done

# Both nodes idle (usually within 2 s), unless a daemon died.
state=""
for ((i = 0; i < 300; i++)); do
  state=$( (sl_exec 0 sinfo -h -o '%T %D') 2>/dev/null)
  [ "$state" = "idle 2" ] && break
  for p in "${sl_pids[@]}"; do kill -0 "$p" 2>/dev/null || break 2; done
  sleep 0.2
done
if [ "$state" != "idle 2" ]; then
  echo "FAIL: the Slurm cluster did not come up (sinfo: '${state//$'\n'/; }'); logs end:"
  for f in "$sl_dir"/ctl/slurmctld.log "$sl_dir"/nnhost*/slurmd.log "$sl_dir"/*/stdout; do
    [ -s "$f" ] && { echo "  $f:"; tail -n 5 "$f" | sed 's/^/    /'; }
  done
  exit 1
fi
echo "the Slurm cluster is up: 2 nodes idle"

# sl_run OUT PROG ARGS...: srun on nnhost0, 2 ranks on each of nnhost0 and
# nnhost1, with a clean environment (no GFLOW_*; srun passes its environment
# on to the ranks); output in OUT.{out,err,rc}.
sl_run() {
  local out=$1
  shift
  nn_clean_env
  ( sl_exec 0 env -i "${NN_CLEAN_ENV[@]}" SLURM_CONF="$conf" timeout -k 5 120 \
    srun --mpi=pmix -N2 -n4 --ntasks-per-node=2 "$@" ) >"$out.out" 2>"$out.err" </dev/null
  echo $? >"$out.rc"
}

# sl_ports: sets nn_ports to the ranks' own listeners on nnhost0. Every task
# of a --mpi=pmix step also holds a listener of its slurmstepd (the PMIx
# plugin's TCP socket, on every interface), which Slurm leaks into the tasks
# it starts (no close-on-exec); a socket that slurmstepd holds is Slurm's,
# not the job's: it is left out, and named in stepd_ports.
stepd_ports=()
sl_ports() {
  local all p
  mapfile -t stepd_ports < <(ip netns exec "$(nn_host_ns 0)" ss -Htlnp 2>/dev/null |
    awk 'index($0, "(\"slurmstepd\",") { print $4 }')
  mapfile -t all < <(nn_listening_ports 0 fault_worker)
  nn_ports=()
  for p in "${all[@]}"; do
    [[ " ${stepd_ports[*]} " == *" $p "* ]] || nn_ports+=("$p")
  done
}

nn_launch_bench sl_run srun "$bench"
nn_launch_attacked sl_run sl_ports "$bench" "$worker"
[ "${#stepd_ports[@]}" -eq 0 ] || echo "(slurmstepd's own listeners, left out: ${stepd_ports[*]})"
if [ "$NN_FAILS" -ne 0 ]; then
  echo "FAIL: $NN_FAILS check(s) failed"
  exit 1
fi
echo "PASS: srun --mpi=pmix across 2 namespace hosts with no gflow variables, strangers refused"
