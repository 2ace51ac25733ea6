"""One rank of test_errors.py's multi-rank failures; argv[1] is the case.
Each surviving rank must get the named gflow.Error (with its context)
within the deadline, then prints "expected error" and exits 0."""

import os
import sys
import time

import numpy as np

import gflow

case = sys.argv[1]
comm = gflow.init(timeout={"timeout": 2, "bad_input": 60}.get(case, 5))
R = comm.rank


def expect(cls, fn):
    try:
        fn()
    except cls as e:
        assert e.code == type(e).code and e.rank == R, (e.code, e.rank)
        print("expected error %s op=%r seq=%d peer=%d: %s" % (
            type(e).__name__, e.op, e.seq, e.peer, e), flush=True)
        return e
    raise AssertionError("no %s" % cls.__name__)


comm.barrier()
if case == "mismatch":
    # Rank 1 passes a different count: every rank gets MismatchError.
    n = 100 if R != 1 else 101
    e = expect(gflow.MismatchError, lambda: comm.allreduce(np.ones(n, np.float32)))
    assert e.op == "allreduce" and e.seq > 0
elif case == "timeout":
    # Rank 2 never joins the allreduce (it stays alive): the others time out.
    if R == 2:
        time.sleep(6)
        print("expected error (rank 2 never called)")
        sys.exit(0)
    start = time.time()
    e = expect(gflow.TimeoutError, lambda: comm.allreduce(np.ones(1000, np.float32)))
    assert e.peer == 2 and e.op == "allreduce", (e.peer, e.op)
    assert time.time() - start < 20
elif case == "peer_lost":
    # Rank 2 dies without a word; the others' async allreduce fails.
    if R == 2:
        time.sleep(0.5)  # the others are waiting in the allreduce when it dies
        os._exit(0)
    w = comm.allreduce(np.ones(1 << 16, np.float32), async_op=True)
    start = time.time()
    expect(gflow.PeerLostError, lambda: w.wait(timeout=30))
    assert time.time() - start < 20
    expect(gflow.PeerLostError, comm.barrier)  # the communicator stays failed
elif case == "bad_input":
    # Rank 1 passes a read-only array: it raises InvalidArgumentError and
    # the allreduce is rejected; the others, already in it, raise
    # MismatchError naming the rejection at once (not after the 60 s
    # deadline).
    if R == 1:
        time.sleep(0.5)  # the others are waiting in the allreduce
        ro = np.ones(1000, np.float32)
        ro.flags.writeable = False
        e = expect(gflow.InvalidArgumentError, lambda: comm.allreduce(ro))
        assert e.op == "allreduce" and "read-only" in str(e), e
    else:
        start = time.time()
        e = expect(gflow.MismatchError, lambda: comm.allreduce(np.ones(1000, np.float32)))
        assert time.time() - start < 10, time.time() - start
        assert "read-only" in str(e) and "rank 1 rejected" in str(e), str(e)
    # The ranks disagreed about the op: every rank's next call raises.
    expect(gflow.Error, comm.barrier)
