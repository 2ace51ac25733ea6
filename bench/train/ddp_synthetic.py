"""One rank of the synthetic DDP training benchmark (bench/train/netns_ddp.sh
runs it on network-namespace hosts): a torchvision model on random data, the
way Horovod's pytorch_synthetic_benchmark.py measures, with the gradient
exchange of --mode.

    python3 bench/train/ddp_synthetic.py --model resnet50 --mode gflow-fp16

Modes:
    none           no exchange: each rank trains alone (the compute bound)
    ddp-noop       DDP with a hook that returns each bucket as it is: DDP's own
                   bucketing and hook calls, no exchange
    gloo           DDP on torch's gloo backend
    gloo-fp16      DDP on gloo with torch's fp16_compress_hook
    gflow          DDP on gflow's torch.distributed backend
    gflow-dense, gflow-fp16, gflow-bf16, gflow-int8, gflow-int4, gflow-csc, gflow-auto
                   DDP (process group: gloo) with gflow's communication hook:
                   allreduce_hook, fp16_compress_hook, bf16_compress_hook,
                   int8_compress_hook / int4_compress_hook (QuantizedState:
                   error feedback), csc_hook (density --density, chunk 1024,
                   error feedback) or auto_compress_hook (AutoState, settings
                   from GFLOW_WIRE_AUTO_*; the JSON line gets the wires it
                   ended on)

Rank and world come from gflowrun's variables (GFLOW_RANK, GFLOW_WORLD_SIZE,
GFLOW_ROOT); torch's own rendezvous uses GFLOW_ROOT's host and its port + 7.
Prints one JSON line on rank 0: images/s over the timed steps (all ranks),
seconds per step, the median time of forward, backward (with DDP: until the
last bucket's exchange is done) and the optimizer step (averaged over the
ranks), the bytes rank 0's host sent per step (its interface's
counter, GFLOW_SOCKET_IFNAME, when it has one: one rank per host, every
library's traffic), and whether the parameters are bitwise identical on every
rank at the end (a SHA-256 of them, allgathered).

--emulate-gpu runs the model as a GPU node's host sees it
(bench/train/emulate.py): the model's real parameters, DDP's real buckets
and hooks, but forward and backward wait out the per-call times profiled on
this CPU (bench/models/<model>.profile, or --profile) instead of computing,
so the cores are left to communication. The JSON line then holds `bound_s`,
the step's lower bound: forward + max(backward, the first bucket ready +
the bytes the host sent at --link-rate) + optimizer, the bytes as the link
carries them (its interface's tx counter with every frame's headers:
report.wire_bytes). backward and the first
bucket come from the emulated schedule as it ran; with real compute from
DDP's timing (compute, and its first launch), where DDP sampled it.

--trace DIR writes DIR/trace-rank<R>.json on every rank: each timed step's
start, backward's start and end, and each bucket's elements, launch (the hook
called) and completion (its future's callbacks run), on the monotonic clock
(bench/train/trace_report.py reads them; the namespace hosts share one clock).
Modes without a hook of their own then run torch's allreduce_hook, which does
what DDP does without one (divide, then an async allreduce).
"""

import argparse
import datetime
import hashlib
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel

import emulate
from report import link_bytes_per_s, wire_bytes

MODES = ["none", "ddp-noop", "gloo", "gloo-fp16", "gflow", "gflow-dense", "gflow-fp16", "gflow-bf16",
         "gflow-int8", "gflow-int4", "gflow-csc", "gflow-auto"]


def init(mode, rank, size):
    host, port = os.environ["GFLOW_ROOT"].rsplit(":", 1)
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(int(port) + 7))
    comm = None
    if mode.startswith("gflow"):
        import gflow
        import gflow.torch  # noqa: F401 (registers the "gflow" backend)
        if mode != "gflow":  # the hooks' communicator (the backend has its own)
            comm = gflow.init()
    backend = "gflow" if mode == "gflow" else "gloo"
    # A peer that fails ends the run within minutes, not torch's 30.
    dist.init_process_group(backend, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=120))
    return comm


