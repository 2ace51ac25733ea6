"""Tables and a plot from bench/train/netns_ddp.sh's results.jsonl: per link
rate and model, each mode's images/s (median over rounds, with the range),
its efficiency against the no-exchange run, its speed against DDP on gloo,
its seconds per step beside the step's bound (bound_s) and their ratio,
the bytes host 0's link sent per step, the median time of forward,
backward and the optimizer step, DDP's exchange (its first bucket's launch
to its last one's end) beside the time the bytes sent take at the link's
rate (with every frame's headers: wire_bytes), the CPU a rank used per step (and of it gflow's progress thread's),
and whether the parameters ended identical on every rank. --plot writes efficiency per mode and rate.

    python3 bench/train/report.py results.jsonl [--plot plot.png]
"""

import argparse
import json
import statistics
import sys
from collections import OrderedDict


def load(path):
    runs = OrderedDict()  # (rate, model) -> mode -> [run]
    with open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                model = d["model"] + (" (emulated GPU compute)" if d.get("emulate_gpu") else "")
                runs.setdefault((d["rate"], model), OrderedDict()).setdefault(
                    label(d), []).append(d)
    return runs


def label(run):
    """The mode, with its DDP bucket cap unless that is DDP's default (25 MB)
    or there is no DDP (mode none), and "bucket views" with
    gradient_as_bucket_view."""
    bucket = run.get("bucket_mb", 25)
    name = run["mode"]
    if bucket != 25 and run["mode"] != "none":
        name += ", %g MB buckets" % bucket
    if run.get("bucket_view"):
        name += ", bucket views"
    return name


def link_bytes_per_s(rate):
    """A tc rate ("1gbit", "500mbit") in bytes/s; None for "none" or unknown."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for unit, scale in units.items():
        if rate.endswith(unit):
            try:
                return float(rate[:-len(unit)]) * scale / 8
            except ValueError:
                return None
    return None


# A TCP segment's frame headers: Ethernet 14, IPv4 20, TCP 20 + timestamps 12.
FRAME_HEADERS = 66


def wire_bytes(sent, mtu):
    """The bytes a link carries for `sent` bytes of an interface's tx
    counter. The counter takes a GSO packet (up to 64 KB) with one set of
    headers; the link carries it as MTU-sized frames with a set each: about
    4.6% more at MTU 1500, which a tc rate limits too."""
    if sent is None or not mtu:
        return sent
    return sent * (mtu + 14) / (mtu + 14 - FRAME_HEADERS)


def median_of(rs, key):
    values = [r.get(key) for r in rs]
    return statistics.median(values) if values and None not in values else None


def summarize(modes, rate="none"):
    base = modes.get("none")
    none_ips = statistics.median(r["images_per_s"] for r in base) if base else None
    link = link_bytes_per_s(rate)
    rows = []
    for mode, rs in modes.items():
        ips = [r["images_per_s"] for r in rs]
        med = statistics.median(ips)
        sent = median_of(rs, "host_tx_bytes_per_step")
        wire = median_of(rs, "host_wire_bytes_per_step") or sent
        # against gloo with the same DDP buckets, else gloo with DDP's default
        gloo = modes.get(label(dict(rs[0], mode="gloo"))) or modes.get("gloo")
        gloo_ips = statistics.median(r["images_per_s"] for r in gloo) if gloo else None
        # Without an exchange the ranks must drift apart; with one, never.
        exchanges = rs[0]["mode"] not in ("none", "ddp-noop")
        rows.append({
            "mode": mode, "ips": med, "lo": min(ips), "hi": max(ips), "runs": len(rs),
            "eff": med / none_ips if none_ips else None,
            "vs_gloo": med / gloo_ips if gloo_ips else None,
            "mb_per_step": sent / 1e6 if sent else None,
            "step_s": median_of(rs, "s_per_step"),
            "bound_s": median_of(rs, "bound_s"),
            # each run's step against its own bound
            "vs_bound": statistics.median(r["s_per_step"] / r["bound_s"] for r in rs)
            if None not in [r.get("bound_s") for r in rs] else None,
            "phases": [median_of(rs, k) for k in ("forward_ms", "backward_ms", "optimizer_ms")],
            "exchange_ms": median_of(rs, "ddp_exchange_ms"),
            "cpu_ms": [median_of(rs, k) for k in ("cpu_ms_per_step", "progress_user_ms_per_step",
                                                  "progress_system_ms_per_step")],
            # the time the bytes sent take at the link's rate (every frame's headers)
            "wire_ms": 1e3 * wire / link if wire and link else None,
            "exchanges": exchanges,
            "ok": all(r["params_identical"] == exchanges for r in rs),
        })
    return rows


def cpu_text(cpu):
    """"process (user / system)" with the progress thread's part when it ran."""
    total, user, system = cpu
    if total is None:
        return ""
    return "%.0f" % total + (" (%.0f / %.0f)" % (user, system) if user or system else "")


