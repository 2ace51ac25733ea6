"""Process lifetime around gflow's completion thread: a process that exits
with work and callbacks still pending, or drops a Work in flight, exits
cleanly and promptly (no crash, no hang at interpreter shutdown); what a
Work keeps alive; callbacks of one communicator are not held up by an op
pending on another (two ranks in this process)."""

import gc
import os
import subprocess
import sys
import threading
import weakref

import numpy as np
import torch

from conftest import PKG, free_port
from waiting import wait_until

SCRIPT = """
import time, numpy as np, gflow
comm = gflow.create(rank=0, size=1, root="127.0.0.1:%d")
seen = []
for i in range(50):
    w = comm.allreduce(np.ones(1 << 16, np.float32), async_op=True)
    w.add_done_callback(lambda w: (time.sleep(0.01), seen.append(w.test())))
comm.allreduce(np.ones(1 << 20, np.float32), async_op=True)   # dropped in flight
print("issued", flush=True)
"""


def test_exit_with_pending_callbacks():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GFLOW_")}
    env["PYTHONPATH"] = PKG
    for _ in range(3):
        p = subprocess.run([sys.executable, "-c", SCRIPT % free_port()], env=env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "issued" in p.stdout and "Traceback" not in p.stderr, p.stderr


def pair(timeout=30):
    """Ranks 0 and 1 of one communicator, both in this process."""
    import gflow
    root = "127.0.0.1:%d" % free_port()
    comms = [None, None]

    def make(r):
        comms[r] = gflow.create(rank=r, size=2, root=root, timeout=timeout)

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(comms), "pair not created"
    return comms


def test_dropped_work_keeps_its_tensor_alive():
    a, b = pair()
    t = torch.ones(1 << 12)
    ref = weakref.ref(t)
    a.allreduce(t, async_op=True)  # the Work is dropped at once; b has not joined
    del t
    gc.collect()
    assert ref() is not None, "the tensor of an op in flight was freed"
    b.allreduce(torch.ones(1 << 12))
    wait_until(lambda: (gc.collect(), ref() is None)[1], what="release after completion")


def test_work_keeps_a_temporary_communicator_alive():
    import gflow
    x = np.ones(100, np.float32)
    w = gflow.create(rank=0, size=1, root="127.0.0.1:%d" % free_port()).allreduce(
        x, async_op=True)
    gc.collect()
    w.wait(timeout=30)
    assert x.tolist() == [1.0] * 100


def test_callbacks_of_one_communicator_do_not_wait_for_another():
    a, b = pair()
    import gflow
    other = gflow.create(rank=0, size=1, root="127.0.0.1:%d" % free_port())
    seen = []
    stuck = a.allreduce(np.ones(10, np.float32), async_op=True)  # b has not joined
    stuck.add_done_callback(lambda w: seen.append("stuck"))
    try:  # a sub-millisecond timeout is 1 ms, not "no limit"
        stuck.wait(0.0001)
    except gflow.TimeoutError:
        pass
    else:
        raise AssertionError("wait(0.0001) on a pending op did not time out")
    w = other.allreduce(np.ones(10, np.float32), async_op=True)
    w.add_done_callback(lambda w: seen.append("other"))
    wait_until(lambda: "other" in seen, timeout=10, what="the other communicator's callback")
    assert seen == ["other"]
    b.allreduce(np.ones(10, np.float32))
    stuck.wait(timeout=30)
    wait_until(lambda: "stuck" in seen, what="the first communicator's callback")
