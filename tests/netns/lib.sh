# shellcheck shell=bash
# Helpers for multi-host gflow runs on one machine: every "host" is a network
# namespace with its own address, joined to the others through a bridge that
# lives in a dedicated "switch" namespace. Nothing is created or changed in the
# root namespace (no routes, links or qdiscs there), and every name carries
# this shell's pid, so concurrent runs do not collide.
#
#   switch ns  <P>sw :  br0  +  p0 .. p<H-1>        (bridge ports)
#   host ns    <P>h<i>: veth0 = 10.77.0.<i+1>/24    (peer of p<i>), lo
#
# Optional shaping (nn_setup H RATE): a tbf (or htb, NN_QDISC=htb) qdisc at
# RATE on each host's veth0 egress (the host's "uplink") and on the switch
# port toward the host (its "downlink"), so each host has a full-duplex link
# of RATE to the switch (NN_SHAPE_DOWNLINK=0: host egress only). Traffic
# between ranks of one host stays on its lo and is never shaped.
#
# NN_SLOW_START_AFTER_IDLE=0|1 sets each host's
# net.ipv4.tcp_slow_start_after_idle (unset: the kernel's default, 1). At 1
# the kernel restarts a connection idle for an RTO from its initial window,
# which an op whose algorithm uses other peers than the ops before it pays
# (docs/performance.md, "Emulated GPU compute").
#
# Usage from a test script:
#   source tests/netns/lib.sh
#   nn_require        # exits 77 (skip) with a reason when namespaces cannot be made
#   trap nn_teardown EXIT; trap 'exit 1' INT TERM HUP
#   nn_setup 2 [2gbit]
#   nn_run_ranks OUTDIR TIMEOUT_S "0,0,1,1" -- build/bench/allreduce_bw -b 4 -e 4M
#
# Rank r runs in namespace <P>h<map[r]> with GFLOW_RANK, GFLOW_WORLD_SIZE,
# GFLOW_ROOT=<rank 0's host ip>:<port>, GFLOW_JOB_TOKEN, GFLOW_HOST_ID=<its ns
# name> and GFLOW_SOCKET_IFNAME==veth0; GFLOW_LOCAL_RANK/SIZE stay unset so
# gflow derives them from the host ids. Its environment is otherwise clean
# (env -i) apart from PATH, HOME, LANG, LD_LIBRARY_PATH, sanitizer options, the
# caller's non-identity GFLOW_* variables and the NN_ENV array ("VAR=value").
# Output goes to OUTDIR/rank<r>.out / .err; exit status to OUTDIR/rank<r>.rc.

NN_PREFIX=${NN_PREFIX:-gflnt$$}     # namespace names: <prefix>sw, <prefix>h0, ...
NN_SUBNET=${NN_SUBNET:-10.77.0}     # host i gets ${NN_SUBNET}.<i+1>/24
NN_IFNAME=${NN_IFNAME:-veth0}       # the host's interface (GFLOW_SOCKET_IFNAME==veth0)
NN_QDISC=${NN_QDISC:-tbf}           # tbf or htb
NN_TBF_LATENCY=${NN_TBF_LATENCY:-20ms} # tbf: the longest a packet may wait in its queue
NN_PORT=${NN_PORT:-29500}           # store port; each nn_start_ranks takes the next one
NN_HOSTS=0                          # hosts created by nn_setup
NN_NAMESPACES=()                    # every namespace this shell created
NN_TIMEOUT_PIDS=()                  # subshells around the ranks' `timeout` wrappers
NN_RANK_HOST=()                     # host of each rank of the current run
NN_OUT=""                           # output directory of the current run
NN_ENV=()                           # extra VAR=value for every rank
NN_ETC_DIRS=()                      # /etc/netns/<ns> directories nn_name_hosts made
export NN_LAST_SHAPE=""             # description of the shaping in place (for callers)

nn_log() { echo "[netns] $*" >&2; }

nn_skip() {
  echo "SKIP: $*"
  exit 77
}

