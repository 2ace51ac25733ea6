#!/usr/bin/python3
"""gflow against Open MPI and Gloo by the interleaved method.

Each round runs, back to back, the same allreduce sweep with gflow
(allreduce_bw under gflowrun), Open MPI (mpi_allreduce_bw under mpirun) and
Gloo (gloo_allreduce_bw, one run per algorithm), for every world size. Each
library's figure in a round is its best of in-place and out-of-place (and,
for Gloo, of its algorithms). The table shows, per size, the median over
rounds of each library's bus bandwidth and the median of the per-round
ratios gflow / peer: this machine has slow phases lasting seconds, so only
runs of the same round are compared with each other.

  bench/compare/compare.py [--path tcp|shm] [--np 2 4] [--rounds 5]
                           [-b 4K] [-e 64M] [-f 4] [-n 30] [-w 5] [-o out.md]
                           [--plot busbw.png]

--path tcp: gflow over its TCP transport on loopback (GFLOW_SHM=0,
GFLOW_SOCKET_IFNAME=lo) against Open MPI's btl tcp on lo; --path shm:
gflow's shared memory against Open MPI's vader. Gloo (TCP on loopback)
runs on both paths unless --gloo is empty. Extra environment for gflow's
runs: --gflow-env VAR=VALUE (repeatable), e.g. to try a parameter.
"""
import argparse
import csv
import io
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Columns of the sweep CSV (bench/common/report.cc).
SIZE, OOP_TIME, OOP_BUSBW, OOP_WRONG, IP_TIME, IP_BUSBW, IP_WRONG = 3, 7, 9, 10, 11, 13, 14


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--path", choices=["tcp", "shm"], default="tcp")
    p.add_argument("--np", nargs="+", type=int, default=[2, 4])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("-b", default="4K")
    p.add_argument("-e", default="64M")
    p.add_argument("-f", default="4")
    p.add_argument("-n", default="30", help="timed iterations per size")
    p.add_argument("-w", default="5", help="warm-up iterations per size")
    p.add_argument("--gloo", nargs="*", default=["ring_chunked", "halving_doubling", "bcube"])
    p.add_argument("--no-mpi", action="store_true")
    p.add_argument("--gflow-env", action="append", default=[], metavar="VAR=VALUE")
    p.add_argument("--timeout", type=int, default=900, help="seconds one run may take")
    p.add_argument("-o", "--out", help="markdown file written besides stdout")
    p.add_argument("--plot", help="PNG of busbw against size per library (FILE.png; with "
                   "several --np, FILE-<np>.png)")
    return p.parse_args()


def sweep(a, check):
    return ["-b", a.b, "-e", a.e, "-f", a.f, "-n", a.n, "-w", a.w, "-d", "float32", "-o", "sum",
            "-c", "1" if check else "0", "--csv"]


def run(cmd, env, timeout):
    """One sweep: {size: (best busbw, time of that best, wrong count)}, or None."""
    try:
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout, text=True)
    except subprocess.TimeoutExpired:
        print("   timed out: " + " ".join(cmd), file=sys.stderr)
        return None
    if r.returncode != 0:
        print("   failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stderr[-800:]),
              file=sys.stderr)
        return None
    out = {}
    for row in csv.reader(io.StringIO(r.stdout)):
        if len(row) <= IP_WRONG or row[0] == "library":
            continue
        size = int(row[SIZE])
        best = None
        for bw, t, wrong in ((OOP_BUSBW, OOP_TIME, OOP_WRONG), (IP_BUSBW, IP_TIME, IP_WRONG)):
            try:
                cand = (float(row[bw]), float(row[t]), row[wrong])
            except ValueError:
                continue  # a mode that did not run ("-")
            if best is None or cand[0] > best[0]:
                best = cand
        if best:
            out[size] = best
    return out or None


def best_of(results):
    """Per size, the best of several sweeps (Gloo's algorithms)."""
    merged = {}
    for res in results:
        for size, v in (res or {}).items():
            if size not in merged or v[0] > merged[size][0]:
                merged[size] = v
    return merged or None


def round_once(a, np_, check, base_env):
    b = a.build
    gflowrun = os.path.join(b, "tools", "gflowrun")
    env = dict(base_env)
    if a.path == "tcp":
        env.update(GFLOW_SHM="0", GFLOW_SOCKET_IFNAME="lo")
    for kv in a.gflow_env:
        k, _, v = kv.partition("=")
        env[k] = v
    res = {"gflow": run([gflowrun, "-n", str(np_), "--no-prefix", "--",
                         os.path.join(b, "bench", "allreduce_bw")] + sweep(a, check),
                        env, a.timeout)}
    mpi_bw = os.path.join(b, "bench", "compare", "mpi_allreduce_bw")
    if not a.no_mpi and os.access(mpi_bw, os.X_OK) and shutil.which("mpirun"):
        btl = ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"] \
            if a.path == "tcp" else ["--mca", "btl", "vader,self"]
        res["mpi"] = run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "pml",
                          "ob1"] + btl + ["-np", str(np_), mpi_bw] + sweep(a, check),
                         base_env, a.timeout)
    gloo_bw = os.path.join(b, "bench", "compare", "gloo_allreduce_bw")
    if a.gloo and os.access(gloo_bw, os.X_OK):
        res["gloo"] = best_of(
            run([gflowrun, "-n", str(np_), "--no-prefix", "--", gloo_bw] + sweep(a, check) +
                ["-a", algo], base_env, a.timeout) for algo in a.gloo)
    return res


