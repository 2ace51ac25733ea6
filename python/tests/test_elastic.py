"""python/examples/elastic_ddp.py under gflowrun --elastic --max-restarts 1:
a rank kills itself (SIGKILL) during training; the survivors' backward()
raises, they shrink, rebuild the process group and DDP, and go on; the
replacement joins; every rank ends with the same parameter digest. With
torch's gloo process group and with gflow's."""

import os
import re
import subprocess
import sys

import pytest

from conftest import BUILD, PKG, REPO

pytest.importorskip("torch")
GFLOWRUN = os.path.join(BUILD, "tools", "gflowrun")


@pytest.mark.parametrize("backend,victim", [("gloo", 0), ("gflow", 2)])
def test_ddp_survives_a_lost_rank(tmp_path, backend, victim):
    if backend == "gflow":
        pytest.importorskip("gflow._gflow_torch")
    env = dict(os.environ, PYTHONPATH=PKG)
    for k in list(env):
        if k.startswith("GFLOW_") or k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            del env[k]
    cmd = [GFLOWRUN, "-n", "4", "--elastic", "--max-restarts", "1", "--timeout", "150",
           "--env", "GFLOW_TIMEOUT=10s", "--", sys.executable,
           os.path.join(REPO, "python", "examples", "elastic_ddp.py"),
           "--store-file", str(tmp_path / "job.store"), "--backend", backend,
           "--kill-rank", str(victim), "--kill-at", "3", "--steps", "60", "--step-ms", "150"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    digests = re.findall(r"^\[\d+\] digest ([0-9a-f]+) step 60", run.stdout, re.M)
    assert len(set(digests)) == 1, out
    assert len(re.findall(r"^\[\d+\] shrunk \d+ size 3", run.stdout, re.M)) == 3, out
    # The replacement (started once rank `victim` died) joined before the end.
    assert re.search(r"^\[4\] joined \d+ rank 3", run.stdout, re.M), out
    assert len(digests) == 4, out
