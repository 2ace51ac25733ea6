"""Process lifetime around gflow's completion thread: a process that exits
with work and callbacks still pending, or drops a Work in flight, exits
cleanly and promptly (no crash, no hang at interpreter shutdown)."""

import os
import subprocess
import sys

from conftest import PKG, free_port

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
