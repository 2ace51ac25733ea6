"""python/examples/ddp_digits.py on 4 ranks: DDP on the digits data with the
gflow backend and with gflow's communication hooks. The parameters must be
bit-identical on every rank, and the held-out accuracy within 1 point of
the same training over gloo (2 points for CSC, which sends a quarter of the
gradient chunks per step after a dense warm-up)."""

import os
import re

import pytest

from conftest import REPO, assert_all_ok, launch

EXAMPLE = os.path.join(REPO, "python", "examples", "ddp_digits.py")

pytest.importorskip("sklearn.datasets")


def train(*args, style="torchrun"):
    ranks = launch(4, [EXAMPLE] + list(args), style=style, timeout=180)
    assert_all_ok(ranks)
    results = []
    for r in ranks:
        m = re.search(r"rank=(\d) accuracy=([0-9.]+) params_sha256=([0-9a-f]{64})", r.stdout)
        assert m, repr(r)
        results.append((float(m.group(2)), m.group(3)))
    assert len({h for _, h in results}) == 1, "parameters differ across ranks: %s" % results
    return results[0]


@pytest.fixture(scope="module")
def gloo():
    return train("--backend", "gloo")


# The bf16 case runs with gflowrun's variables (the example's file-store path).
@pytest.mark.parametrize("args, tolerance, style", [
    (("--backend", "gflow"), 0.01, "torchrun"),
    (("--backend", "gloo", "--hook", "allreduce"), 0.01, "torchrun"),
    (("--backend", "gloo", "--hook", "fp16"), 0.01, "torchrun"),
    (("--backend", "gflow", "--hook", "bf16"), 0.01, "gflow"),
    (("--backend", "gloo", "--hook", "csc"), 0.02, "torchrun"),
    (("--backend", "gloo", "--hook", "int8"), 0.01, "torchrun"),
    (("--backend", "gloo", "--hook", "int4"), 0.01, "torchrun"),
    (("--backend", "gloo", "--hook", "auto"), 0.01, "torchrun"),
])
def test_ddp_matches_gloo(gloo, args, tolerance, style):
    accuracy, _ = train(*args, style=style)
    assert gloo[0] > 0.9, gloo
    assert abs(accuracy - gloo[0]) <= tolerance, (accuracy, gloo[0])
