"""One rank of test_torch_backend.py: torch.distributed with backend="gflow"
(init_process_group's env:// rendezvous) against float64 references."""

import numpy as np
import torch
import torch.distributed as dist

import gflow
import gflow.torch  # noqa: F401 (registers the backend)

dist.init_process_group(backend="gflow")
R, N = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "gflow"


def data(seed, count, dtype=torch.float32):
    return [torch.from_numpy(np.random.default_rng(seed * 31 + r).uniform(-1, 1, count)).to(dtype)
            for r in range(N)]


def ref(xs, fn):
    return fn(torch.stack([x.double() for x in xs]))


def close(got, want, xs):
    bound = (N + 1) * 2.0**-24 * torch.stack([x.double().abs() for x in xs]).sum(0)
    assert torch.all((got.double() - want).abs() <= bound + 1e-300)


xs = data(1, 10001)
t = xs[R].clone()
dist.all_reduce(t)
close(t, ref(xs, lambda a: a.sum(0)), xs)
for op, fn in ((dist.ReduceOp.MAX, lambda a: a.max(0).values),
               (dist.ReduceOp.MIN, lambda a: a.min(0).values),
               (dist.ReduceOp.PRODUCT, lambda a: a.prod(0))):
    t = xs[R].double().clone()
    dist.all_reduce(t, op=op)
    assert torch.allclose(t, ref(xs, fn), rtol=1e-12, atol=0), op
ti = torch.arange(10, dtype=torch.int64) * (R + 1)
dist.all_reduce(ti)
assert torch.equal(ti, torch.arange(10) * (N * (N + 1) // 2))

# async work and its future
xs = data(2, 5000)
t = xs[R].clone()
work = dist.all_reduce(t, async_op=True)
fut = work.get_future()
got = fut.wait()
assert work.is_completed() and work.is_success()
close(got[0], ref(xs, lambda a: a.sum(0)), xs)
chained = dist.all_reduce(xs[R].clone(), async_op=True).get_future().then(
    lambda f: f.value()[0] * 2)
close(chained.wait() / 2, ref(xs, lambda a: a.sum(0)), xs)

# broadcast, all_gather (list and flat), reduce_scatter (list and flat), barrier
b = torch.full((7,), float(R))
dist.broadcast(b, src=N - 1)
assert torch.equal(b, torch.full((7,), float(N - 1)))
xs = data(3, 333, torch.float64)
outs = [torch.empty(333, dtype=torch.float64) for _ in range(N)]
dist.all_gather(outs, xs[R])
assert all(torch.equal(outs[r], xs[r]) for r in range(N))
flat = torch.empty(333 * N, dtype=torch.float64)
dist._all_gather_base(flat, xs[R])
assert torch.equal(flat, torch.cat(xs))
ins = [data(4 + j, 100) for j in range(N)]  # ins[j][r]: rank r's block for rank j
out = torch.empty(100)
dist.reduce_scatter(out, [ins[j][R] for j in range(N)])
close(out, ref(ins[R], lambda a: a.sum(0)), ins[R])
flat_in = torch.cat([ins[j][R] for j in range(N)])
out2 = torch.empty(100)
dist._reduce_scatter_base(out2, flat_in)
close(out2, ref(ins[R], lambda a: a.sum(0)), ins[R])
dist.barrier()

# a subgroup (new_group creates another gflow process group through the store)
if N >= 3:
    g = dist.new_group([0, 2])
    if R in (0, 2):
        s = torch.tensor([float(R)])
        dist.all_reduce(s, group=g)
        assert s.item() == 2.0

# errors name what was wrong (gflow.Error subclasses, also through torch.distributed)
for bad, what in ((lambda: dist.all_reduce(torch.zeros(4, 3).t()), "not contiguous"),
                  (lambda: dist.all_reduce(torch.zeros(3, dtype=torch.bool)), "not supported"),
                  (lambda: dist.all_reduce(torch.zeros(3), op=dist.ReduceOp.BAND),
                   "not supported")):
    try:
        bad()
    except gflow.InvalidArgumentError as e:  # gflow's errors keep their Python class
        assert what in str(e), str(e)
    else:
        raise AssertionError("no error: " + what)
dist.barrier()
print("rank %d ok" % R, flush=True)
dist.destroy_process_group()
