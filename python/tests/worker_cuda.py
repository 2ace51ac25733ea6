"""One rank of test_cuda_tensors.py: cuda tensors (soft device memory that
exports itself through DLPack as CUDA memory, soft_gpu.py) through every
kind of op of the Python API and a DDP hook, staged through host memory by
the software CUDA component, against exact references. Rank r uses soft GPU
r % 2. Exits 0 when every check passed."""

import gc
import sys

import numpy as np
import torch  # noqa: F401 (gflow.torch needs it)

import gflow
import gflow.torch
from soft_gpu import SoftGpu

gpu = SoftGpu()
gflow.set_cuda_component(gpu.path)
comm = gflow.init(timeout=60)
R, N = comm.rank, comm.size
DEV = R % 2


def values(r, n, salt=0):
    return (np.arange(n, dtype=np.int64) * 7 + r * 1000 + salt).astype(np.float32)


def check(got, want, what):
    if not np.array_equal(got, want):
        bad = np.flatnonzero(got != want)[:5]
        sys.exit("rank %d: %s differs at %s: %s vs %s" % (R, what, bad, got[bad], want[bad]))


n = 1000
x = gpu.array(DEV, values(R, n))
comm.allreduce(x)
check(x.host(), sum(values(r, n) for r in range(N)), "allreduce")
assert x.streams == [1], x.streams  # DLPack stream protocol: the legacy default stream

w = comm.allreduce(x, "max", async_op=True)
w.wait(60)
check(x.host(), sum(values(r, n) for r in range(N)), "allreduce max of equal values")

b = gpu.array(DEV, values(R, n, 5))
comm.broadcast(b, root=N - 1)
check(b.host(), values(N - 1, n, 5), "broadcast")

out = gpu.array(DEV, np.zeros(n * N, np.float32))
comm.allgather(gpu.array(DEV, values(R, n, 1)), out)
check(out.host(), np.concatenate([values(r, n, 1) for r in range(N)]), "allgather")

# cpu input, cuda output: mixed, staged
out2 = gpu.array(DEV, np.zeros(n * N, np.float32))
comm.allgather(values(R, n, 2), out2)
check(out2.host(), np.concatenate([values(r, n, 2) for r in range(N)]), "allgather cpu -> cuda")

send = gpu.array(DEV, np.concatenate([values(R, n, 10 + j) for j in range(N)]))
recv = gpu.array(DEV, np.zeros(n * N, np.float32))
comm.alltoall(send, recv)
check(recv.host(), np.concatenate([values(j, n, 10 + R) for j in range(N)]), "alltoall")

red = gpu.array(DEV, np.full(n, -1, np.float32))
comm.reduce(gpu.array(DEV, values(R, n, 3)), root=0, out=red)
if R == 0:
    check(red.host(), sum(values(r, n, 3) for r in range(N)), "reduce")

# point-to-point, device to device around a ring
got = gpu.array(DEV, np.zeros(n, np.float32))
right, left = (R + 1) % N, (R - 1) % N
works = [comm.send(gpu.array(DEV, values(R, n, 4)), right, async_op=True),
         comm.recv(got, left, async_op=True)]
for wk in works:
    wk.wait(60)
check(got.host(), values(left, n, 4), "send/recv")

# A DDP hook on a cuda bucket: the average lands in the bucket's buffer.


class Bucket:
    def __init__(self, buf):
        self.buf = buf

    def buffer(self):
        return self.buf

    def index(self):
        return 0


grad = gpu.array(DEV, values(R, n, 6))
result = gflow.torch.allreduce_hook(comm, Bucket(grad)).wait()
assert result is grad, result
check(grad.host(), sum(values(r, n, 6) for r in range(N)) / N, "allreduce_hook (avg)")

# The gradient reducer on a cuda gradient.
g = gpu.array(DEV, values(R, n, 8))
reducer = gflow.GradientReducer(comm, [g], op="sum")
reducer.ready(0)
reducer.wait(timeout=60)
check(g.host(), sum(values(r, n, 8) for r in range(N)), "GradientReducer")
del reducer

stats = comm.stats()
assert stats["staged_ops"] >= 10 and stats["nccl_ops"] == 0, stats
gflow.finalize()
gc.collect()
print("rank %d ok: %s" % (R, stats))