# Identity variables the launcher sets per rank; never passed through.
nn__owned_var() {
  case "$1" in
    GFLOW_RANK | GFLOW_WORLD_SIZE | GFLOW_LOCAL_RANK | GFLOW_LOCAL_SIZE | GFLOW_ROOT | \
      GFLOW_JOB_TOKEN | GFLOW_HOST_ID | GFLOW_SOCKET_IFNAME) return 0 ;;
  esac
  return 1
}

# Exits 77 with the reason when this machine cannot run namespace tests.
nn_require() {
  [ "$(id -u)" = 0 ] || nn_skip "netns tests need root (uid $(id -u)); CI runs them as root"
  command -v ip >/dev/null 2>&1 || nn_skip "iproute2's 'ip' command not found"
  command -v timeout >/dev/null 2>&1 || nn_skip "coreutils 'timeout' not found"
  if [ -n "${NN_RATE_NEEDED:-}" ]; then
    command -v tc >/dev/null 2>&1 || nn_skip "'tc' not found (needed for shaping)"
  fi
  local probe="${NN_PREFIX}probe" err
  if ! err=$(ip netns add "$probe" 2>&1); then
    nn_skip "cannot create a network namespace ('ip netns add' said: $err)"
  fi
  if ! err=$(ip -n "$probe" link add nnprobe0 type veth peer name nnprobe1 2>&1); then
    ip netns del "$probe" 2>/dev/null
    nn_skip "cannot create veth pairs inside a namespace: $err"
  fi
  if ! err=$(ip -n "$probe" link add nnbr0 type bridge 2>&1); then
    ip netns del "$probe" 2>/dev/null
    nn_skip "cannot create a bridge inside a namespace: $err"
  fi
  ip netns del "$probe" 2>/dev/null
  nn_cleanup_stale
}

# Deletes namespaces that an earlier run of these scripts left behind when it
# was killed without a chance to clean up (names gflnt<pid>... whose pid is gone).
nn_cleanup_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    [[ $ns =~ ^gflnt([0-9]+)(sw|h[0-9]+|probe)$ ]] || continue
    pid=${BASH_REMATCH[1]}
    [ "$pid" = "$$" ] && continue
    [ -e "/proc/$pid" ] && continue
    nn_log "removing stale namespace $ns (its creator, pid $pid, is gone)"
    nn__kill_ns_pids "$ns"
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
}

nn_host_ns() { echo "${NN_PREFIX}h$1"; }
nn_host_name() { echo "nnhost$1"; }
nn_switch_ns() { echo "${NN_PREFIX}sw"; }
nn_host_ip() { echo "${NN_SUBNET}.$(($1 + 1))"; }

nn__run() {
  local err
  if ! err=$("$@" 2>&1); then
    nn_log "command failed: $* : $err"
    return 1
  fi
}

# nn_setup HOSTS [RATE]: the switch, HOSTS host namespaces, links up, addresses,
# and (with RATE, a tc rate like 2gbit or 500mbit) shaping of every host link.
nn_setup() {
  local hosts=$1 rate=${2:-} sw h ns
  if ! [[ $hosts =~ ^[0-9]+$ ]] || [ "$hosts" -lt 1 ] || [ "$hosts" -gt 250 ]; then
    nn_log "bad host count '$hosts'"
    return 1
  fi
  sw=$(nn_switch_ns)
  nn__run ip netns add "$sw" || return 1
  NN_NAMESPACES+=("$sw")
  nn__run ip -n "$sw" link add br0 type bridge || return 1
  # No STP, no forwarding delay: ports forward as soon as they are up.
  ip -n "$sw" link set br0 type bridge stp_state 0 forward_delay 0 2>/dev/null || true
  nn__run ip -n "$sw" link set br0 up || return 1
  for ((h = 0; h < hosts; h++)); do
    ns=$(nn_host_ns "$h")
    nn__run ip netns add "$ns" || return 1
    NN_NAMESPACES+=("$ns")
    nn__run ip -n "$sw" link add "p$h" type veth peer name "$NN_IFNAME" netns "$ns" || return 1
    nn__run ip -n "$sw" link set "p$h" master br0 || return 1
    nn__run ip -n "$sw" link set "p$h" up || return 1
    nn__run ip -n "$ns" link set lo up || return 1
    nn__run ip -n "$ns" addr add "$(nn_host_ip "$h")/24" dev "$NN_IFNAME" || return 1
    nn__run ip -n "$ns" link set "$NN_IFNAME" up || return 1
    if [ -n "${NN_SLOW_START_AFTER_IDLE:-}" ]; then
      nn__run ip netns exec "$ns" sysctl -qw \
        net.ipv4.tcp_slow_start_after_idle="$NN_SLOW_START_AFTER_IDLE" || return 1
    fi
  done
  NN_HOSTS=$hosts
  if [ -n "$rate" ]; then
    nn_shape_all "$rate" || return 1
  fi
  nn__wait_reachable || return 1
}

