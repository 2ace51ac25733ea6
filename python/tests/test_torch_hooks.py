"""gflow.torch's DDP hooks on one rank with a stand-in GradBucket: the
future is completed by gflow's completion thread with the bucket's buffer,
CSC keeps one reducer per bucket and replaces it when DDP rebuilds the
bucket, and misuse raises gflow errors."""

import numpy as np
import pytest
import torch

import gflow
import gflow.torch as gt


class Bucket:
    def __init__(self, tensor, index=0):
        self._t, self._i = tensor, index

    def buffer(self):
        return self._t

    def index(self):
        return self._i


@pytest.mark.parametrize("hook", [gt.allreduce_hook, gt.fp16_compress_hook,
                                  gt.bf16_compress_hook])
def test_dense_hooks_complete_the_future(single, hook):
    buf = (torch.arange(1000) % 128).float() / 8  # 7 significant bits: exact in (b)f16
    want = buf.clone()
    fut = hook(single, Bucket(buf))
    assert isinstance(fut, torch.futures.Future)
    got = fut.wait()
    assert got.data_ptr() == buf.data_ptr()
    assert torch.equal(got, want)  # one rank: the average is the input


def test_hook_state_forms(single):
    buf = torch.ones(10)
    assert torch.equal(gt.allreduce_hook(gt.HookState(single), Bucket(buf)).wait(), buf)


def test_compressed_hook_rejects_other_dtypes(single):
    with pytest.raises(gflow.InvalidArgumentError, match="float32"):
        gt.fp16_compress_hook(single, Bucket(torch.ones(4, dtype=torch.float64)))


def test_csc_hook_reducer_per_bucket(single):
    state = gt.CSCState(single, density=0.5, chunk=4)
    a, b = torch.ones(16), torch.ones(32)
    for _ in range(2):
        a.fill_(1.0)
        b.fill_(2.0)
        fa = gt.csc_hook(state, Bucket(a, 0))
        fb = gt.csc_hook(state, Bucket(b, 1))
        fa.wait()
        fb.wait()
    assert sorted(state._reducers) == [0, 1]
    first = state._reducers[0][2]
    # DDP rebuilt bucket 0 (new memory): a new reducer.
    gt.csc_hook(state, Bucket(torch.ones(16), 0)).wait()
    assert state._reducers[0][2] is not first
    with pytest.raises(gflow.InvalidArgumentError, match="CSCState"):
        gt.csc_hook(single, Bucket(a))


def test_backend_registered():
    import torch.distributed as dist
    assert dist.Backend.GFLOW == "GFLOW"
    gt.register_backend()  # idempotent


def test_future_gets_the_error():
    fut = torch.futures.Future()

    class Failed:
        def wait(self):
            raise gflow.PeerLostError("peer 3 vanished")

    gt._complete(fut, None, Failed())
    with pytest.raises(gflow.PeerLostError, match="peer 3 vanished"):
        fut.wait()
