"""pytest setup for gflow's Python package (docs/testing.md).

The package is imported from the CMake build tree: $GFLOW_BUILD_DIR/python
(default: <repo>/build/python). Multi-rank tests start one process per rank
with the variables gflowrun sets (GFLOW_RANK, GFLOW_WORLD_SIZE, GFLOW_ROOT,
GFLOW_JOB_TOKEN, ...) or torchrun's, each under a timeout, and collect every
rank's exit status and output (written to files, so that a chatty rank
never blocks on a full pipe).
"""

import os
import random
import secrets
import socket
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("GFLOW_BUILD_DIR", os.path.join(REPO, "build")))
PKG = os.path.join(BUILD, "python")
HERE = os.path.dirname(os.path.abspath(__file__))

if not os.path.exists(os.path.join(PKG, "gflow", "__init__.py")):
    pytest.exit("gflow's Python package is not built in %s (GFLOW_BUILD_PYTHON needs "
                "pybind11-dev and python3-dev)" % PKG, returncode=1)
sys.path.insert(0, PKG)


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port(consecutive=1):
    """A port p such that p .. p+consecutive-1 were free just now.

    Drawn below the kernel's ephemeral range: a port picked from inside it can
    be handed to an outgoing connection (torch's or gloo's own sockets in the
    same job) between this check and the rank that binds it.
    """
    lo, hi = _ephemeral_range()
    if lo - consecutive > 20000:
        bottom, top = 20000, lo - consecutive
    elif hi < 65535 - consecutive - 1000:
        bottom, top = hi + 1, 65535 - consecutive
    else:  # the whole space is ephemeral: any port, and hope
        bottom, top = 1024, 65535 - consecutive
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(bottom, top)
        held = []
        try:
            for i in range(consecutive):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port + i))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        return port
    raise RuntimeError("no free port")


class Rank:
    def __init__(self, rank, returncode, stdout, stderr):
        self.rank, self.returncode, self.stdout, self.stderr = rank, returncode, stdout, stderr

    def __repr__(self):
        return "rank %d rc=%s\n--- stdout\n%s--- stderr\n%s" % (
            self.rank, self.returncode, self.stdout, self.stderr[-3000:])


def launch(n, argv, style="gflow", env=None, timeout=90):
    """Runs `argv` (after the Python interpreter) as n ranks; returns [Rank].

    style "gflow": the variables gflowrun sets; "torchrun": RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT (gflow's own store then uses MASTER_PORT+1).
    A rank still running after `timeout` seconds is killed (returncode None).
    """
    port = free_port(2)
    token = secrets.token_hex(16)
    procs = []
    for r in range(n):
        e = dict(os.environ)
        for k in list(e):
            if k.startswith("GFLOW_") and k != "GFLOW_BUILD_DIR" or k in (
                    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                    "MASTER_PORT"):
                del e[k]
        e["PYTHONPATH"] = PKG + os.pathsep + HERE
        e["OMP_NUM_THREADS"] = "1"
        if style == "gflow":
            e.update(GFLOW_RANK=str(r), GFLOW_WORLD_SIZE=str(n), GFLOW_LOCAL_RANK=str(r),
                     GFLOW_LOCAL_SIZE=str(n), GFLOW_ROOT="127.0.0.1:%d" % port,
                     GFLOW_JOB_TOKEN=token)
        else:
            e.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GFLOW_JOB_TOKEN=token)
        e.update(env or {})
        out = tempfile.TemporaryFile("w+")
        err = tempfile.TemporaryFile("w+")
        procs.append((subprocess.Popen([sys.executable] + list(argv), env=e, cwd=HERE,
                                       stdout=out, stderr=err, text=True), out, err))
    deadline = time.monotonic() + timeout
    codes = []
    for p, _, _ in procs:
        try:
            codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            codes.append(None)
    ranks = []
    for r, (p, out, err) in enumerate(procs):
        out.seek(0)
        err.seek(0)
        ranks.append(Rank(r, codes[r], out.read(), err.read()))
        out.close()
        err.close()
    return ranks


def assert_all_ok(ranks):
    for r in ranks:
        assert r.returncode == 0, repr(r)


@pytest.fixture
def single():
    """A one-rank communicator (its own TCP store on a free port)."""
    yield make_single()


def make_single():
    """A fresh one-rank communicator (an argument error fails its communicator)."""
    import gflow
    return gflow.create(rank=0, size=1, root="127.0.0.1:%d" % free_port(), timeout=30)