def table(key, rows):
    rate, model = key
    out = ["", "%s, links %s" % (model, rate), "",
           "| mode | img/s (median, range) | efficiency | vs gloo "
           "| s per step (bound; step / bound) "
           "| MB host 0 sent per step "
           "| ms forward / backward / optimizer | ms DDP exchange (at link rate) "
           "| CPU ms per step and rank (gflow progress thread: user / system) | parameters |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append("| %s | %.1f (%.1f-%.1f, %d runs) | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["mode"], r["ips"], r["lo"], r["hi"], r["runs"],
            "%.0f%%" % (100 * r["eff"]) if r["eff"] else "",
            "%.2f" % r["vs_gloo"] if r["vs_gloo"] else "",
            "%.3f" % r["step_s"] + (" (%.3f; %.3f)" % (r["bound_s"], r["vs_bound"])
                                    if r["vs_bound"] else ""),
            "%.1f" % r["mb_per_step"] if r["mb_per_step"] else "",
            " / ".join("%.0f" % v for v in r["phases"]) if None not in r["phases"] else "",
            ("%.0f" % r["exchange_ms"] if r["exchange_ms"] else "") +
            (" (%.0f)" % r["wire_ms"] if r["wire_ms"] and r["exchange_ms"] else ""),
            cpu_text(r["cpu_ms"]),
            ("identical" if r["exchanges"] else "differ (no exchange)")
            if r["ok"]
            else "WRONG"))
    return "\n".join(out)


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(OrderedDict((m, None) for _, m in runs))
    fig, axes = plt.subplots(len(models), 1, figsize=(9, 3.6 * len(models)), squeeze=False)
    for ax, model in zip(axes[:, 0], models):
        keys = [k for k in runs if k[1] == model]
        modes = list(OrderedDict((mo, None) for k in keys for mo in runs[k] if mo != "none"))
        width = 0.8 / max(1, len(keys))
        top = 100.0
        for i, key in enumerate(keys):
            rows = {r["mode"]: r for r in summarize(runs[key], key[0])}
            eff = [100 * rows[m]["eff"] if m in rows and rows[m]["eff"] else 0 for m in modes]
            top = max([top] + eff)
            ax.bar([x + i * width for x in range(len(modes))], eff, width, label="links " + key[0])
        ax.set_xticks([x + width * (len(keys) - 1) / 2 for x in range(len(modes))])
        ax.set_xticklabels(modes, rotation=20)
        ax.set_ylabel("efficiency vs no exchange (%)")
        ax.set_ylim(0, 1.05 * top)  # above 100%: see performance.md (more ranks than cores)
        ax.set_title("%s, synthetic DDP, images/s against the compute bound" % model)
        ax.axhline(100, color="gray", linewidth=0.8)
        ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results")
    p.add_argument("--plot", help="write a PNG of efficiency per mode and link rate")
    args = p.parse_args()
    runs = load(args.results)
    ok = True
    for key, modes in runs.items():
        rows = summarize(modes, key[0])
        ok = ok and all(r["ok"] for r in rows)
        print(table(key, rows))
    if args.plot and runs:
        plot(runs, args.plot)
        print("\nplot: %s" % args.plot)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
