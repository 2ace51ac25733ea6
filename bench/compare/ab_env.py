#!/usr/bin/python3
"""gflow under several environments (and optionally the peers) by interleaved rounds.

Each round runs allreduce_bw under gflowrun once per variant, then Open MPI
(--mpi) and Gloo's ring_chunked, halving_doubling and bcube (--gloo), back
to back. The table shows each variant's median busbw over the rounds and,
in brackets, the median of its per-round ratios to the reference: the last
peer when one runs, else the first variant. Used for the A/B tables of
docs/performance.md (congestion control, halving-doubling, polling budget).

  bench/compare/ab_env.py --np 4 --rounds 5 -b 1M -e 16M --mpi \\
      auto: hd:GFLOW_ALGO=hd s2m:GFLOW_SPIN_US=2000

--plot FILE.png also draws busbw against size, one line per variant and
peer. A variant is NAME:VAR=VALUE,VAR=VALUE (NAME: alone runs the defaults);
BUILD=DIR in a variant takes gflow from another build tree. --path tcp (the
default) runs gflow with GFLOW_SHM=0 GFLOW_SOCKET_IFNAME=lo and Open MPI's
btl tcp on lo; --path shm uses shared memory and vader.
"""
import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare as C  # noqa: E402  (run, best_of, human)

REPO = os.path.dirname(os.path.dirname(HERE))
GLOO = ["ring_chunked", "halving_doubling", "bcube"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("-b", default="1M")
    p.add_argument("-e", default="16M")
    p.add_argument("-f", default="4")
    p.add_argument("-n", default="20")
    p.add_argument("-w", default="3")
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--path", choices=["tcp", "shm"], default="tcp")
    p.add_argument("--mpi", action="store_true")
    p.add_argument("--gloo", action="store_true")
    p.add_argument("--op", default="allreduce", help="the collective (allreduce_bw --op)")
    p.add_argument("-d", default="float32", help="the element type (allreduce_bw -d)")
    p.add_argument("--plot", help="also write a PNG of busbw against size per variant and peer")
    p.add_argument("variants", nargs="+", help="NAME:VAR=VALUE,... (NAME: for the defaults)")
    return p.parse_args()


def variants(a):
    out = []
    for v in a.variants:
        name, _, kvs = v.partition(":")
        env = dict(os.environ)
        if a.path == "tcp":
            env.update(GFLOW_SHM="0", GFLOW_SOCKET_IFNAME="lo")
        for kv in filter(None, kvs.split(",")):
            k, _, val = kv.partition("=")
            env[k] = val
        out.append((name, env, env.pop("BUILD", a.build)))
    return out


def one_round(a, vs, sweep, res):
    for name, env, build in vs:
        res.setdefault(name, []).append(C.run(
            [build + "/tools/gflowrun", "-n", str(a.np), "--no-prefix", "--",
             build + "/bench/allreduce_bw"] + sweep, env, 900))
    if a.mpi:
        btl = ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"] \
            if a.path == "tcp" else ["--mca", "btl", "vader,self"]
        res.setdefault("mpi", []).append(C.run(
            ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1"] + btl +
            ["-np", str(a.np), a.build + "/bench/compare/mpi_allreduce_bw"] + sweep,
            dict(os.environ), 900))
    if a.gloo:
        res.setdefault("gloo", []).append(C.best_of(
            C.run([a.build + "/tools/gflowrun", "-n", str(a.np), "--no-prefix", "--",
                   a.build + "/bench/compare/gloo_allreduce_bw"] + sweep + ["-a", algo],
                  dict(os.environ), 900) for algo in GLOO))


def main():
    a = parse_args()
    sweep = ["-b", a.b, "-e", a.e, "-f", a.f, "-n", a.n, "-w", a.w, "-d", a.d, "-o",
             "sum", "-c", "0", "--csv", "--op", a.op]
    vs = variants(a)
    res = {}
    for r in range(a.rounds):
        one_round(a, vs, sweep, res)
        print("round %d/%d done" % (r + 1, a.rounds), file=sys.stderr)
    names = list(res)
    ref = names[-1] if (a.mpi or a.gloo) else names[0]
    sizes = sorted({s for rr in res[names[0]] if rr for s in rr})
    print("np=%d, %d rounds; busbw GB/s, median over rounds (median of per-round ratios to %s)"
          % (a.np, a.rounds, ref))
    print("size " + " ".join("%15s" % n for n in names))
    for s in sizes:
        cells = []
        for n in names:
            bw = [rr[s][0] for rr in res[n] if rr and s in rr]
            rat = [x[s][0] / y[s][0] for x, y in zip(res[n], res[ref])
                   if x and y and s in x and s in y and y[s][0] > 0]
            cells.append("%6.3f(%5.2f)" % (statistics.median(bw) if bw else 0,
                                           statistics.median(rat) if rat else 0))
        print("%4s " % C.human(s) + " ".join("%15s" % c for c in cells))
    if a.plot:
        series = {n: {s: C.med([rr[s][0] for rr in res[n] if rr and s in rr]) for s in sizes}
                  for n in names}
        C.plot_busbw(series, a.plot, "%s, %s, %d ranks, %s path, %d rounds"
                     % (a.op, a.d, a.np, a.path, a.rounds))


if __name__ == "__main__":
    main()
