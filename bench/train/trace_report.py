"""Where DDP's exchange spends its time, from the per-bucket traces that
`ddp_synthetic.py --trace DIR` writes (one trace-rank<R>.json per rank; the
ranks must share a clock, as network-namespace hosts on one machine do).

For every timed step it splits the exchange, the first launch of a bucket on
any rank to the last completion, into time when

    running     some bucket has been launched by every rank and is not done
                (the collective can move bytes);
    late rank   otherwise some bucket has been launched by some rank but not
                by every rank (the collective waits for the last one);
    backward    otherwise: no bucket is pending anywhere (the link waits for
                backward to fill the next one),

and per bucket (in launch order): its size, the spread of its launches over
the ranks, the time it queued behind the bucket before it, the time it ran
(from when it could start to its last completion) and the time its share of
the bytes the host sent per step (as the link carries them: every frame's
headers) takes at the link's rate. The launches' bound on the span: the
largest, over the buckets, of a bucket's last launch (from the first
launch) plus the link time of it and every bucket launched after it; no
exchange of these launches on one link can end sooner, whereas the step's
bound_s assumes the link never waits for backward. Medians over the
timed steps, as markdown. The per-bucket times assume that the buckets run
one after another, as gflow's do on one communicator; for a backend that runs
them concurrently (gloo) only the split of the span holds.

    python3 bench/train/trace_report.py DIR --rate 1gbit
"""

import argparse
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import link_bytes_per_s  # noqa: E402 (this directory's module)


def load(directory):
    paths = sorted(glob.glob(os.path.join(directory, "trace-rank*.json")))
    ranks = []
    for path in paths:
        with open(path) as f:
            ranks.append(json.load(f))
    if not ranks:
        raise SystemExit("trace_report.py: no trace-rank*.json in %s" % directory)
    if len({len(r["steps"]) for r in ranks}) != 1:
        raise SystemExit("trace_report.py: the ranks traced different numbers of steps")
    return ranks


def buckets_of(steps):
    """One step's buckets over the ranks, in order of their last launch:
    [index, elements, [launch per rank], [done per rank]]."""
    by_index = {}
    for step in steps:
        for index, elements, launch, done in step["buckets"]:
            b = by_index.setdefault(index, [index, elements, [], []])
            b[2].append(launch)
            b[3].append(done)
    return sorted(by_index.values(), key=lambda b: max(b[2]))


def state_at(t, buckets, ranks):
    """What the exchange was doing at time t (see the module's text)."""
    pending = [b for b in buckets if min(b[2]) <= t < max(b[3])]
    if any(len(b[2]) == ranks and max(b[2]) <= t for b in pending):
        return "running"
    return "late rank" if pending else "backward"


def split(buckets, ranks):
    """Seconds in each state from the first launch to the last completion."""
    points = sorted({t for b in buckets for t in b[2] + b[3]})
    spent = {"running": 0.0, "late rank": 0.0, "backward": 0.0}
    for a, b in zip(points, points[1:]):
        spent[state_at((a + b) / 2, buckets, ranks)] += b - a
    return spent


def schedule_bound(buckets, first, link_s_per_element):
    """The shortest span the launches allow on one link: however the
    buckets share it, the bytes of the buckets launched from bucket k on
    cannot start before k's last launch, so the span is at least the
    largest of (k's last launch - the first launch + their link time)."""
    if not link_s_per_element:
        return None
    bound, after = 0.0, 0.0
    for _, elements, launch, _ in reversed(buckets):
        after += elements * link_s_per_element
        bound = max(bound, max(launch) - first + after)
    return bound


def analyse_step(steps, link_s_per_element):
    """One timed step over every rank: the split and the per-bucket rows."""
    ranks = len(steps)
    buckets = buckets_of(steps)
    first, end = min(min(b[2]) for b in buckets), max(max(b[3]) for b in buckets)
    row = dict(split(buckets, ranks), span=end - first,
               exposed=end - max(max(b[2]) for b in buckets))
    row["schedule"] = schedule_bound(buckets, first, link_s_per_element)
    rows, previous_end = [], first
    for index, elements, launch, done in buckets:
        ready = max(launch)
        start = max(ready, previous_end)
        rows.append({"index": index, "mb": 4 * elements / 1e6, "spread": ready - min(launch),
                     "queued": start - ready, "ran": max(done) - start,
                     "link": elements * link_s_per_element if link_s_per_element else None})
        previous_end = max(done)
    return row, rows


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ms(v):
    return "%.0f" % (1e3 * v) if v is not None else ""


def report(ranks, rate):
    link = link_bytes_per_s(rate) if rate else None
    tx = ranks[0].get("host_wire_bytes_per_step") or ranks[0].get("host_tx_bytes_per_step")
    elements = sum(b[1] for b in ranks[0]["steps"][0]["buckets"])
    per_element = tx / link / elements if tx and link and elements else None
    steps = [analyse_step([r["steps"][i] for r in ranks], per_element)
             for i in range(len(ranks[0]["steps"]))]
    total = sum(b["link"] for b in steps[0][1]) if per_element else None
    out = ["%s, %d ranks, %d timed steps, links %s: the exchange's median ms per step"
           % (ranks[0]["mode"], len(ranks), len(steps), rate or "(rate not given)"), "",
           "| span (first launch to last end) | running | waiting for a late rank "
           "| waiting for backward | after the last launch | bytes at the link's rate "
           "| the launches' bound on the span |",
           "|---|---|---|---|---|---|---|",
           "| %s |" % " | ".join([ms(median([s[0][k] for s in steps])) for k in (
               "span", "running", "late rank", "backward", "exposed")] + [ms(total)] + [
               ms(median([s[0]["schedule"] for s in steps]))])]
    out += ["", "| bucket | MB (float32) | launch spread over ranks | queued | ran | at link rate "
            "| ran / link |", "|---|---|---|---|---|---|---|"]
    for index in [r["index"] for r in steps[0][1]]:  # the first step's launch order
        rows = [r for s in steps for r in s[1] if r["index"] == index]
        ran, at_link = median([r["ran"] for r in rows]), median([r["link"] for r in rows])
        out.append("| %d | %.1f | %s | %s | %s | %s | %s |" % (
            index, rows[0]["mb"], ms(median([r["spread"] for r in rows])),
            ms(median([r["queued"] for r in rows])), ms(ran), ms(at_link),
            "%.2f" % (ran / at_link) if ran and at_link else ""))
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("directory", help="where ddp_synthetic.py --trace wrote")
    p.add_argument("--rate", help="the link rate, tc syntax (1gbit, 500mbit)")
    args = p.parse_args()
    print(report(load(args.directory), args.rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