# Every host reaches host 0 (bridge ports forwarding, addresses usable).
nn__wait_reachable() {
  local h i ok ip0 msg
  ip0=$(nn_host_ip 0)
  for ((h = 1; h < NN_HOSTS; h++)); do
    ok=0
    for ((i = 0; i < 50; i++)); do
      msg=$(ip netns exec "$(nn_host_ns "$h")" timeout 2 bash -c "exec 3<>/dev/tcp/$ip0/1" 2>&1)
      if [[ $msg == *refused* ]]; then
        ok=1  # a RST from host 0: the path works (nothing listens on port 1)
        break
      fi
      sleep 0.1
    done
    if [ "$ok" != 1 ]; then
      nn_log "host $h cannot reach host 0 at $ip0"
      return 1
    fi
  done
}

# Bytes per second of a tc rate ("2gbit", "500mbit", "1.5gbit", "100mbps").
nn_rate_bytes() {
  awk -v r="$1" 'BEGIN {
    s = tolower(r); n = s + 0; u = substr(s, length(n "") + 1)
    if (u == "" || u == "bit") m = 1/8; else if (u == "kbit") m = 1e3/8;
    else if (u == "mbit") m = 1e6/8; else if (u == "gbit") m = 1e9/8;
    else if (u == "tbit") m = 1e12/8; else if (u == "bps") m = 1;
    else if (u == "kbps") m = 1e3; else if (u == "mbps") m = 1e6; else if (u == "gbps") m = 1e9;
    else { print "bad"; exit }
    printf "%.0f\n", n * m }'
}

# nn_shape DEV_NS DEV RATE: root qdisc on DEV limiting its egress to RATE.
nn_shape() {
  local ns=$1 dev=$2 rate=$3 bytes burst
  bytes=$(nn_rate_bytes "$rate")
  [ "$bytes" != bad ] || { nn_log "bad rate '$rate' (use e.g. 2gbit, 500mbit)"; return 1; }
  # Bucket: 4 ms at the rate, at least 64 KiB (one GSO super-packet must fit,
  # or tbf has to segment it) - a token bucket shorter than the kernel timer
  # slack cannot reach its rate.
  burst=$((bytes / 250))
  [ "$burst" -ge 65536 ] || burst=65536
  ip -n "$ns" link set "$dev" txqueuelen 1000 2>/dev/null || true
  case "$NN_QDISC" in
    tbf)
      nn__run ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" \
        burst "$burst" latency "$NN_TBF_LATENCY" || return 1
      ;;
    htb)
      nn__run ip netns exec "$ns" tc qdisc replace dev "$dev" root handle 1: htb default 10 || return 1
      nn__run ip netns exec "$ns" tc class add dev "$dev" parent 1: classid 1:10 htb \
        rate "$rate" ceil "$rate" burst "$burst" cburst "$burst" || return 1
      ;;
    *)
      nn_log "NN_QDISC must be tbf or htb, not '$NN_QDISC'"
      return 1
      ;;
  esac
}

# Shapes both directions of every host link to RATE.
nn_shape_all() {
  local rate=$1 h
  command -v tc >/dev/null 2>&1 || { nn_log "'tc' not found"; return 1; }
  for ((h = 0; h < NN_HOSTS; h++)); do
    nn_shape "$(nn_host_ns "$h")" "$NN_IFNAME" "$rate" || return 1
    if [ "${NN_SHAPE_DOWNLINK:-1}" = 1 ]; then
      nn_shape "$(nn_switch_ns)" "p$h" "$rate" || return 1
    fi
  done
  NN_LAST_SHAPE="$NN_QDISC $rate per host link, each direction"
  [ "${NN_SHAPE_DOWNLINK:-1}" = 1 ] || NN_LAST_SHAPE="$NN_QDISC $rate per host, egress only"
}

