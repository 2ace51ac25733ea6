"""DistributedDataParallel that survives a lost rank, with gflow hooks
(docs/elastic.md, "PyTorch").

    build/tools/gflowrun -n 4 --elastic --max-restarts 1 -- \\
        python3 python/examples/elastic_ddp.py --store-file /tmp/job.store --kill-rank 2 --kill-at 5

DDP's gradients go through a gflow communication hook on a gflow
communicator (`comm`). When a rank is lost, every survivor's backward()
raises, the hook's communicator names the same culprit, and the survivors:
- shrink `comm` to themselves;
- take the generation and step from the new rank 0;
- make a new torch.distributed process group for DDP;
- build DDP again.

DDP's constructor broadcasts rank 0's parameters, so every rank continues
from the same state. A replacement (gflowrun starts it with GFLOW_JOIN=1)
calls gflow.join(); the members admit it with comm.grow() after each step,
and it goes through the same rebuild.

The process group is torch's own (--backend gloo, the default, or gflow).
It is created over a PrefixStore per generation on a FileStore (--store-file),
a store that no rank hosts, so losing any rank, rank 0 included, leaves it
usable. Across hosts, use a shared file system or a store served outside the
job.

Each rank prints "digest <sha256 of its parameters> step <s> size <n>" at the
end; all are equal.
"""

import argparse
import hashlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import gflow
import gflow.torch


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)


class Job:
    def __init__(self, args, comm):
        self.args, self.comm = args, comm
        self.net = model()
        self.generation, self.step = 0, 0
        self.ddp = None

    def rebuild(self):
        """After any change of membership, on every member alike."""
        state = torch.tensor([self.generation + 1, self.step], dtype=torch.int64)
        self.comm.broadcast(state, 0)
        self.generation, self.step = int(state[0]), int(state[1])
        if dist.is_initialized():
            dist.destroy_process_group()
        base = dist.FileStore(self.args.store_file, -1)
        dist.init_process_group(self.args.backend,
                                store=dist.PrefixStore("gen%d/" % self.generation, base),
                                rank=self.comm.rank, world_size=self.comm.size)
        self.ddp = DistributedDataParallel(self.net)  # broadcasts rank 0's parameters
        self.ddp.register_comm_hook(gflow.torch.HookState(self.comm), gflow.torch.allreduce_hook)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=0.1)

    def train_step(self):
        time.sleep(self.args.step_ms / 1000.0)
        x, y = batch(self.step, self.comm.rank)
        loss = torch.nn.functional.cross_entropy(self.ddp(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.step += 1
        try:
            grown = self.comm.grow()
        except gflow.Error as e:
            # A joiner lost while connecting, or a member lost: the next step
            # shows which (a member's loss fails it, and recover() runs).
            print("grow failed %d %s" % (time.time() * 1000, e), flush=True)
            return
        if grown is not None:
            self.comm = grown
            self.rebuild()
            print("grew %d size %d" % (time.time() * 1000, self.comm.size), flush=True)

    def recover(self, error):
        print("failed %d %s" % (time.time() * 1000, error), flush=True)
        self.comm = self.comm.shrink()  # drops the culprit every survivor names
        if self.comm is None:
            print("excluded: the others went on without this rank", flush=True)
            sys.exit(3)
        self.rebuild()
        print("shrunk %d size %d" % (time.time() * 1000, self.comm.size), flush=True)

    def run(self, may_kill):
        first = self.comm.rank
        while self.step < self.args.steps:
            if may_kill and first == self.args.kill_rank and self.step == self.args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                self.train_step()
            except (gflow.Error, RuntimeError) as e:  # DDP wraps the hook's error
                self.recover(e)
        digest = hashlib.sha256()
        for p in self.net.parameters():
            digest.update(p.detach().numpy().tobytes())
        print("digest %s step %d size %d" % (digest.hexdigest()[:16], self.step, self.comm.size),
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store-file", required=True, help="the FileStore of the DDP process groups")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "gflow"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--step-ms", type=int, default=0, help="compute time to emulate per step")
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-at", type=int, default=-1)
    args = ap.parse_args()
    if args.backend == "gflow":
        gflow.torch.register_backend()
    joining = os.environ.get("GFLOW_JOIN") == "1"
    comm = gflow.join() if joining else gflow.create()
    if joining:
        print("joined %d rank %d" % (time.time() * 1000, comm.rank), flush=True)
    job = Job(args, comm)
    job.rebuild()
    job.run(may_kill=not joining)


if __name__ == "__main__":
    main()
