"""One rank of test_torch_backend.py's Gloo-semantics check: the same calls
on a gloo group and on a gflow group give the same values (and the same
shape of future value), for the list forms torch's callers rely on."""

import datetime

import torch
import torch.distributed as dist

import gflow.torch  # noqa: F401 (registers the backend)

dist.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
R, N = dist.get_rank(), dist.get_world_size()
groups = {"gloo": dist.new_group(backend="gloo"), "gflow": dist.new_group(backend="gflow")}


def run(pg):
    out = {}
    # allreduce_coalesced with one tensor passed twice (torch's own Gloo
    # tests do), async and many at once.
    xs = [2 * [torch.tensor([i + R])] for i in range(3)]
    futs = [pg.allreduce_coalesced(x).get_future() for x in xs]
    torch.futures.wait_all(futs)
    out["coalesced_aliased"] = [[t.tolist() for t in f.value()] for f in futs]
    # ... and a non-contiguous tensor with a contiguous one.
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (R + 1)
    b = torch.ones(5) * R
    pg.allreduce_coalesced([a, b]).wait()
    out["coalesced_strided"] = [a.tolist(), b.tolist()]
    # allgather of n inputs: the future's value is n lists (1: one flat list).
    for n in (1, 2, 3):
        ins = [torch.tensor([n * R + i]) for i in range(n)]
        outs = [[torch.tensor([-1]) for _ in range(n * N)] for _ in range(n)]
        f = pg.allgather(outs, ins).get_future()
        f.wait()
        v = f.value()
        out["allgather_%d" % n] = [[t.tolist() for t in lst] for lst in v] if n > 1 else \
            [t.tolist() for t in v]
    # allgather_coalesced: one output list per rank (one dtype: gloo's
    # result for mixed dtypes is garbage).
    ins = [torch.tensor([R, R]), torch.tensor([10 * R])]
    outs = [[torch.empty(2, dtype=torch.int64), torch.empty(1, dtype=torch.int64)]
            for _ in range(N)]
    f = pg.allgather_coalesced(outs, ins).get_future()
    f.wait()
    out["allgather_coalesced"] = [[t.tolist() for t in lst] for lst in f.value()]
    return out


got = {name: run(pg) for name, pg in groups.items()}
assert got["gflow"] == got["gloo"], got
dist.destroy_process_group()
print("same as gloo", flush=True)
