"""Python CUDA tensors on a GPU machine (run by tests/gpu/run_gpu_checks.sh
under gflowrun, 2 ranks): torch CUDA tensors through gflow's Python API (a
tensor produced on a side stream, so the op must wait for that stream), the
"gflow" torch.distributed backend on CUDA tensors, and one DDP step on CUDA
with gflow's allreduce hook and with the backend alone, against exact
references. Exits 0 when every check passed, 0 with SKIP when this torch has
no CUDA. Where the torch backend was not built (_gflow_torch needs Debian's
libtorch 1.13 API), its checks print SKIP and the DDP step with gflow's hook
runs over torch's gloo backend instead."""

import os
import sys

import torch

if not torch.cuda.is_available():
    print("SKIP: this torch has no CUDA")
    sys.exit(0)

import importlib  # noqa: E402

import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gflow  # noqa: E402
import gflow.torch  # noqa: E402

comm = gflow.init(timeout=120)
R, N = comm.rank, comm.size
dev = torch.device("cuda", R % torch.cuda.device_count())
torch.cuda.set_device(dev)
n = 1 << 20
base = torch.arange(n, dtype=torch.float64)
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    torch.cuda._sleep(50_000_000)  # a slow producer: the op must wait for it
    y = (base * (R + 1)).to(torch.float32).to(dev)
    comm.allreduce(y)
want = base * sum(r + 1 for r in range(N))
assert torch.equal(y.cpu().double(), want), "python allreduce on a side stream"
out = torch.empty(n * N, device=dev)
comm.allgather(y, out, async_op=True).wait(120)
assert torch.equal(out.cpu().double(), want.repeat(N)), "python allgather"
print("rank %d: python api ok %s" % (R, comm.stats()))

try:
    importlib.import_module("gflow._gflow_torch")
    backend = "gflow"
except ImportError as e:
    print("rank %d: SKIP torch backend checks (%s); DDP uses gloo and gflow's hook" % (R, e))
    backend = "gloo"
host, port = os.environ["GFLOW_ROOT"].rsplit(":", 1)
os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(int(port) + 11))
dist.init_process_group(backend, rank=R, world_size=N)


def backend_checks():
    t = torch.full((1000,), float(R + 1), device=dev)
    dist.all_reduce(t)
    assert torch.all(t == sum(r + 1 for r in range(N))).item(), "backend all_reduce"
    parts = [torch.empty(1000, device=dev) for _ in range(N)]
    dist.all_gather(parts, t * (R + 1))
    assert all(torch.all(p == t * (r + 1)).item() for r, p in enumerate(parts)), "backend all_gather"
    b = torch.full((10,), float(R), device=dev)
    dist.broadcast(b, N - 1)
    assert torch.all(b == N - 1).item(), "backend broadcast"
    got = torch.empty(4096, device=dev)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((4096,), float(R), device=dev),
                                              (R + 1) % N),
                                   dist.P2POp(dist.irecv, got, (R - 1) % N)])
    for q in reqs:
        q.wait()
    assert torch.all(got == (R - 1) % N).item(), "backend batch_isend_irecv"


def ddp_step(hook):
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(256, 32).to(dev), device_ids=[dev])
    if hook:
        model.register_comm_hook(comm, gflow.torch.allreduce_hook)
    g = torch.Generator().manual_seed(R)
    x = torch.randn(64, 256, generator=g).to(dev)
    model(x).square().sum().backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(grads) for _ in range(N)]
    dist.all_gather(every, grads)
    assert all(torch.equal(e, grads) for e in every), "DDP gradients differ across ranks"


if backend == "gflow":
    backend_checks()
    ddp_step(hook=False)
ddp_step(hook=True)
dist.destroy_process_group()
print("rank %d: torch %s backend and DDP ok" % (R, backend))
