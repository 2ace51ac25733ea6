"""Data-parallel training of a small MLP on the handwritten digits with
torch DistributedDataParallel, communicating through gflow.

    torchrun --nproc_per_node 4 python/examples/ddp_digits.py --backend gflow
    torchrun --nproc_per_node 4 python/examples/ddp_digits.py --backend gloo --hook fp16
    build/tools/gflowrun -n 4 -- python3 python/examples/ddp_digits.py --hook csc

--backend picks the torch.distributed process group ("gflow": gflow's
ProcessGroup; "gloo": torch's); --hook replaces DDP's gradient allreduce by a
gflow communication hook (allreduce, fp16, bf16, int8, int4, csc or auto). Data:
scikit-learn's digits (1797 8x8 images), every fifth image held out. Every
rank starts from the same weights, trains on its own shard, and prints
"rank=R accuracy=A params_sha256=H": H is the same on every rank.
"""

import argparse
import hashlib
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel

import gflow
import gflow.torch


def data():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    test = np.arange(len(y)) % 5 == 0
    return (torch.from_numpy(x[~test]), torch.from_numpy(y[~test]),
            torch.from_numpy(x[test]), torch.from_numpy(y[test]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["gloo", "gflow"], default="gflow")
    p.add_argument("--hook", choices=["none", "allreduce", "fp16", "bf16", "int8", "int4", "csc",
                                          "auto"],
                   default="none")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--density", type=float, default=0.25, help="csc: fraction of chunks sent")
    args = p.parse_args()

    torch.set_num_threads(1)
    if "RANK" in os.environ:  # torchrun (or its variables): env:// rendezvous
        dist.init_process_group(backend=args.backend)
    else:  # gflowrun (one host): a file store named after the job's token
        store = "/tmp/gflow-ddp-%s" % hashlib.sha256(
            os.environ["GFLOW_JOB_TOKEN"].encode()).hexdigest()[:16]
        dist.init_process_group(backend=args.backend, init_method="file://" + store,
                                rank=int(os.environ["GFLOW_RANK"]),
                                world_size=int(os.environ["GFLOW_WORLD_SIZE"]))
    rank, size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    ddp = DistributedDataParallel(model)
    if args.hook != "none":
        comm = gflow.init()  # the same ranks, through gflow's own bootstrap
        hooks = {"allreduce": gflow.torch.allreduce_hook,
                 "fp16": gflow.torch.fp16_compress_hook,
                 "bf16": gflow.torch.bf16_compress_hook,
                 "int8": gflow.torch.int8_compress_hook,
                 "int4": gflow.torch.int4_compress_hook,
                 "csc": gflow.torch.csc_hook,
                 "auto": gflow.torch.auto_compress_hook}
        state = comm
        if args.hook == "csc":
            state = gflow.torch.CSCState(comm, density=args.density, chunk=32, warmup_steps=20)
        elif args.hook in ("int8", "int4"):
            state = gflow.torch.QuantizedState(comm)  # error feedback
        elif args.hook == "auto":  # short periods: every wire within the run
            state = gflow.torch.AutoState(comm, warmup_steps=5, period=10, reprobe=5)
        ddp.register_comm_hook(state, hooks[args.hook])

    xtr, ytr, xte, yte = data()
    xs, ys = xtr[rank::size], ytr[rank::size]  # this rank's shard
    steps = len(xtr) // size // args.batch    # the same on every rank
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    gen = torch.Generator().manual_seed(1 + rank)
    for _ in range(args.epochs):
        order = torch.randperm(len(xs), generator=gen)
        for s in range(steps):
            idx = order[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(xs[idx]), ys[idx])
            loss.backward()
            opt.step()

    with torch.no_grad():
        accuracy = (model(xte).argmax(1) == yte).float().mean().item()
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.numpy().tobytes())
    print("rank=%d accuracy=%.4f params_sha256=%s" % (rank, accuracy, h.hexdigest()), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