class Trace:
    """--trace: per timed step, backward's bounds and each bucket's
    [index, elements, launch, done] (perf_counter seconds) on this rank."""

    def __init__(self):
        self.steps = []
        self.current = None  # the timed step being recorded

    def begin(self, t, timed):
        self.current = {"start": t, "buckets": []} if timed else None
        if timed:
            self.steps.append(self.current)

    def wrap(self, hook):
        def traced(state, bucket):
            record = [bucket.index(), bucket.buffer().numel(), time.perf_counter(), None]
            if self.current is not None:
                self.current["buckets"].append(record)

            def done(fut):
                record[3] = time.perf_counter()
                return fut.value()
            return hook(state, bucket).then(done)
        return traced

    def write(self, directory, rank, mode, sent):
        """sent: (the interface's tx bytes, the link's bytes) per step."""
        with open(os.path.join(directory, "trace-rank%d.json" % rank), "w") as f:
            json.dump({"rank": rank, "mode": mode, "host_tx_bytes_per_step": sent[0],
                       "host_wire_bytes_per_step": sent[1], "steps": self.steps}, f)


def register(ddp, state, hook, trace):
    ddp.register_comm_hook(state, trace.wrap(hook) if trace else hook)


def wrap(model, mode, comm, args, trace):
    if mode == "none":
        return model
    # DDP's default cap left unnamed: torch 2.x then keeps its 1 MiB first bucket
    cap = {} if args.bucket_mb == 25 else {"bucket_cap_mb": args.bucket_mb}
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=args.bucket_view, **cap)
    if mode in ("gloo", "gflow") and trace:  # DDP's own allreduce, as a hook to trace
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        register(ddp, None, default_hooks.allreduce_hook, trace)
    elif mode == "ddp-noop":
        def noop(_, bucket):
            f = torch.futures.Future()
            f.set_result(bucket.buffer())
            return f
        register(ddp, None, noop, trace)
    elif mode == "gloo-fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        register(ddp, None, default_hooks.fp16_compress_hook, trace)
    elif mode.startswith("gflow-"):
        import gflow.torch as gt
        hooks = {"gflow-dense": gt.allreduce_hook, "gflow-fp16": gt.fp16_compress_hook,
                 "gflow-bf16": gt.bf16_compress_hook, "gflow-int8": gt.int8_compress_hook,
                 "gflow-int4": gt.int4_compress_hook, "gflow-csc": gt.csc_hook,
                 "gflow-auto": gt.auto_compress_hook}
        state = comm
        if mode == "gflow-csc":
            state = gt.CSCState(comm, density=args.density, chunk=1024)
        elif mode in ("gflow-int8", "gflow-int4"):
            state = gt.QuantizedState(comm)
        elif mode == "gflow-auto":
            state = gt.AutoState(comm)
        register(ddp, state, hooks[mode], trace)
        ddp.gflow_state = state  # gflow-auto: its wires go into the report
    return ddp


# The parameters only: BatchNorm's running statistics are buffers that each
# rank updates from its own batch in every forward (DDP broadcasts them from
# rank 0 before each forward, not after the last).
def interface_value(name):
    """/sys/class/net/<this host's interface>/<name> (None without one)."""
    iface = os.environ.get("GFLOW_SOCKET_IFNAME", "").lstrip("=")
    try:
        with open("/sys/class/net/%s/%s" % (iface, name)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def tx_bytes():
    """Bytes this host's interface sent so far (None without one)."""
    return interface_value("statistics/tx_bytes")


def machine_cpu():
    """(busy, total) jiffies of every cpu so far, from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


def process_cpu_s():
    """CPU seconds (user + system) of this process's threads so far."""
    t = os.times()
    return t.user + t.system


def progress_cpu_s():
    """(user, system) CPU seconds of this process's gflow-progress threads and
    their host lanes (gflow-host: the compressed hooks' narrowing and widening)
    so far (0, 0 without one)."""
    user = system = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % task) as f:
                if f.read().strip() not in ("gflow-progress", "gflow-host"):
                    continue
            with open("/proc/self/task/%s/stat" % task) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        user, system = user + int(fields[11]), system + int(fields[12])  # utime, stime
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick


def digest(model):
    h = hashlib.sha256()
    for t in model.parameters():
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.digest()


def mean_over_ranks(rows, columns, size):
    """Each column's median over this rank's rows, averaged over the ranks (an
    allreduce on the default group), rounded to 0.1; None for every column
    when there are no rows (every rank has the same number)."""
    if not rows:
        return [None] * columns
    mine = torch.tensor([statistics.median(r[i] for r in rows) for i in range(columns)],
                        dtype=torch.float64)
    dist.all_reduce(mine)
    return [round(v / size, 1) for v in mine.tolist()]


