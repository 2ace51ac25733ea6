"""Collectives, async Work, wire compression, the GIL and GradientReducer
(dense and CSC) on several ranks, against float64 / exact references
(worker_collectives.py holds the checks)."""

import os
import subprocess
import sys

import pytest

from conftest import BUILD, HERE, PKG, assert_all_ok, launch


def test_three_ranks_environment_of_gflowrun():
    assert_all_ok(launch(3, ["worker_collectives.py"], timeout=120))


def test_two_ranks_under_torchrun_variables():
    assert_all_ok(launch(2, ["worker_collectives.py"], style="torchrun", timeout=120))


def test_under_gflowrun():
    gflowrun = os.path.join(BUILD, "tools", "gflowrun")
    if not os.path.exists(gflowrun):
        pytest.skip("gflowrun not built (GFLOW_BUILD_TOOLS=OFF)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GFLOW_")}
    env["PYTHONPATH"] = PKG
    p = subprocess.run([gflowrun, "-n", "2", "--", sys.executable, "worker_collectives.py"],
                       cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 0 ok" in p.stdout and "rank 1 ok" in p.stdout
