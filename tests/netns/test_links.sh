#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Per-link bytes: on 2 namespace hosts of 2 ranks, allreduce_bw's link
# counters (its JSON "links": bytes per op of every rank pair, and each
# rank's sums over the network and inside its host) equal the analytic bytes
# of the ring and of the hierarchical allreduce within 1%, and busbw is
# flagged above the busiest link's rate exactly where the algorithm moves
# less per link than busbw assumes.
#
#   ring r -> r+1: each rank sends 1.5 S to its successor; 1->2 and 3->0
#     cross hosts, 0->1 and 2->3 do not. busiest 1.5 S: not flagged.
#   hier: S/2 + S/2 to the host's other rank (reduce-scatter, allgather),
#     S/2 to the same local rank on the other host. busiest S < 1.5 S: flagged.
#
#   tests/netns/test_links.sh [path/to/allreduce_bw]
# Exit: 0 pass, 1 fail, 77 skip.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$here/lib.sh"

bench=$(nn_find_bench "${1:-}") || { echo "FAIL: allreduce_bw not found (pass its path)"; exit 1; }
nn_begin_test
nn_setup 2 || { echo "FAIL: namespace setup"; exit 1; }
NN_ENV=()
nn_default_timeout 60s

fails=0
check() {  # algo extra-env...
  local algo=$1 out="$NN_TMP/links-$1"
  shift
  local saved=("${NN_ENV[@]}")
  NN_ENV+=("$@")
  if ! nn_run_ranks "$out" 180 "0,0,1,1" -- "$bench" -a "$algo" -b 1M -e 4M -f 4 -n 3 -w 1 \
    -m 0 --links --json "$out/links.json"; then
    echo "FAIL $algo: the run failed (outputs in $out)"
    fails=$((fails + 1))
    NN_ENV=("${saved[@]}")
    return
  fi
  NN_ENV=("${saved[@]}")
  if /usr/bin/python3 - "$algo" "$out/links.json" <<'PY'; then
import json, sys
algo, path = sys.argv[1], sys.argv[2]
doc = json.load(open(path))
host = [0, 0, 1, 1]
bad = 0
for row in doc["results"]:
    s = row["size"]
    m = row["out_of_place"]
    l = m.get("links")
    if l is None:
        print(f"  {algo} {s} B: no link counts in the JSON")
        bad += 1
        continue
    for r in range(4):
        for p in range(4):
            if r == p:
                continue
            if algo == "ring":
                want = 1.5 * s if p == (r + 1) % 4 else 0.0
            else:
                want = 1.0 * s if p == r ^ 1 else 0.5 * s if p == (r + 2) % 4 else 0.0
            got = l["pairs"][r][p]
            if abs(got - want) > 0.01 * want + 1:
                print(f"  {algo} {s} B: rank {r} -> {p} carried {got:.0f} B/op, analytic {want:.0f}")
                bad += 1
            if bool(l["same_host"][r][p]) != (host[r] == host[p]):
                print(f"  {algo} {s} B: rank {r} -> {p} same_host {l['same_host'][r][p]}")
                bad += 1
    for r in range(4):
        if algo == "ring":  # 1 and 3 send across, 0 and 2 receive from across
            net, loc = (1.5 * s, 0.0) if r in (1, 3) else (0.0, 1.5 * s)
            rnet, rloc = loc, net
        else:
            net, loc = 0.5 * s, 1.0 * s
            rnet, rloc = net, loc
        for name, want in (("network_sent", net), ("local_sent", loc),
                           ("network_received", rnet), ("local_received", rloc)):
            got = l[name][r]
            if abs(got - want) > 0.01 * want + 1:
                print(f"  {algo} {s} B: rank {r} {name} {got:.0f} B/op, analytic {want:.0f}")
                bad += 1
    flagged = l["busbw_above_busiest"]
    if flagged != (algo == "hier"):
        print(f"  {algo} {s} B: busbw_above_busiest is {flagged} (busbw {m['busbw']:.3f} GB/s,"
              f" busiest {l['busiest']:.0f} B/op in {m['time_us']:.1f} us)")
        bad += 1
print(f"  {algo}: {len(doc['results'])} sizes, {bad} mismatch(es)")
sys.exit(1 if bad else 0)
PY
    echo "ok   $algo: every pair and every rank's network/local bytes within 1% of the analytic"
  else
    echo "FAIL $algo (outputs in $out)"
    fails=$((fails + 1))
  fi
}

check ring
# 1 MiB segments: 4 MiB runs as 4 pipelined segments.
check hier GFLOW_HIER_SEGMENT=1M

if [ "$fails" -ne 0 ]; then
  echo "FAIL: $fails failure(s)"
  exit 1
fi
echo "PASS: link bytes match the analytic bytes on 2x2"
