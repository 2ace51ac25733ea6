"""gflow.torch's DDP hooks on one rank with a stand-in GradBucket: the
future is completed by gflow's completion thread with the bucket's buffer,
CSC keeps one reducer per bucket, replaces it when DDP rebuilds the bucket
and drops those of vanished buckets, misuse raises gflow errors, and a
failure is an error of the future's C++ side (what DDP waits on). On 3
ranks (worker_hooks.py): every hook against the float64 average, and a DDP
step whose peer died raises the gflow error."""

import numpy as np
import pytest
import torch

import gflow
import gflow.torch as gt
from conftest import assert_all_ok, launch
from waiting import wait_future


class Bucket:
    def __init__(self, tensor, index=0, last=False):
        self._t, self._i, self._last = tensor, index, last

    def buffer(self):
        return self._t

    def index(self):
        return self._i

    def is_last(self):
        return self._last


@pytest.mark.parametrize("hook", [gt.allreduce_hook, gt.fp16_compress_hook,
                                  gt.bf16_compress_hook])
def test_dense_hooks_complete_the_future(single, hook):
    buf = (torch.arange(1000) % 128).float() / 8  # 7 significant bits: exact in (b)f16
    want = buf.clone()
    fut = hook(single, Bucket(buf))
    assert isinstance(fut, torch._C.Future)  # what then() returns; DDP takes it
    got = wait_future(fut)
    assert got.data_ptr() == buf.data_ptr()
    assert torch.equal(got, want)  # one rank: the average is the input


def test_hook_state_forms(single):
    buf = torch.ones(10)
    assert torch.equal(wait_future(gt.allreduce_hook(gt.HookState(single), Bucket(buf))), buf)


def test_compressed_hook_rejects_other_dtypes(single):
    with pytest.raises(gflow.InvalidArgumentError, match="float32"):
        gt.fp16_compress_hook(single, Bucket(torch.ones(4, dtype=torch.float64)))


@pytest.mark.parametrize("hook,qmax", [(gt.int8_compress_hook, 127), (gt.int4_compress_hook, 7)])
def test_quantized_hooks_feed_the_error_back(single, hook, qmax):
    # One rank: the result is this rank's bucket quantized; what that lost
    # is in the state's residual and goes out with the next step, so the
    # sum over steps stays within one quantization step of the exact sum.
    x = torch.full((300,), 0.3)
    x[::128] = 1.0  # each block's largest magnitude
    state = gt.QuantizedState(single)
    total = torch.zeros(300, dtype=torch.float64)
    buf = torch.empty(300)  # DDP keeps a bucket's buffer from step to step
    for _ in range(40):
        buf.copy_(x)
        got = wait_future(hook(state, Bucket(buf, 0)))
        assert got.data_ptr() == buf.data_ptr()
        total += got.double()
    assert float((total - 40 * x.double()).abs().max()) <= 1.0 / qmax
    residual = state.residual_for(buf, 0)
    assert residual.abs().max() > 0 and residual.abs().max() <= 0.5 / qmax + 1e-6
    # Without feedback the same error piles up with every step.
    plain = gt.QuantizedState(single, error_feedback=False)
    total.zero_()
    for _ in range(40):
        buf.copy_(x)
        total += wait_future(hook(plain, Bucket(buf, 0))).double()
    assert float((total - 40 * x.double()).abs().max()) > 2.0 / qmax
    # A rebuilt bucket (another buffer) starts from a zero residual.
    assert torch.equal(state.residual_for(torch.ones(64), 0), torch.zeros(64))


def test_quantized_hooks_need_their_state(single):
    with pytest.raises(gflow.InvalidArgumentError, match="QuantizedState"):
        gt.int8_compress_hook(single, Bucket(torch.ones(4)))
    with pytest.raises(gflow.InvalidArgumentError, match="float32"):
        gt.int4_compress_hook(gt.QuantizedState(single),
                              Bucket(torch.ones(4, dtype=torch.float64)))
    buf = torch.ones(10)  # the communicator stays usable
    assert torch.equal(wait_future(gt.allreduce_hook(single, Bucket(buf))), buf)


