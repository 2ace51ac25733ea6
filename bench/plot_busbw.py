#!/usr/bin/python3
"""busbw against message size from allreduce_bw-style JSON reports.

    bench/plot_busbw.py RUN.json [RUN.json ...] --plot busbw.png

Each file is what a sweep driver (allreduce_bw, gloo_allreduce_bw,
mpi_allreduce_bw, nccl_allreduce_bw) writes with --json FILE; the drivers'
own --plot FILE.png runs this script on their report. One line per library,
algorithm, element type, op and placement (out of place, in place), sizes on
a log scale. Needs matplotlib (Debian's python3-matplotlib).
"""
import argparse
import json


def human(s):
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if s >= k and s % k == 0:
            return "%d%s" % (s // k, unit)
    return str(s)


def series(report):
    """{label: {size: busbw}} of one report."""
    out = {}
    many = len({(r["type"], r["redop"]) for r in report["results"]}) > 1
    for r in report["results"]:
        for place in ("out_of_place", "in_place"):
            if place not in r:
                continue
            label = "%s %s" % (report["library"], report["algorithm"])
            if many:
                label += " %s %s" % (r["type"], r["redop"])
            label += "" if place == "out_of_place" else " (in place)"
            out.setdefault(label, {})[r["size"]] = r[place]["busbw"]
    return out


def plot(all_series, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, points in all_series.items():
        sizes = sorted(points)
        ax.plot(sizes, [points[s] for s in sizes], marker="o", label=label)
    sizes = sorted({s for p in all_series.values() for s in p})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([human(s) for s in sizes], rotation=45)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)" + (" (median over rounds)" if "rounds" in title else ""))
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+", help="JSON files of --json FILE")
    p.add_argument("--plot", required=True, help="the PNG to write")
    a = p.parse_args()
    merged, titles = {}, []
    for path in a.reports:
        with open(path) as f:
            report = json.load(f)
        merged.update(series(report))
        titles.append("%s, %d ranks" % (report["library"], report["world_size"]))
    plot(merged, a.plot, "; ".join(sorted(set(titles))))


if __name__ == "__main__":
    main()