def human(s):
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if s >= k and s % k == 0:
            return "%d%s" % (s // k, unit)
    return str(s)


def med(xs):
    return statistics.median(xs) if xs else None


def fmt(x, spec):
    return "-" if x is None else spec % x


def plot_busbw(series, path, title):
    """Writes a PNG of busbw against size, one line per series
    (name -> {size: GB/s}; bench/plot_busbw.py draws it)."""
    sys.path.insert(0, os.path.dirname(HERE))
    import plot_busbw
    plot_busbw.plot({k: {s: v for s, v in p.items() if v is not None} for k, p in series.items()},
                    path, title)


def table(rounds, np_):
    peers = [p for p in ("mpi", "gloo") if any(r.get(p) for r in rounds)]
    sizes = sorted({s for r in rounds if r.get("gflow") for s in r["gflow"]})
    hdr = ["size", "gflow busbw"] + ["%s busbw" % p for p in peers] + \
          ["gflow / %s" % p for p in peers] + ["time us"] + ["time / %s" % p for p in peers]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---:|" * len(hdr)]
    wrong = []
    for s in sizes:
        g = [r["gflow"][s] for r in rounds if r.get("gflow") and s in r["gflow"]]
        row = [human(s), fmt(med([x[0] for x in g]), "%.3f")]
        ratios, tratios = [], []
        for p in peers:
            pv = [r[p][s] for r in rounds if r.get(p) and s in r[p]]
            row.append(fmt(med([x[0] for x in pv]), "%.3f"))
            both = [(r["gflow"][s], r[p][s]) for r in rounds
                    if r.get("gflow") and r.get(p) and s in r["gflow"] and s in r[p]]
            per_round = [x[0] / y[0] for x, y in both if y[0] > 0]
            ratios.append(fmt(med(per_round), "%.2f") +
                          (" (%.2f-%.2f)" % (min(per_round), max(per_round))
                           if len(per_round) > 1 else ""))
            # < 1: gflow takes less time.
            tratios.append(fmt(med([x[1] / y[1] for x, y in both if y[1] > 0]), "%.2f"))
        row += ratios + [fmt(med([x[1] for x in g]), "%.1f")] + tratios
        lines.append("| " + " | ".join(row) + " |")
        for r in rounds:
            for lib, res in r.items():
                if res and s in res and res[s][2] not in ("0", "", "N/A"):
                    wrong.append("%s at %s (%s wrong)" % (lib, human(s), res[s][2]))
    if wrong:
        lines.append("")
        lines.append("Wrong results: " + ", ".join(sorted(set(wrong))))
    return "\n".join(lines)


def main():
    a = parse_args()
    if not os.access(os.path.join(a.build, "bench", "allreduce_bw"), os.X_OK):
        sys.exit("compare.py: build allreduce_bw and gflowrun in %s first (or pass --build)"
                 % a.build)
    base_env = dict(os.environ)
    per_np = {n: [] for n in a.np}
    start = time.time()
    for r in range(a.rounds):
        for n in a.np:
            print("== round %d/%d, %d ranks" % (r + 1, a.rounds, n), file=sys.stderr)
            per_np[n].append(round_once(a, n, r == 0, base_env))
    head = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                          stdout=subprocess.PIPE, text=True).stdout.strip()
    out = ["# gflow against Open MPI and Gloo: allreduce, float32 sum, %s" % a.path, "",
           "- gflow %s; %d cores; %d interleaved rounds in %.0f s; sizes %s..%s x%s, "
           "%s iterations, %s warm-up" % (head, os.cpu_count(), a.rounds, time.time() - start,
                                          a.b, a.e, a.f, a.n, a.w),
           "- each library's figure per round: its best of in-place and out-of-place"
           "%s; columns: medians over rounds, ratios the median of per-round ratios "
           "(busbw's with their range; busbw ratio > 1 and time ratio < 1: gflow is faster)"
           % (" and of Gloo's %s" % ", ".join(a.gloo) if a.gloo else ""),
           "- gflow path: %s; Open MPI: %s" %
           ("TCP on loopback (GFLOW_SHM=0)" if a.path == "tcp" else "shared memory",
            "ob1, btl tcp on lo" if a.path == "tcp" else "ob1, btl vader")]
    if a.gflow_env:
        out.append("- gflow environment: " + " ".join(a.gflow_env))
    for n in a.np:
        out += ["", "## %d ranks" % n, "", table(per_np[n], n)]
    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    for n in a.np if a.plot else []:
        libs = sorted({lib for r in per_np[n] for lib in r if r[lib]}, key=lambda x: x != "gflow")
        sizes = sorted({s for r in per_np[n] for lib in libs if r.get(lib) for s in r[lib]})
        series = {lib: {s: med([r[lib][s][0] for r in per_np[n] if r.get(lib) and s in r[lib]])
                        for s in sizes} for lib in libs}
        path = a.plot if len(a.np) == 1 else a.plot.replace(".png", "") + "-%d.png" % n
        plot_busbw(series, path, "allreduce float32 sum, %d ranks, %s path, %d rounds"
                   % (n, a.path, a.rounds))


if __name__ == "__main__":
    main()
