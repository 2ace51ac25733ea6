#!/usr/bin/env bash
# PMIx bootstrap on one host: Open MPI's mpirun starts fault_worker ranks with
# no gflow variable set (identity, rank 0's store address and a fresh job
# token all come through mpirun's PMIx server), over TCP alone, and with
# GFLOW_ROOT given (then only the token is shared). Each run: every rank verifies its allreduces and exits 0,
# and the ranks never warn that the job has no token.
#   tests/bootstrap/pmix_launch.sh path/to/fault_worker
# Exit: 0 pass, 1 fail, 77 skip (no mpirun).
set -uo pipefail
worker=$1
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (openmpi-bin)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
keep=(PATH="$PATH" HOME="${HOME:-/root}")
for var in LD_LIBRARY_PATH ASAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS LSAN_OPTIONS; do
  [ -n "${!var:-}" ] && keep+=("$var=${!var}")
done
fails=0
run() {  # run NAME EXTRA_ENV... -- ARGS...
  local name=$1 extra=()
  shift
  while [ "$1" != -- ]; do extra+=("$1"); shift; done
  shift
  env -i "${keep[@]}" "${extra[@]}" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout -k 5 120 mpirun --oversubscribe -np 3 "$worker" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" </dev/null
  local rc=$? done
  done=$(grep -c '^GFLOW_DONE' "$tmp/$name.out")
  if [ "$rc" != 0 ] || [ "$done" != 3 ] || grep -q "has no token" "$tmp/$name.err"; then
    echo "FAIL $name: exit $rc, $done of 3 ranks done; stderr ends:"
    tail -n 6 "$tmp/$name.err" | sed 's/^/    /'
    fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}
run pmix-only -- loop 20 65536
# A port the kernel has just handed out and released, for GFLOW_ROOT.
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
run pmix-root-given GFLOW_ROOT=127.0.0.1:$port -- loop 20 65536
run pmix-tcp GFLOW_SHM=0 -- op alltoall loop 10 65536
[ "$fails" = 0 ] || exit 1
echo "PASS"