# nn_name_hosts: every host namespace gets an /etc/hosts (through
# /etc/netns/<ns>/hosts, which `ip netns exec` mounts over /etc/hosts) naming
# each host nnhost<i> at its address, so launchers can address hosts by name.
# The hostname itself is per process tree: run it under `unshare --uts` and
# set it there (nn_exec_named).
nn_name_hosts() {
  local h i dir
  for ((h = 0; h < NN_HOSTS; h++)); do
    dir=/etc/netns/$(nn_host_ns "$h")
    mkdir -p "$dir" || return 1
    NN_ETC_DIRS+=("$dir")
    {
      echo "127.0.0.1 localhost"
      for ((i = 0; i < NN_HOSTS; i++)); do echo "$(nn_host_ip "$i") $(nn_host_name "$i")"; done
    } >"$dir/hosts" || return 1
  done
}

# nn_exec_named H CMD...: CMD (a shell command string) in host H's namespace,
# in a UTS namespace of its own whose hostname is nnhost<H>.
nn_exec_named() {
  local h=$1
  shift
  ip netns exec "$(nn_host_ns "$h")" unshare --uts sh -c "hostname $(nn_host_name "$h") && $*"
}

# nn_listening_ports H PROGRAM: "ip:port" of every TCP socket that a process
# named PROGRAM listens on in host H's namespace, one per line.
nn_listening_ports() {
  ip netns exec "$(nn_host_ns "$1")" ss -Htlnp 2>/dev/null |
    awk -v p="((\"$2\"," 'index($0, p) { print $4 }'
}

# nn_probe_strangers HOST BENCH ADDR...: from host HOST (a namespace outside
# the job), a stranger tries each ADDR (ip:port of a job's listener) three
# ways: as a gflow rank with a wrong token, as one without a token, and with
# 4 KiB of random bytes. Every gflow attempt must fail with "unauthorized"
# within 30 s. Returns 0 when every attempt was refused; prints each verdict.
nn_probe_strangers() {
  local h=$1 bench=$2 addr tok rc err fails=0
  shift 2
  for addr in "$@"; do
    tok=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    for how in wrong-token no-token; do
      local env=(GFLOW_RANK=1 GFLOW_WORLD_SIZE=4 GFLOW_ROOT="$addr" GFLOW_TIMEOUT=10s)
      [ "$how" = wrong-token ] && env+=(GFLOW_JOB_TOKEN="$tok")
      err=$(ip netns exec "$(nn_host_ns "$h")" env -i PATH="$PATH" "${env[@]}" \
        timeout 30 "$bench" -b 4 -e 4 -n 1 -w 0 2>&1 >/dev/null)
      rc=$?
      if [ "$rc" != 0 ] && [[ $err == *unauthorized* ]]; then
        echo "  refused: stranger ($how) at $addr"
      else
        echo "  NOT REFUSED: stranger ($how) at $addr: exit $rc: ${err:0:300}"
        fails=$((fails + 1))
      fi
    done
    ip netns exec "$(nn_host_ns "$h")" timeout 10 bash -c \
      "exec 3<>/dev/tcp/${addr%:*}/${addr##*:} && head -c 4096 /dev/urandom >&3" 2>/dev/null
    echo "  sent 4 KiB of random bytes to $addr"
  done
  return $fails
}

# ---- launcher tests (test_mpirun.sh, test_srun.sh) ------------------------
# A launcher test defines RUN (a function: RUN OUT PROG ARGS... starts the 4
# ranks, 2 on each of nnhost0 and nnhost1, with no gflow variable, and writes
# OUT.out, OUT.err, OUT.rc) and PORTS (a function that sets the array
# nn_ports to the job's own listeners on nnhost0), and counts failures in
# NN_FAILS through nn_fail.
NN_FAILS=0
nn_fail() {
  echo "FAIL: $*"
  NN_FAILS=$((NN_FAILS + 1))
}