def ddp_timing(net, seen):
    """DDP's own timing of the iteration before the last one, in ms, when it
    took one (torch samples iterations 1-10, then one in 100): [compute
    (backward's start to its last gradient), exchange (the first bucket's
    launch to the last one's end), their overlap, the first launch after
    backward's start]. `seen` holds the last sample's start."""
    get = getattr(net, "_get_ddp_logging_data", None)
    d = get() if get else {}
    start = d.get("backward_compute_time_start")
    if not start or start == seen[0]:
        return None
    seen[0] = start
    ms = [d["backward_compute_time"], d["backward_comm_time"],
          d["backward_compute_comm_overlap_time"], d["backward_comm_time_start"] - start]
    return [v / 1e6 for v in ms]


def first_bucket_bytes(net):
    """The cap of DDP's rebuilt first bucket: 1 MiB (torch's
    _DEFAULT_FIRST_BUCKET_BYTES), except on a torch 2.x that gives it the
    bucket cap when bucket_cap_mb was named (bucket_bytes_cap_default)."""
    if getattr(net, "bucket_bytes_cap_default", True):
        return getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1 << 20)
    return net.bucket_bytes_cap


def step_bound_s(phase_ms, backward_ms, sent, link_rate):
    """The step's lower bound in s: forward + max(backward, first bucket
    ready + `sent` bytes at the link's rate) + optimizer. backward_ms:
    [computing, until the first bucket was ready]. sent: bytes per step, 0
    without an exchange; None (not measured) or no link rate gives None for
    a run that sends."""
    link = link_bytes_per_s(link_rate) if link_rate else None
    if None in phase_ms or None in backward_ms or (sent != 0 and not (sent and link)):
        return None
    exchange = max(backward_ms[0], backward_ms[1] + 1e3 * sent / link if sent else 0)
    return (phase_ms[0] + exchange + phase_ms[2]) / 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50", help="a torchvision.models name")
    p.add_argument("--mode", choices=MODES, default="gloo")
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--image", type=int, default=32, help="side of the square images")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--density", type=float, default=0.1, help="gflow-csc: chunks sent")
    p.add_argument("--bucket-mb", type=float, default=25,
                   help="DDP's bucket_cap_mb (its default: 25)")
    p.add_argument("--bucket-view", action="store_true",
                   help="DDP's gradient_as_bucket_view: gradients live in the buckets "
                   "(no copy into them and back)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--trace", metavar="DIR", help="write each bucket's launch and completion")
    p.add_argument("--emulate-gpu", action="store_true",
                   help="forward and backward wait out profiled per-call times (no compute)")
    p.add_argument("--profile", help="--emulate-gpu's profile (default "
                   "bench/models/<model>.profile)")
    p.add_argument("--link-rate", help="the host link's rate, tc syntax (1gbit), for bound_s")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    rank, size = int(os.environ["GFLOW_RANK"]), int(os.environ["GFLOW_WORLD_SIZE"])
    comm = init(args.mode, rank, size)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = getattr(torchvision.models, args.model)(num_classes=1000)
    emu, criterion = None, torch.nn.functional.cross_entropy
    if args.emulate_gpu:
        here = os.path.dirname(os.path.abspath(__file__))
        path = args.profile or os.path.join(here, "..", "models", args.model + ".profile")
        emu = emulate.EmulatedModel(model, emulate.load_profile(path), rank)
        criterion = emu.loss
    trace = Trace() if args.trace and args.mode != "none" else None
    net = wrap(emu or model, args.mode, comm, args, trace)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1 + rank)
    data = torch.randn(args.batch, 3, args.image, args.image, generator=gen)
    target = torch.randint(0, 1000, (args.batch,), generator=gen)

    phases = []  # per timed step: ms of forward, backward (DDP's exchange included), optimizer
    emulated = []  # per timed step (--emulate-gpu): ms backward computed, until bucket 0 was ready
    first_bucket = first_bucket_bytes(net)
    ddp_ms, seen = [], [None]  # ddp_timing() of the timed steps

    def step(timed):
        # Emulated: gradients set to None, as torch 2.x does by default, so
        # autograd keeps backward's tensors (zeroing 100 MB would cost the
        # cpus more than a GPU node's host spends on it).
        if emu:
            opt.zero_grad(set_to_none=True)
        else:
            opt.zero_grad()  # each torch's default
        t = [time.perf_counter()]
        if trace:
            trace.begin(t[0], timed)
        loss = criterion(net(data), target)
        t.append(time.perf_counter())
        loss.backward()  # with DDP, returns once every bucket's exchange is done
        t.append(time.perf_counter())
        opt.step()
        t.append(time.perf_counter())
        if trace and timed:
            trace.current.update(backward=t[1], backward_end=t[2])
        if timed:
            phases.append([1e3 * (b - a) for a, b in zip(t, t[1:])])
        if timed and emu:
            emulated.append([1e3 * v for v in emu.last_backward(first_bucket)])
        sample = ddp_timing(net, seen)  # of the step before this one
        if sample and len(phases) > 1:
            ddp_ms.append(sample)

    for _ in range(args.warmup):
        step(False)
    dist.barrier()
    tx0, busy0, cpu0, progress0 = tx_bytes(), machine_cpu(), process_cpu_s(), progress_cpu_s()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step(True)
    dist.barrier()
    seconds = time.perf_counter() - t0
    tx1, busy1, cpu1, progress1 = tx_bytes(), machine_cpu(), process_cpu_s(), progress_cpu_s()
    cpu_ms = mean_over_ranks([[1e3 * (cpu1 - cpu0) / args.steps] +
                              [1e3 * (b - a) / args.steps for a, b in zip(progress0, progress1)]],
                             3, size)
    phase_ms = mean_over_ranks(phases, 3, size)
    ddp_ms = mean_over_ranks(ddp_ms, 4, size)
    tx_per_step = (tx1 - tx0) / args.steps if tx0 is not None else None
    wire_per_step = wire_bytes(tx_per_step, interface_value("mtu"))
    if emu:
        backward_ms = mean_over_ranks(emulated, 2, size)
    elif args.mode == "none":
        backward_ms = [phase_ms[1], phase_ms[1]]
    else:
        backward_ms = [ddp_ms[0], ddp_ms[3]]
    exchanges = args.mode not in ("none", "ddp-noop")
    bound = step_bound_s(phase_ms, backward_ms, wire_per_step if exchanges else 0, args.link_rate)
    if trace:
        trace.write(args.trace, rank, args.mode, (tx_per_step, wire_per_step))

    # Parameters identical on every rank? (no exchange: they must differ.)
    mine = torch.frombuffer(bytearray(digest(model)), dtype=torch.uint8)
    every = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(every, mine)
    identical = all(torch.equal(e, every[0]) for e in every)
    if rank == 0:
        print(json.dumps({
            "model": args.model, "mode": args.mode, "ranks": size, "batch": args.batch,
            "image": args.image, "steps": args.steps, "bucket_mb": args.bucket_mb,
            "bucket_view": args.bucket_view and args.mode != "none",
            "images_per_s": args.batch * size * args.steps / seconds,
            "s_per_step": seconds / args.steps,
            "emulate_gpu": args.emulate_gpu,
            # forward + max(backward, first bucket ready + bytes sent at the
            # link rate) + optimizer (None where a term is unknown)
            "bound_s": bound, "link_rate": args.link_rate,
            "backward_compute_ms": backward_ms[0], "first_bucket_ms": backward_ms[1],
            "host_tx_bytes_per_step": tx_per_step,
            # the same at the link: every frame's headers (report.wire_bytes)
            "host_wire_bytes_per_step": wire_per_step,
            "params": sum(t.numel() for t in model.parameters()),
            "params_identical": identical,
            # Median of each phase over the timed steps, averaged over the ranks.
            "forward_ms": phase_ms[0], "backward_ms": phase_ms[1], "optimizer_ms": phase_ms[2],
            # CPU a rank's process used per step (mean over ranks), and how
            # busy the whole machine's cpus were over rank 0's timed steps
            "cpu_ms_per_step": cpu_ms[0],
            # of which gflow's progress threads', user and system (0 without gflow)
            "progress_user_ms_per_step": cpu_ms[1], "progress_system_ms_per_step": cpu_ms[2],
            "machine_busy": round((busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]), 3),
            # DDP's timing (medians over the timed steps it sampled, mean over ranks)
            "ddp_compute_ms": ddp_ms[0], "ddp_exchange_ms": ddp_ms[1],
            "ddp_overlap_ms": ddp_ms[2], "ddp_first_launch_ms": ddp_ms[3],
            "wires": getattr(getattr(net, "gflow_state", None), "wires", None),
        }), flush=True)
    dist.barrier()
    if args.mode not in ("none", "ddp-noop") and not identical:
        print("rank %d: parameters differ across ranks" % rank, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # No teardown: torch 1.13 can deadlock at exit destroying a gloo process
    # group that DDP's reducer still holds (~ProcessGroupGloo, seen with the
    # gflow fp16 hook), and nothing is left to do.
    os._exit(code)
