"""What only torch 2.x has, on the gflow backend (worker_torch2.py, 3
ranks): the per-device Backend, all_gather_into_tensor /
reduce_scatter_tensor / all_to_all_single and their coalesced forms,
PREMUL_SUM, sparse allreduce, functional collectives, a DeviceMesh with
DTensor redistribution, DDP and FSDP on CPU. Run on torch 2.x by
scripts/torch2_tests.sh (a Debian trixie chroot); skipped, saying so, on
torch 1.13."""

import pytest
import torch

from conftest import assert_all_ok, launch

CHECKS = ["backend", "tensor_collectives", "coalesced", "premul_sum", "sparse",
          "functional_collectives", "device_mesh_dtensor", "ddp", "fsdp_cpu", "end"]


@pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                    reason="torch %s: these are torch 2.x's APIs (scripts/torch2_tests.sh "
                    "runs them on torch 2.6)" % torch.__version__)
def test_torch2_apis_on_the_gflow_backend():
    ranks = launch(3, ["worker_torch2.py"], style="torchrun", timeout=180)
    assert_all_ok(ranks)
    for r in ranks:
        done = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("checked ")]
        assert done == CHECKS, (r.rank, done, r.stderr[-2000:])