# nn_launch_bench RUN NAME BENCH: allreduce_bw with the auto and the
# hierarchical algorithm: rank 0 reports 2 hosts of 2 ranks (grouping from
# the launcher), every value right, and no "has no token" warning.
nn_launch_bench() {
  local run=$1 name=$2 bench=$3 algo out rc head rows bad before
  for algo in auto hier; do
    out=$NN_TMP/bench-$algo
    before=$NN_FAILS
    "$run" "$out" "$bench" -a "$algo" -b 4 -e 4M -n 5 -w 2
    rc=$(cat "$out.rc")
    if [ "$rc" != 0 ]; then
      nn_fail "$name ($algo) exited $rc; stderr ends:"
      tail -n 8 "$out.err" | sed 's/^/    /'
      continue
    fi
    head=$(grep -m1 '^# gflow .*hosts' "$out.out")
    [[ $head == *"hosts 2, local size 2"* ]] ||
      nn_fail "($algo) rank 0 reports '$head', expected 2 hosts of 2 ranks"
    rows=$(awk '!/^#/ && NF >= 12' "$out.out" | wc -l)
    bad=$(awk '!/^#/ && NF >= 12 && ($8 != "0" || $12 != "0")' "$out.out")
    if [ "$rows" -lt 10 ] || [ -n "$bad" ] || ! grep -q "Out of bounds values : 0 OK" "$out.out"; then
      nn_fail "($algo) wrong or missing results ($rows rows):"
      printf '%s\n' "$bad" | sed 's/^/    /'
    fi
    if grep -q "has no token" "$out.err"; then
      nn_fail "($algo) the job ran without a token: $(grep -m1 'has no token' "$out.err")"
    fi
    [ "$NN_FAILS" = "$before" ] &&
      echo "ok   $name 2x2, $algo: $rows sizes right, 2 hosts of 2, authenticated"
  done
}

# nn_launch_attacked RUN PORTS BENCH WORKER: a job of 600 verified
# allreduces (fault_worker, 20 ms apart: over 12 s) runs while a stranger on
# nnhost2 tries every port the job listens on (nn_probe_strangers, well
# under a second when they are refused); no rank listens on every interface,
# the job is still running after the probes, and it finishes on all 4 ranks.
nn_launch_attacked() {
  local run=$1 ports=$2 bench=$3 worker=$4 out=$NN_TMP/job job i p rc done_ranks
  ( "$run" "$out" "$worker" loop 600 65536 20 ) 2>/dev/null &
  job=$!
  nn_ports=()
  for ((i = 0; i < 300; i++)); do
    "$ports"
    [ "${#nn_ports[@]}" -ge 1 ] && grep -q "GFLOW_PROGRESS" "$out.out" 2>/dev/null && break
    sleep 0.1
  done
  # Again, now that the job runs: a snapshot taken before its first op may
  # list a data port that closes once every rank has connected.
  "$ports"
  if [ "${#nn_ports[@]}" -eq 0 ]; then
    nn_fail "no listening socket of the job's ranks found on nnhost0 (is the job running?)"
  else
    echo "the job listens on nnhost0 at: ${nn_ports[*]}"
    for p in "${nn_ports[@]}"; do
      case "$p" in
        0.0.0.0:* | \[::\]:* | \*:*) nn_fail "a rank listens on every interface ($p)" ;;
      esac
    done
    nn_probe_strangers 2 "$bench" "${nn_ports[@]}" || nn_fail "a stranger was not refused"
    # A job that ended first would make a refusal look like a closed port.
    kill -0 "$job" 2>/dev/null || nn_fail "the job ended before the probes did: they prove nothing"
  fi
  wait "$job"
  rc=$(cat "$out.rc" 2>/dev/null)
  done_ranks=$(grep -c "^GFLOW_DONE" "$out.out" 2>/dev/null)
  if [ "$rc" != 0 ] || [ "$done_ranks" != 4 ]; then
    nn_fail "the attacked job exited $rc with $done_ranks of 4 ranks done; stderr ends:"
    tail -n 8 "$out.err" | sed 's/^/    /'
  else
    echo "ok   the attacked job finished: 4 ranks, 600 verified allreduces each"
  fi
}