def test_csc_hook_reducer_per_bucket(single):
    state = gt.CSCState(single, density=0.5, chunk=4)
    a, b = torch.ones(16), torch.ones(32)
    for _ in range(2):
        a.fill_(1.0)
        b.fill_(2.0)
        fa = gt.csc_hook(state, Bucket(a, 0))
        fb = gt.csc_hook(state, Bucket(b, 1))
        wait_future(fa)
        wait_future(fb)
    assert sorted(state._reducers) == [0, 1]
    first = state._reducers[0][2]
    # DDP rebuilt bucket 0 (new memory): a new reducer.
    wait_future(gt.csc_hook(state, Bucket(torch.ones(16), 0)))
    assert state._reducers[0][2] is not first
    # DDP rebuilt its buckets into one: bucket 0 is now the last one; the
    # reducer of bucket 1 is dropped.
    wait_future(gt.csc_hook(state, Bucket(torch.ones(48), 0, last=True)))
    assert sorted(state._reducers) == [0]
    with pytest.raises(gflow.InvalidArgumentError, match="CSCState"):
        gt.csc_hook(single, Bucket(a))
    # The hook's collective was rejected: the communicator stays usable.
    single.barrier()


def test_auto_hook_is_dense_until_ddps_buckets_settle_then_a_chooser_picks(single):
    state = gt.AutoState(single, warmup_steps=2, probe_steps=1, period=2, reprobe=0)
    first = [torch.full((300,), 0.5), torch.full((200,), 0.25)]
    final = [torch.full((300,), 0.5), torch.full((200,), 0.25)]

    def iteration(bufs):
        futures = [gt.auto_compress_hook(state, Bucket(b, i, i == len(bufs) - 1))
                   for i, b in enumerate(bufs)]
        return [wait_future(f) for f in futures]

    iteration(first)  # DDP's first layout: dense
    assert state.chooser is None
    for _ in range(2):  # the rebuilt layout, twice: the chooser starts
        got = iteration(final)
        assert all(g.data_ptr() == b.data_ptr() for g, b in zip(got, final))
    assert state.chooser is not None and state.wires == ["float32", "float32"]
    seen = []
    for _ in range(6):
        seen.append(state.wires[0])
        got = iteration(final)
        assert torch.allclose(got[0], torch.full((300,), 0.5), atol=0.5 / 14)
        assert torch.allclose(got[1], torch.full((200,), 0.25), atol=0.25 / 14)
    # A step is finished at the next iteration's first bucket, so each
    # choice shows one iteration later: warm-up and the probe's float32
    # stage, then one step on each other wire.
    assert seen == ["float32", "float32", "float32", "bfloat16", "qint8", "qint4"], seen
    assert state.chooser.steps == 5
    assert set(state._residuals) == {0, 1}  # error feedback on the quantized steps
    iteration(first)  # DDP moved its buckets: the chooser goes, dense again
    assert state.chooser is None


def test_auto_hook_needs_its_state(single):
    with pytest.raises(gflow.InvalidArgumentError, match="AutoState"):
        gt.auto_compress_hook(gt.QuantizedState(single), Bucket(torch.ones(4), 0, True))


def test_backend_registered():
    import torch.distributed as dist
    assert dist.Backend.GFLOW.lower() == "gflow"  # 1.13: "GFLOW", 2.x: "gflow"
    gt.register_backend()  # idempotent


def test_future_gets_the_error():
    class Failed:
        def add_done_callback(self, fn):
            fn(self)

        def wait(self):
            raise gflow.PeerLostError("peer 3 vanished")

    fut = gt._future_of(Failed(), torch.ones(3))
    with pytest.raises(RuntimeError, match="PeerLostError.*peer 3 vanished"):
        wait_future(fut)
    # The C++ future holds the error (not an exception object as its value,
    # which DDP's reducer would fail to cast): a future that wraps the same
    # C++ future without Python's unwrapping raises too.
    # (torch's collect_all sees a failed member and fails itself.)
    with pytest.raises(RuntimeError, match="peer 3 vanished"):
        inner = wait_future(torch.futures.collect_all([fut]))
        inner[0].wait()


def test_hooks_on_three_ranks_and_ddp_error():
    assert_all_ok(launch(3, ["worker_hooks.py"], timeout=120))


def test_hooks_refuse_compiled_autograds_per_parameter_calls():
    # DDP's python_reducer mode (torch 2.x compiled autograd) calls a comm
    # hook with (grad, param): each gflow hook names the mode.
    grad = torch.zeros(3)
    for hook, state in ((gt.allreduce_hook, None), (gt.fp16_compress_hook, None),
                        (gt.gflow_bf16_compress_hook, None)):
        with pytest.raises(gflow.InvalidArgumentError, match="python_reducer"):
            hook(state, (grad, torch.nn.Parameter(grad)))
