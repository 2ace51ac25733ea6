"""One rank of test_torch2.py: what only torch 2.x has, on the gflow
backend (not gloo standing in), against exact or float64 references.
Prints 'checked NAME' per check and what pg.name() returns."""

import datetime
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import gflow
import gflow.torch  # noqa: F401 (registers the backend)

dist.init_process_group(backend="gflow", timeout=datetime.timedelta(seconds=60))
R, N = dist.get_rank(), dist.get_world_size()
pg = dist.distributed_c10d._get_default_group()


def checked(name):
    print("checked", name, flush=True)


# The group routes cpu ops to gflow's Backend (torch 2.x's per-device form).
backend = pg._get_backend(torch.device("cpu"))
assert type(backend).__name__ == "Backend" and backend.name() == "gflow", (type(backend),
                                                                           backend.name())
assert pg._get_backend(torch.device("cuda")).name() == "gflow"  # registered for both
assert dist.get_backend() == "gflow"
print("pg.name()", pg.name(), flush=True)
checked("backend")


def rows(r, n=4, cols=3):  # rank r's exact int64 block
    return torch.arange(n * cols, dtype=torch.int64).reshape(n, cols) + 1000 * r


# all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single
out = torch.empty(N * 4, 3, dtype=torch.int64)
dist.all_gather_into_tensor(out, rows(R))
assert torch.equal(out, torch.cat([rows(r) for r in range(N)])), out
inp = torch.cat([rows(R) + j for j in range(N)])  # block j goes to rank j
res = torch.empty(4, 3, dtype=torch.int64)
dist.reduce_scatter_tensor(res, inp)
assert torch.equal(res, sum(rows(r) + R for r in range(N))), res
splits_in = [j + 1 for j in range(N)]  # rank R sends j+1 rows to rank j
send = torch.cat([torch.full((j + 1, 2), 100 * R + j, dtype=torch.int64) for j in range(N)])
recv = torch.empty(N * (R + 1), 2, dtype=torch.int64)
dist.all_to_all_single(recv, send, [R + 1] * N, splits_in)
assert torch.equal(recv, torch.cat([torch.full((R + 1, 2), 100 * r + R, dtype=torch.int64)
                                    for r in range(N)])), recv
checked("tensor_collectives")

# The coalesced forms (torch 2.x's coalescing manager calls them).
outs = [torch.empty(N * 2, dtype=torch.float64), torch.empty(N * 5, dtype=torch.int32)]
ins = [torch.full((2,), float(R)), torch.arange(5, dtype=torch.int32) * (R + 1)]
ins[0] = ins[0].double()
with dist._coalescing_manager():
    for o, i in zip(outs, ins):
        dist.all_gather_into_tensor(o, i)
assert torch.equal(outs[0], torch.cat([torch.full((2,), float(r)).double() for r in range(N)]))
assert torch.equal(outs[1], torch.cat([torch.arange(5, dtype=torch.int32) * (r + 1)
                                       for r in range(N)]))
rs_out = [torch.empty(3), torch.empty(2)]
rs_in = [torch.arange(3 * N, dtype=torch.float32) * (R + 1), torch.ones(2 * N) * R]
with dist._coalescing_manager():
    for o, i in zip(rs_out, rs_in):
        dist.reduce_scatter_tensor(o, i)
tri = N * (N + 1) / 2
assert torch.equal(rs_out[0], torch.arange(3 * R, 3 * R + 3, dtype=torch.float32) * tri)
assert torch.equal(rs_out[1], torch.full((2,), float(N * (N - 1) / 2)))
checked("coalesced")

# PREMUL_SUM (FSDP2's divide factor): sum of factor * x.
x = torch.full((7,), float(R + 1), dtype=torch.float64)
dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.25))
assert torch.equal(x, torch.full((7,), 0.25 * tri, dtype=torch.float64)), x
y = torch.full((N * 2,), float(R + 1))
z = torch.empty(2)
dist.reduce_scatter_tensor(z, y, op=dist._make_nccl_premul_sum(2.0))
assert torch.equal(z, torch.full((2,), 2.0 * tri)) and torch.equal(y, torch.full((N * 2,),
                                                                                 float(R + 1)))
checked("premul_sum")

# A sparse allreduce (torch 2.x routes it to allreduce_sparse).
sp = torch.sparse_coo_tensor([[R, N]], [1.0 + R, 2.0], (N + 1,))
dist.all_reduce(sp)
dense = torch.zeros(N + 1)
for r in range(N):
    dense[r] += 1.0 + r
dense[N] = 2.0 * N
assert torch.equal(sp.to_dense(), dense), sp.to_dense()
checked("sparse")

# Functional collectives (DTensor's and compiled code's path).
f = fc.wait_tensor(fc.all_reduce(torch.full((5,), float(R)), "sum", dist.group.WORLD))
assert torch.equal(f, torch.full((5,), float(N * (N - 1) / 2))), f
g = fc.wait_tensor(fc.all_gather_tensor(torch.full((2,), float(R)), 0, dist.group.WORLD))
assert torch.equal(g, torch.cat([torch.full((2,), float(r)) for r in range(N)])), g
checked("functional_collectives")

# A DeviceMesh over the gflow backend, and DTensor redistribution on it.
mesh = init_device_mesh("cpu", (N,))
assert mesh.get_group()._get_backend(torch.device("cpu")).name() == "gflow"
full = torch.arange(N * 6, dtype=torch.float32).reshape(N * 2, 3)
d = distribute_tensor(full, mesh, [Shard(0)])
assert torch.equal(d.to_local(), full[2 * R:2 * R + 2])
assert torch.equal(d.redistribute(mesh, [Replicate()]).to_local(), full)
p = DTensor.from_local(torch.full((3,), float(R)), mesh, [Partial()])  # pending sum
assert torch.equal(p.redistribute(mesh, [Replicate()]).to_local(),
                   torch.full((3,), float(N * (N - 1) / 2)))
checked("device_mesh_dtensor")

# DDP on the gflow backend (no hook), then one gflow hook on 2.x's DDP.
torch.manual_seed(0)
model = torch.nn.Linear(6, 2)
ddp = torch.nn.parallel.DistributedDataParallel(model)
ddp(torch.full((4, 6), float(R + 1))).sum().backward()
torch.manual_seed(0)
w = torch.nn.Linear(6, 2)
for r in range(N):  # the mean of every rank's gradient, in float64
    w(torch.full((4, 6), float(r + 1))).sum().backward()
assert torch.allclose(model.weight.grad, w.weight.grad / N, rtol=1e-6), model.weight.grad
checked("ddp")

# FSDP on CPU (its sharded gradients go through reduce_scatter): the
# averaged gradient of sum(W x + b) with x = R + 1 everywhere.
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: E402

torch.manual_seed(1)
fsdp = FSDP(torch.nn.Linear(8, 4), device_id=torch.device("cpu"), use_orig_params=True)
fsdp(torch.full((2, 8), float(R + 1))).sum().backward()
with FSDP.summon_full_params(fsdp, with_grads=True):
    lin = fsdp.module
    assert torch.allclose(lin.weight.grad, torch.full((4, 8), float(N + 1))), lin.weight.grad
    assert torch.allclose(lin.bias.grad, torch.full((4,), 2.0)), lin.bias.grad
checked("fsdp_cpu")

dist.barrier()
dist.destroy_process_group()
checked("end")