# Prints the qdisc statistics of every host link (for the record).
nn_show_shaping() {
  local h
  for ((h = 0; h < NN_HOSTS; h++)); do
    echo "host $h $NN_IFNAME egress:"
    ip netns exec "$(nn_host_ns "$h")" tc -s qdisc show dev "$NN_IFNAME" | sed 's/^/  /'
  done
}

# "2,2,1" (ranks per host, blocked) -> "0,0,1,1,2" (host of each rank).
nn_layout_map() {
  local IFS=, n h=0 i hostof=()
  for n in $1; do
    for ((i = 0; i < n; i++)); do hostof+=("$h"); done
    h=$((h + 1))
  done
  echo "${hostof[*]}"
}

# nn_clean_env: NN_CLEAN_ENV = the VAR=value words a rank needs from the
# caller's environment (PATH, HOME, LANG, the library path and sanitizer
# options), and no GFLOW_* variable.
nn_clean_env() {
  local var
  NN_CLEAN_ENV=(PATH="$PATH" HOME="${HOME:-/root}" LANG="${LANG:-C.UTF-8}")
  for var in LD_LIBRARY_PATH ASAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS LSAN_OPTIONS; do
    [ -n "${!var:-}" ] && NN_CLEAN_ENV+=("$var=${!var}")
  done
}

# nn_find_worker BENCH [PATH]: PATH, else fault_worker next to BENCH's build.
nn_find_worker() {
  local w=${2:-$(dirname "$1")/../tests/faults/fault_worker}
  [ -x "$w" ] && echo "$w"
}

