"""One rank of test_torch_hooks.py's multi-rank test: gflow.torch's hooks on
3 ranks against the float64 average of every rank's bucket (float16 and
bfloat16 wire within the bound of docs/compression.md, divided by N for the
average), then a 2-rank DDP step (ranks 0 and 1) whose peer died: DDP's
backward raises the gflow error that failed the hook's future."""

import os
import time

import numpy as np
import torch
import torch.distributed as dist

import gflow
import gflow.torch as gt
from waiting import wait_future

comm = gflow.init(timeout=30)
R, N = comm.rank, comm.size


class Bucket:
    def __init__(self, tensor, index=0):
        self._t, self._i = tensor, index

    def buffer(self):
        return self._t

    def index(self):
        return self._i

    def is_last(self):
        return True


def inputs(seed, count):
    return [np.random.default_rng(seed * 97 + r).uniform(-1, 1, count).astype(np.float32)
            for r in range(N)]


for seed, (hook, u, eta) in enumerate(((gt.allreduce_hook, 2.0**-24, 0.0),
                                       (gt.fp16_compress_hook, 2.0**-11, 2.0**-25),
                                       (gt.bf16_compress_hook, 2.0**-8, 2.0**-134))):
    xs = inputs(seed + 1, 20001)
    buf = torch.from_numpy(xs[R].copy())
    got = wait_future(hook(comm, Bucket(buf)), timeout=60)
    assert got.data_ptr() == buf.data_ptr()
    want = np.stack([x.astype(np.float64) for x in xs]).sum(0) / N
    S = np.stack([np.abs(x.astype(np.float64)) for x in xs]).sum(0)
    bound = ((N + 1) * u * S + N * eta) / N + 2.0**-24 * np.abs(want)
    err = np.abs(got.numpy().astype(np.float64) - want)
    assert np.all(err <= bound), "%s: max excess %g" % (hook.__name__, np.max(err - bound))
# int8/int4 blocks (docs/compression.md): every value of a block within
# N h A / (1 - (N-1) h) of the exact average, A the sum over ranks of the
# block's largest |x| / N, h = 1/(2Q) + 2^-20; every rank the same bits.
for seed, (hook, qmax) in enumerate(((gt.int8_compress_hook, 127), (gt.int4_compress_hook, 7))):
    xs = inputs(seed + 5, 1000)
    buf = torch.from_numpy(xs[R].copy())
    got = wait_future(hook(gt.QuantizedState(comm), Bucket(buf)), timeout=60).numpy()
    want = np.stack([x.astype(np.float64) for x in xs]).sum(0) / N
    h = 1.0 / (2 * qmax) + 2.0**-20
    pad = [np.pad(np.abs(x.astype(np.float64)) / N, (0, 24)).reshape(-1, 128) for x in xs]
    a = np.repeat(sum(p.max(1) for p in pad), 128)[:1000]
    bound = N * h * a / (1 - (N - 1) * h) + 2.0**-24 * np.abs(want)
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= bound), "%s: max excess %g" % (hook.__name__, np.max(err - bound))
    mine = torch.from_numpy(got.copy())
    flat = torch.cat([mine] * N)
    comm.allgather(mine, flat)
    assert all(torch.equal(flat[r * 1000:(r + 1) * 1000], mine) for r in range(N)), hook.__name__
# CSC at density 1 is the dense average.
xs = inputs(9, 4096)
buf = torch.from_numpy(xs[R].copy())
state = gt.CSCState(comm, density=1.0, chunk=64)
got = wait_future(gt.csc_hook(state, Bucket(buf)), timeout=60)
want = np.stack([x.astype(np.float64) for x in xs]).sum(0) / N
assert np.allclose(got.numpy(), want, rtol=0, atol=N * 2.0**-22), "csc"
comm.barrier()

# DDP step with a dead peer: ranks 0 and 1, rank 1 exits after construction.
sub = comm.split(0 if R < 2 else -1, R)
if sub is not None:
    store_path = "/tmp/gflow_hooks_%s" % os.environ["GFLOW_JOB_TOKEN"]
    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=R, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
    model.register_comm_hook(sub, gt.allreduce_hook)
    sub.barrier()
    if R == 1:
        os._exit(0)
    time.sleep(0.2)
    try:
        model(torch.ones(2, 8)).sum().backward()
    except RuntimeError as e:
        msg = str(e)
        assert "Unable to cast" not in msg, msg
        assert "PeerLostError" in msg or "peer" in msg.lower(), msg
        print("rank %d ddp error: %s" % (R, msg.splitlines()[0][:200]), flush=True)
    else:
        raise AssertionError("DDP step with a dead peer did not fail")
    try:
        os.unlink(store_path)
    except OSError:
        pass
    os._exit(0)  # the gloo group has lost its peer: skip its teardown
print("rank %d ok" % R, flush=True)
