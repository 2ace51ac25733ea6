#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Adaptive striping across two flows of different speed: two hosts, one rank
# each, GFLOW_SOCKETS_PER_PEER=2, one data connection shaped to 100 Mbit and
# the other to 400 Mbit (bench/netns/adaptive_striping.sh sets this up).
# Under rd (whole messages, cut into units) the results must be exact and
# the slow flow must carry fewer bytes than the fast one: at least 1.5x
# fewer (tc class counters), where the equal split gives both the same.
# Nothing here asserts a time. Not the ring: its 256 KiB pieces leave the
# sockets idle between bursts, and then the slow flow's qdisc queue lets it
# look writable, so which flow carries more is not settled (see
# docs/performance.md, "TCP: adaptive striping").
#
#   tests/netns/test_adaptive_striping.sh [path/to/allreduce_bw]
#
# Exit: 0 pass, 1 fail, 77 skip.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"
bench=$(nn_find_bench "${1:-}") || { echo "FAIL: allreduce_bw not found (pass its path)"; exit 1; }
export GFLOW_TIMEOUT=${GFLOW_TIMEOUT:-60s}
# 32 MiB messages: at 8 MiB each op's start, when both sockets fill their
# queues, weighed so much that the slow flow carried 25-48% of the bytes on a
# quiet machine and 38-53% with two cpu hogs beside it (this test failed CI at
# 41% and 45%); at 32 MiB it carried 20-21% either way, the caps' ratio. The
# premise holds only while the links are the bottleneck, so a run in one of
# the machine's slow phases gets a second one.
for attempt in 1 2; do
  "$here/../../bench/netns/adaptive_striping.sh" -x "$bench" -b 32M -n 2 -w 1 -M adaptive \
    -a rd -C 1.5 -t 120
  rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 77 ] && break
  echo "# attempt $attempt missed; once more"
done
[ "$rc" = 77 ] && exit 77
if [ "$rc" != 0 ]; then
  echo "FAIL: rd (exit $rc)"
  exit 1
fi
echo "PASS: the slow flow carried fewer bytes, results exact"