# nn_start_ranks OUTDIR TIMEOUT_S MAP -- PROG ARGS...
# Starts one process per entry of MAP (comma-separated host index per rank)
# in the background; nn_wait_ranks collects them.
nn_start_ranks() {
  local out=$1 tmo=$2 map=$3
  shift 3
  [ "${1:-}" = "--" ] && shift
  [ $# -ge 1 ] || { nn_log "nn_start_ranks: no program"; return 1; }
  IFS=, read -r -a NN_RANK_HOST <<<"$map"
  local world=${#NN_RANK_HOST[@]} r h token port root var
  for h in "${NN_RANK_HOST[@]}"; do
    if ! [[ $h =~ ^[0-9]+$ ]] || [ "$h" -ge "$NN_HOSTS" ]; then
      nn_log "rank map '$map' names host '$h' but there are $NN_HOSTS hosts"
      return 1
    fi
  done
  mkdir -p "$out" || return 1
  rm -f "$out"/rank*.out "$out"/rank*.err "$out"/rank*.rc "$out"/rank*.pid "$out"/rank*.tpid
  NN_OUT=$out
  NN_TIMEOUT_PIDS=()
  token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  NN_PORT=$((NN_PORT + 1))
  port=$NN_PORT
  root="$(nn_host_ip "${NN_RANK_HOST[0]}"):$port"
  # The caller's environment, minus identities, for every rank.
  nn_clean_env
  local base=("${NN_CLEAN_ENV[@]}")
  while IFS='=' read -r var _; do
    [[ $var == GFLOW_* ]] || continue
    nn__owned_var "$var" && continue
    base+=("$var=${!var}")
  done < <(env)
  echo "$map" >"$out/map"
  echo "$*" >"$out/command"
  # NN_PIN_HOSTS=1: give every host its own share of the cpus (taskset), as
  # real hosts have; cpu i goes to host i mod H (hosts share when H > cpus).
  local cpus=() pin=() ncpu i
  if [ "${NN_PIN_HOSTS:-0}" = 1 ]; then
    ncpu=$(nproc)
    for ((i = 0; i < ncpu; i++)); do
      h=$((i % NN_HOSTS))
      cpus[h]="${cpus[h]:+${cpus[h]},}$i"
    done
    for ((h = 0; h < NN_HOSTS; h++)); do
      [ -n "${cpus[h]:-}" ] || cpus[h]=$((h % ncpu))
    done
  fi
  for ((r = 0; r < world; r++)); do
    h=${NN_RANK_HOST[$r]}
    pin=()
    [ -n "${cpus[h]:-}" ] && pin=(taskset -c "${cpus[h]}")
    # The rank's own pid lands in rank<r>.pid (sh execs the program), so a
    # test can SIGKILL the rank itself rather than its timeout wrapper.
    # shellcheck disable=SC2016 # $$ and $@ belong to the inner sh
    # The subshell turns "timeout died of the rank's signal" into a plain exit
    # status, so bash prints no "Killed" job notices for ranks a test kills.
    (
      timeout -k 5 "$tmo" ip netns exec "$(nn_host_ns "$h")" \
        env -i "${base[@]}" GFLOW_RANK="$r" GFLOW_WORLD_SIZE="$world" GFLOW_ROOT="$root" \
        GFLOW_JOB_TOKEN="$token" GFLOW_HOST_ID="$(nn_host_ns "$h")" \
        GFLOW_SOCKET_IFNAME="=$NN_IFNAME" "${NN_ENV[@]}" "${pin[@]}" \
        sh -c 'echo $$ > "$0"; exec "$@"' "$out/rank$r.pid" "$@" \
        >"$out/rank$r.out" 2>"$out/rank$r.err" </dev/null &
      echo $! >"$out/rank$r.tpid"
      wait $!
    ) 2>/dev/null &
    NN_TIMEOUT_PIDS+=($!)
  done
}

# Pid of rank R's process (not its timeout wrapper); empty until it started.
nn_rank_pid() {
  local f="$NN_OUT/rank$1.pid" i
  for ((i = 0; i < 50; i++)); do
    if [ -s "$f" ]; then
      cat "$f"
      return 0
    fi
    sleep 0.1
  done
  return 1
}

# Waits for every rank of the current run; writes rank<r>.rc; returns 0 when
# all exited 0. Prints failing ranks with the end of their stderr.
nn_wait_ranks() {
  local r rc fail=0
  for ((r = 0; r < ${#NN_TIMEOUT_PIDS[@]}; r++)); do
    rc=0
    wait "${NN_TIMEOUT_PIDS[$r]}" || rc=$?
    echo "$rc" >"$NN_OUT/rank$r.rc"
    if [ "$rc" != 0 ]; then
      fail=1
      local why=""
      [ "$rc" = 124 ] && why=" (killed by the run's timeout)"
      nn_log "rank $r (host ${NN_RANK_HOST[$r]}) exited $rc$why; stderr ends:"
      tail -n 5 "$NN_OUT/rank$r.err" | sed 's/^/    /' >&2
    fi
  done
  NN_TIMEOUT_PIDS=()
  return $fail
}

# Stops the current run's ranks (SIGTERM through their timeout wrappers, which
# SIGKILL after 5 s) and reaps them.
nn_kill_ranks() {
  nn__term_wrappers
  nn_wait_ranks >/dev/null 2>&1
  return 0
}

# SIGTERM to the current run's `timeout` wrappers (each passes it on to its rank).
nn__term_wrappers() {
  local f p
  [ -n "$NN_OUT" ] || return 0
  for f in "$NN_OUT"/rank*.tpid; do
    [ -s "$f" ] || continue
    p=$(cat "$f")
    kill -TERM "$p" 2>/dev/null
  done
  return 0
}

# nn_run_ranks OUTDIR TIMEOUT_S MAP -- PROG ARGS...: start, then wait.
nn_run_ranks() {
  nn_start_ranks "$@" || return 1
  nn_wait_ranks
}

nn__kill_ns_pids() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null) || return 0
  # shellcheck disable=SC2086 # one pid per word
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  return 0
}

# nn_reap PID...: waits up to 2 s for each of this shell's children PID to
# end, then SIGKILLs it, and reaps it.
nn_reap() {
  local p i
  for p in "$@"; do
    for ((i = 0; i < 20; i++)); do
      kill -0 "$p" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
}

# Kills every process left in our namespaces (ranks first via their timeout
# wrappers), then deletes the namespaces; veths and the bridge go with them.
nn_teardown() {
  local p ns i
  nn__term_wrappers
  for ns in "${NN_NAMESPACES[@]}"; do nn__kill_ns_pids "$ns"; done
  nn_reap "${NN_TIMEOUT_PIDS[@]}"
  NN_TIMEOUT_PIDS=()
  for ns in "${NN_NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  NN_NAMESPACES=()
  for ns in "${NN_ETC_DIRS[@]}"; do rm -rf "$ns"; done
  NN_ETC_DIRS=()
  NN_HOSTS=0
}

# nn_begin_test: the standard preamble of a test script (skip checks, cleanup
# trap, temp dir in NN_TMP kept on failure when NN_KEEP=1).
nn_begin_test() {
  nn_require
  NN_TMP=$(mktemp -d "${TMPDIR:-/tmp}/gflow-netns.XXXXXX")
  trap 'nn__on_exit $?' EXIT
  trap 'exit 1' INT TERM HUP
}

nn__on_exit() {
  nn_teardown
  if [ "${NN_KEEP:-0}" = 1 ] || { [ "$1" != 0 ] && [ "$1" != 77 ] && [ "${NN_KEEP_ON_FAIL:-1}" = 1 ]; }; then
    nn_log "outputs kept in $NN_TMP"
  else
    rm -rf "$NN_TMP"
  fi
}

# Finds allreduce_bw: $1 if given, else $GFLOW_ALLREDUCE_BW, else a build dir.
nn_find_bench() {
  local cand root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  for cand in "${1:-}" "${GFLOW_ALLREDUCE_BW:-}" "$root/build/bench/allreduce_bw" \
    "$root/build-release/bench/allreduce_bw" "$root/build-netns/bench/allreduce_bw"; do
    if [ -n "$cand" ] && [ -x "$cand" ]; then
      echo "$cand"
      return 0
    fi
  done
  return 1
}

# nn_check_bench OUTDIR: allreduce_bw's report on rank 0 has rows and every
# #wrong cell is 0 (the bench sums wrong values over all ranks, and every
# rank exits 1 when any is wrong; nn_wait_ranks checks the exit statuses).
nn_check_bench() {
  local f="$1/rank0.out" rows bad
  if [ ! -s "$f" ]; then
    nn_log "rank 0 printed no report"
    return 1
  fi
  # Table rows: size count type redop | time algbw busbw wrong | time algbw busbw wrong
  rows=$(awk '!/^#/ && NF >= 8' "$f" | wc -l)
  bad=$(awk '!/^#/ && NF >= 8 && ($8 != "0" || (NF >= 12 && $12 != "0" && $12 != "-"))' "$f")
  if [ "$rows" -eq 0 ]; then
    nn_log "rank 0's report has no result rows"
    return 1
  fi
  if [ -n "$bad" ] || ! grep -q "Out of bounds values : 0 OK" "$f"; then
    nn_log "wrong results reported by rank 0:"
    { echo "$bad"; grep "Out of bounds" "$f"; } | sed 's/^/    /' >&2
    return 1
  fi
  echo "$rows"
}

# nn_allreduce_algos OUTDIR RANK: "bytes:route" for each route change rank
# RANK logged (needs GFLOW_DEBUG=INFO), one per line. The log says
#   rank R: allreduce #N (B bytes xW ranks): path P[ (staged)], algorithm A
# and route is A on the network path, else P (shm, hierarchical, nccl).
nn_allreduce_algos() {
  sed -n 's/.*rank [0-9]*: allreduce #[0-9]* (\([0-9]*\) bytes x[0-9]* ranks): path \([a-z-]*\)[^,]*, algorithm \([A-Za-z_0-9-]*\).*/\1 \2 \3/p' \
    "$1/rank$2.err" | awk '{print $1 ":" ($2 == "network" ? $3 : $2)}'
}

# nn_algo_known BENCH ALGO: 0 unless the library rejects ALGO as an unknown
# allreduce algorithm (probed with one rank in host 0; needs nn_setup).
nn_algo_known() {
  local out="$NN_TMP/probe-$2"
  nn_run_ranks "$out" 30 0 -- "$1" -a "$2" -b 4 -e 4 -n 1 -w 0 2>/dev/null && return 0
  ! grep -q "unknown allreduce algorithm" "$out/rank0.err"
}

# Default per-step deadline for test runs, so a failure surfaces in seconds
# rather than at gflow's 300 s default (the caller's GFLOW_TIMEOUT wins).
nn_default_timeout() {
  [ -n "${GFLOW_TIMEOUT:-}" ] || NN_ENV+=("GFLOW_TIMEOUT=${1:-30s}")
}
