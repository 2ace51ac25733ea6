"""One rank of bench/netns/op_sequence.sh: a step's allreduces of the given
sizes (MB of float32), submitted at once and run one after another on one
communicator, as DDP's buckets are; prints on rank 0 each op's median time
(from the previous op's end on rank 0) beside its bytes at the link rate.

    python3 bench/netns/op_sequence.py --sizes 8.2,31.5,26.3,26.6,9.7 --rate 1gbit
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

import gflow

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from report import link_bytes_per_s, wire_bytes  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", required=True, help="MB of float32 per op, comma-separated")
    p.add_argument("--rate", required=True, help="the host link's rate, tc syntax")
    p.add_argument("--steps", type=int, default=6, help="timed steps (after one untimed)")
    p.add_argument("--idle", type=float, default=0.0, help="seconds idle before each step")
    p.add_argument("--mtu", type=int, default=1500)
    p.add_argument("--op", default="avg", help="the reduction (DDP's hooks average)")
    p.add_argument("--wire", default=None,
                   help="the wire type (AllreduceOptions::wire: float16, bfloat16, qint8, qint4; "
                   "default: float32)")
    args = p.parse_args()
    comm = gflow.init()
    mb = [float(x) for x in args.sizes.split(",")]
    bufs = [np.ones(int(m * 1e6 / 4), np.float32) for m in mb]
    ends = []
    sent0 = comm.stats()["bytes_sent"]
    for step in range(args.steps + 1):
        comm.barrier()
        time.sleep(args.idle)
        t0 = time.perf_counter()
        works = [comm.allreduce(b, args.op, wire=args.wire, async_op=True) for b in bufs]
        mine = []
        for w in works:
            w.wait()
            mine.append(time.perf_counter() - t0)
        if step:
            ends.append(mine)
    # What this rank sent per step (the wire type's bytes, whatever the
    # algorithm), shared among the ops by their sizes.
    sent_per_step = (comm.stats()["bytes_sent"] - sent0) / (args.steps + 1)
    if comm.rank:
        return
    link = link_bytes_per_s(args.rate)
    print("| op | MB | ms (median over %d steps) | ms at the link rate | ratio |" % args.steps)
    print("|---|---:|---:|---:|---:|")
    prev, total, total_link = 0.0, 0.0, 0.0
    for i, m in enumerate(mb):
        end = statistics.median(e[i] for e in ends)
        wire = 1e3 * wire_bytes(sent_per_step * m / sum(mb), args.mtu) / link
        print("| %d | %.1f | %.0f | %.0f | %.2f |" % (i, m, 1e3 * (end - prev), wire,
                                                    1e3 * (end - prev) / wire))
        total, total_link, prev = 1e3 * end, total_link + wire, end
    print("| all | %.1f | %.0f | %.0f | %.3f |" % (sum(mb), total, total_link, total / total_link))


if __name__ == "__main__":
    main()
