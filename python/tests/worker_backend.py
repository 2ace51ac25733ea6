"""One rank of test_torch_backend.py: torch.distributed with backend="gflow"
(init_process_group's env:// rendezvous) against float64 references."""

import datetime
import re
import time

import numpy as np
import torch
import torch.distributed as dist

import gflow
import gflow.torch  # noqa: F401 (registers the backend)
from waiting import wait_future

# Every blocking op and Work.wait() ends by this deadline (a hung regression
# fails instead of waiting torch's default 30 minutes).
dist.init_process_group(backend="gflow", timeout=datetime.timedelta(seconds=60))
R, N = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "gflow"


# Several tensors per call (Gloo's forms): torch 1.13's *_multigpu calls;
# torch 2.x removed them, and the group's own methods reach the same forms.
def _group(group):
    return group if group is not None else dist.distributed_c10d._get_default_group()


def all_reduce_many(ts, op=dist.ReduceOp.SUM, group=None):
    if hasattr(dist, "all_reduce_multigpu"):
        return dist.all_reduce_multigpu(ts, op=op, group=group)
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    _group(group).allreduce(ts, opts).wait()


def broadcast_many(ts, src, src_tensor, group=None):
    if hasattr(dist, "broadcast_multigpu"):
        return dist.broadcast_multigpu(ts, src, group=group, src_tensor=src_tensor)
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = src, src_tensor
    _group(group).broadcast(ts, opts).wait()


def all_gather_many(outs, ins):
    if hasattr(dist, "all_gather_multigpu"):
        return dist.all_gather_multigpu(outs, ins)
    _group(None).allgather(outs, ins).wait()


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
got = wait_future(fut)
assert work.is_completed() and work.is_success()
work2 = dist.all_reduce(xs[R].clone(), async_op=True)
work2.wait()
close(work2.get_future().value()[0], ref(xs, lambda a: a.sum(0)), xs)
close(got[0], ref(xs, lambda a: a.sum(0)), xs)
chained = dist.all_reduce(xs[R].clone(), async_op=True).get_future().then(
    lambda f: f.value()[0] * 2)
close(wait_future(chained) / 2, ref(xs, lambda a: a.sum(0)), xs)

# AVG and allreduce_coalesced
xs = data(5, 1001)
t = xs[R].clone()
dist.all_reduce(t, op=dist.ReduceOp.AVG)
close(t, ref(xs, lambda a: a.sum(0) / N), xs)
ys = data(6, 77)
ts = [xs[R].clone(), ys[R].clone()]
dist.all_reduce_coalesced(ts)
close(ts[0], ref(xs, lambda a: a.sum(0)), xs)
close(ts[1], ref(ys, lambda a: a.sum(0)), ys)

# Temporary inputs of async ops stay alive until the op is done: rank 0
# joins late, the others free their input and reuse the memory meanwhile.
xs = data(7, 1000)
if R == 0:
    time.sleep(0.3)
flat = torch.empty(1000 * N)
w1 = dist._all_gather_base(flat, (xs[R] * 2).flatten(), async_op=True)
outs = [torch.empty(1000) for _ in range(N)]
w2 = dist.all_gather(outs, (xs[R] * 3).flatten(), async_op=True)
junk = [torch.full((1000,), 1e30) for _ in range(64)]
w1.wait()
w2.wait()
assert torch.equal(flat, torch.cat(xs) * 2), "_all_gather_base read a freed input"
assert all(torch.equal(outs[r], xs[r] * 3) for r in range(N)), "all_gather read a freed input"
del junk

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
# several tensors per call, Gloo's forms (the *_multigpu calls reach them on CPU):
# allreduce over every tensor of every rank, broadcast of tensors[src_tensor],
# allgather of k inputs into k lists of k * N
ms = [[torch.arange(6, dtype=torch.int64).reshape(2, 3) * (10 * r + i + 1) - 7 * i
       for i in range(3)] for r in range(N)]
every = torch.stack([m for per_rank in ms for m in per_rank])
for op, want in ((dist.ReduceOp.SUM, every.sum(0)), (dist.ReduceOp.MAX, every.max(0).values),
                 (dist.ReduceOp.MIN, every.min(0).values),
                 (dist.ReduceOp.BXOR, torch.stack([m ^ 0 for m in every]).numpy()),
                 (dist.ReduceOp.AVG, torch.div(every.sum(0), 3 * N, rounding_mode="trunc"))):
    if op == dist.ReduceOp.BXOR:
        want = torch.from_numpy(np.bitwise_xor.reduce(want, axis=0))
    ts = [m.clone() for m in ms[R]]
    all_reduce_many(ts, op=op)
    assert all(torch.equal(t, want) for t in ts), (op, ts, want)
fs = [data(40 + i, 9, torch.float64) for i in range(2)]  # fs[i][r]
ts = [fs[i][R].clone() for i in range(2)]
all_reduce_many(ts, op=dist.ReduceOp.AVG)
favg = ref([fs[i][r] for i in range(2) for r in range(N)], lambda a: a.sum(0)) / (2 * N)
assert all(torch.allclose(t, favg, rtol=0, atol=1e-14) for t in ts), (ts, favg)
bs = [torch.full((4,), float(10 * R + i)) for i in range(3)]
broadcast_many(bs, src=N - 1, src_tensor=1)
assert all(torch.equal(x, torch.full((4,), float(10 * (N - 1) + 1))) for x in bs), bs
gin = [torch.full((2,), float(10 * R + i)) for i in range(2)]
gout = [[torch.empty(2) for _ in range(2 * N)] for _ in range(2)]
all_gather_many(gout, gin)
assert all(torch.equal(lst[r * 2 + i], torch.full((2,), float(10 * r + i)))
           for lst in gout for r in range(N) for i in range(2)), gout

ins = [data(4 + j, 100) for j in range(N)]  # ins[j][r]: rank r's block for rank j
out = torch.empty(100)
dist.reduce_scatter(out, [ins[j][R] for j in range(N)])
close(out, ref(ins[R], lambda a: a.sum(0)), ins[R])
flat_in = torch.cat([ins[j][R] for j in range(N)])
out2 = torch.empty(100)
dist._reduce_scatter_base(out2, flat_in)
close(out2, ref(ins[R], lambda a: a.sum(0)), ins[R])
dist.barrier()

# reduce (in place on the root only), gather, scatter, all_to_all_single,
# all_gather_coalesced; data movement of any dtype; non-contiguous tensors
ys = [torch.arange(50, dtype=torch.int64) * (r + 1) for r in range(N)]
y = ys[R].clone()
dist.reduce(y, dst=N - 1, op=dist.ReduceOp.MAX)
assert torch.equal(y, ys[N - 1] if R == N - 1 else ys[R])
g_list = [torch.empty(50, dtype=torch.int64) for _ in range(N)] if R == 0 else None
dist.gather(ys[R], gather_list=g_list, dst=0)
assert R != 0 or all(torch.equal(g_list[r], ys[r]) for r in range(N))
s = torch.empty(50, dtype=torch.int64)
dist.scatter(s, scatter_list=ys if R == N - 1 else None, src=N - 1)
assert torch.equal(s, ys[R])
a2a_in = torch.arange(N * 4, dtype=torch.float32) + 100 * R
a2a_out = torch.empty(N * 4)
dist.all_to_all_single(a2a_out, a2a_in)
assert torch.equal(a2a_out, torch.cat([torch.arange(R * 4, R * 4 + 4, dtype=torch.float32) + 100 * j
                                       for j in range(N)]))
# with split sizes (rank i sends i + j + 1 rows of 3 to rank j), and the
# list form (any shapes per pair)
rows_to = [R + j + 1 for j in range(N)]
rows_from = [j + R + 1 for j in range(N)]
v_in = torch.cat([torch.full((rows_to[j], 3), 10 * R + j, dtype=torch.int16) for j in range(N)])
v_out = torch.empty(sum(rows_from), 3, dtype=torch.int16)
dist.all_to_all_single(v_out, v_in, output_split_sizes=rows_from, input_split_sizes=rows_to)
assert torch.equal(v_out, torch.cat([torch.full((rows_from[j], 3), 10 * j + R, dtype=torch.int16)
                                     for j in range(N)]))
l_in = [torch.full((R + 1, j + 1), float(R * 10 + j)) for j in range(N)]
l_out = [torch.empty(j + 1, R + 1) for j in range(N)]
dist.all_to_all(l_out, l_in)
assert all(torch.equal(l_out[j], torch.full((j + 1, R + 1), float(j * 10 + R))) for j in range(N))
co_in = [torch.full((2, 3), R, dtype=torch.int8), torch.full((5,), R - 7, dtype=torch.int8)]
co_out = [[torch.empty(2, 3, dtype=torch.int8), torch.empty(5, dtype=torch.int8)]
          for _ in range(N)]
dist.all_gather_coalesced(co_out, co_in)
assert all(torch.equal(co_out[r][0], torch.full((2, 3), r, dtype=torch.int8)) and
           torch.equal(co_out[r][1], torch.full((5,), r - 7, dtype=torch.int8)) for r in range(N))
i8 = torch.full((9,), R - 5, dtype=torch.int8)
dist.broadcast(i8, src=0)
assert torch.equal(i8, torch.full((9,), -5, dtype=torch.int8))
cplx = torch.full((4,), complex(R, -R), dtype=torch.complex64)
dist.broadcast(cplx, src=N - 1)
assert torch.equal(cplx, torch.full((4,), complex(N - 1, 1 - N), dtype=torch.complex64))
nc = torch.arange(12, dtype=torch.float32).reshape(4, 3).t() * (R + 1)  # non-contiguous
dist.all_reduce(nc)
assert torch.equal(nc, torch.arange(12, dtype=torch.float32).reshape(4, 3).t() * (N * (N + 1) // 2))

# bool, int8, int16 and the bitwise ops, as Gloo reduces them
b = torch.tensor([R == 0, False, True, R % 2 == 1])
dist.all_reduce(b)  # sum: "or"
assert torch.equal(b, torch.tensor([True, False, True, N > 1]))
b = torch.tensor([R == 0, True])
dist.all_reduce(b, op=dist.ReduceOp.PRODUCT)  # "and"
assert torch.equal(b, torch.tensor([N == 1, True]))
for dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
    x = torch.tensor([1 << (R % 7), 0x7F, R], dtype=dtype)
    for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        y = x.clone()
        dist.all_reduce(y, op=op)
        ref = x.clone().zero_()
        for r in range(N):
            v = torch.tensor([1 << (r % 7), 0x7F, r], dtype=dtype)
            ref = (ref | v if op == dist.ReduceOp.BOR else ref ^ v if op == dist.ReduceOp.BXOR
                   else (v if r == 0 else ref & v))
        assert torch.equal(y, ref), (dtype, op, y, ref)
i16 = torch.full((5,), 1000 * (R + 1), dtype=torch.int16)
dist.all_reduce(i16, op=dist.ReduceOp.MAX)
assert torch.equal(i16, torch.full((5,), 1000 * N, dtype=torch.int16))

# sparse allreduce (Gloo's way): uneven nnz, duplicate indices (uncoalesced),
# a rank with nothing, a dense part; the sum against the dense reference
def sparse_of(r):
    nnz = 0 if r == 1 else r + 2
    idx = torch.tensor([[(r * 3 + k) % 5 for k in range(nnz)] + [0],
                        [(r + k) % 4 for k in range(nnz)] + [0]])
    val = torch.arange((nnz + 1) * 2, dtype=torch.float64).reshape(nnz + 1, 2) + 10 * r
    return torch.sparse_coo_tensor(idx, val, (5, 4, 2))


sp = sparse_of(R)
dist.all_reduce(sp)
assert torch.equal(sp.to_dense(), sum(sparse_of(r).to_dense() for r in range(N))), sp

# point-to-point: a ring of isend/irecv (non-contiguous receive, int8),
# messages of one tag in order, tags kept apart, receives from any source
nxt, prv = (R + 1) % N, (R - 1) % N
out = (torch.arange(24, dtype=torch.int8) + 3 * R).reshape(4, 6)
got = torch.zeros(6, 4, dtype=torch.int8).t()  # non-contiguous
works = [dist.isend(out, nxt, tag=5), dist.irecv(got, prv, tag=5)]
for w in works:
    w.wait()
assert torch.equal(got, (torch.arange(24, dtype=torch.int8) + 3 * prv).reshape(4, 6))
if R == 0:
    for v, tag in ((1.0, 1), (2.0, 2), (3.0, 1)):
        dist.send(torch.tensor([v]), 1, tag=tag)
elif R == 1:
    seen = []
    for tag in (2, 1, 1):
        x = torch.zeros(1)
        dist.recv(x, 0, tag=tag)
        seen.append(x.item())
    assert seen == [2.0, 1.0, 3.0], seen
if R == 0:
    senders = set()
    for _ in range(N - 1):
        x = torch.zeros(2, dtype=torch.float64)
        src = dist.recv(x, tag=7)  # any source
        assert x.tolist() == [src, src * 10], (src, x)
        senders.add(src)
    assert senders == set(range(1, N)), senders
else:
    dist.send(torch.tensor([R, R * 10], dtype=torch.float64), 0, tag=7)
ops = [dist.P2POp(dist.isend, torch.full((1000,), R, dtype=torch.float32), nxt),
       dist.P2POp(dist.irecv, torch.zeros(1000), prv)]
reqs = dist.batch_isend_irecv(ops)
# gflow.torch posts the batch as one sendRecv call: one Work for every op
assert getattr(dist.batch_isend_irecv, "_gflow", False) and len(reqs) == 2 and reqs[0] is reqs[1]
for q in reqs:
    q.wait()
assert torch.equal(ops[1].tensor, torch.full((1000,), prv, dtype=torch.float32))
dist.barrier()

# torch's own ProcessGroupGloo *_checks cases, on a gflow group: every rank
# makes the same bad call and raises a RuntimeError in Gloo's words; the
# group stays usable (an exact allreduce after them)
from torch._C._distributed_c10d import (AllreduceCoalescedOptions, AllreduceOptions,  # noqa: E402
                                        BroadcastOptions, GatherOptions, ReduceOptions,
                                        ScatterOptions)


def _opts(cls, **kw):
    o = cls()
    for k, v in kw.items():
        setattr(o, k, v)
    return o


# torch 2.x dispatches a group's call by its tensors' device: a call without
# any tensor fails in torch's dispatcher, before any backend (gloo too).
TORCH2 = int(torch.__version__.split(".")[0]) >= 2
NO_TENSOR = "There were no tensor arguments to this function"

pg = dist.new_group()
t1, t2, t3 = torch.zeros([1]), torch.zeros([1], dtype=torch.float64), torch.zeros([2])
B, G, S, RO = BroadcastOptions, GatherOptions, ScatterOptions, ReduceOptions
checks = [
    ("invalid root rank", lambda: pg.broadcast([t1], _opts(B, rootRank=-1, rootTensor=0))),
    ("invalid root rank", lambda: pg.broadcast([t1], _opts(B, rootRank=N, rootTensor=0))),
    ("invalid root tensor", lambda: pg.broadcast([t1], _opts(B, rootRank=R, rootTensor=1))),
    ("invalid root tensor", lambda: pg.broadcast([], _opts(B, rootRank=R, rootTensor=0)), NO_TENSOR),
    ("invalid tensor type", lambda: pg.broadcast([t1, t2], _opts(B, rootRank=R, rootTensor=0))),
    ("invalid tensor size", lambda: pg.broadcast([t1, t3], _opts(B, rootRank=R, rootTensor=0))),
    ("requires non-empty tensor list", lambda: pg.allreduce([], AllreduceOptions()), NO_TENSOR),
    ("invalid tensor type", lambda: pg.allreduce([t1, t2], AllreduceOptions())),
    ("invalid tensor size", lambda: pg.allreduce([t1, t3], AllreduceOptions())),
    ("requires non-empty tensor list",
     lambda: pg.allreduce_coalesced([], AllreduceCoalescedOptions()), NO_TENSOR),
    ("tensors must all have the same type",
     lambda: pg.allreduce_coalesced([t1, t2], AllreduceCoalescedOptions())),
    ("invalid root rank", lambda: pg.scatter([t1], [], _opts(S, rootRank=-1))),
    ("requires a single-element output tensor list", lambda: pg.scatter([], [], _opts(S)),
     NO_TENSOR),
    ("requires a single-element input list", lambda: pg.scatter([t1], [], _opts(S, rootRank=R))),
    ("Incorrect input list size %d. Input list size should be %d" % (N + 1, N),
     lambda: pg.scatter([t1], [[t1] * (N + 1)], _opts(S, rootRank=R))),
    ("invalid tensor type", lambda: pg.scatter([t1], [[t2] * N], _opts(S, rootRank=R))),
    ("invalid tensor size", lambda: pg.scatter([t1], [[t3] * N], _opts(S, rootRank=R))),
    ("invalid root rank", lambda: pg.gather([], [t1], _opts(G, rootRank=N))),
    ("requires a single-element input tensor list", lambda: pg.gather([], [], _opts(G)),
     NO_TENSOR),
    ("requires a single-element output list", lambda: pg.gather([], [t1], _opts(G, rootRank=R))),
    ("Incorrect output list size %d. Output list size should be %d" % (N + 1, N),
     lambda: pg.gather([[t1] * (N + 1)], [t1], _opts(G, rootRank=R))),
    ("invalid tensor type", lambda: pg.gather([[t2] * N], [t1], _opts(G, rootRank=R))),
    ("invalid tensor size", lambda: pg.gather([[t3] * N], [t1], _opts(G, rootRank=R))),
    ("requires non-empty input tensor list", lambda: pg.allgather([], []), NO_TENSOR),
    ("requires input/output tensor lists to have the same length",
     lambda: pg.allgather([], [t1])),
    ("invalid output tensor list", lambda: pg.allgather([[t1] * (N + 1)], [t1])),
    ("invalid tensor type", lambda: pg.allgather([[t1] * N], [t2])),
    ("invalid root rank", lambda: pg.reduce([t1], _opts(RO, rootRank=-1, rootTensor=0))),
    ("invalid root tensor", lambda: pg.reduce([t1], _opts(RO, rootRank=R, rootTensor=1))),
    ("requires a single-element tensor list",
     lambda: pg.reduce([t1, t1], _opts(RO, rootRank=R, rootTensor=0))),
]
if N >= 2:
    checks += [
        ("requires empty input on non-root",
         lambda: pg.scatter([t1], [[t1] * N], _opts(S, rootRank=(R + 1) % N))),
        ("requires empty output on non-root",
         lambda: pg.gather([[t1] * N], [t1], _opts(G, rootRank=(R + 1) % N))),
    ]
for want, call, *torch2 in checks:
    try:
        call()
    except NotImplementedError as e:
        assert TORCH2 and torch2 and torch2[0] in str(e), (want, str(e))
    except RuntimeError as e:  # gflow.InvalidArgumentError is one, as Gloo's errors are
        assert isinstance(e, gflow.InvalidArgumentError) and re.search(want, str(e)), \
            (want, type(e), str(e))
    else:
        raise AssertionError("no error: " + want)
x = torch.full((3,), float(R + 1))
pg.allreduce([x]).wait()
assert x.tolist() == [N * (N + 1) / 2] * 3, x

# monitored_barrier: every rank arrives; then rank 1 stays away and rank 0
# names it, the others hear of it from rank 0
dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
if N >= 2:
    if R != 1:
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=1), wait_all_ranks=True)
        except RuntimeError as e:
            want = "Rank 1 failed to pass monitoredBarrier" if R == 0 else \
                "successfully reached monitoredBarrier, but received errors"
            assert want in str(e), str(e)
        else:
            raise AssertionError("monitored_barrier passed without rank 1")
    dist.barrier()

# a subgroup (new_group creates another gflow process group through the store)
if N >= 3:
    g = dist.new_group([0, 2])
    if R in (0, 2):
        s = torch.tensor([float(R)])
        dist.all_reduce(s, group=g)
        assert s.item() == 2.0
        # batch_isend_irecv in the subgroup: peers are global ranks, which
        # gflow.torch maps to the group's (0 <-> 2 here)
        other = 2 - R
        got = torch.zeros(5)
        reqs = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, torch.full((5,), float(R)), other, group=g, tag=4),
            dist.P2POp(dist.irecv, got, other, group=g, tag=4)])
        for q in reqs:
            q.wait()
        assert torch.equal(got, torch.full((5,), float(other))), got

# errors name what was wrong (gflow.Error subclasses, also through
# torch.distributed); every rank rejects the same calls, so the group stays
# usable (as torch's own *_checks tests expect of a process group)
g = dist.new_group()
for bad, what in ((lambda g: dist.all_reduce(torch.zeros(3, dtype=torch.bool),
                                             op=dist.ReduceOp.AVG, group=g),
                   "reduce op avg does not apply to bool"),
                  (lambda g: dist.all_reduce(torch.zeros(3), op=dist.ReduceOp.BAND, group=g),
                   "reduce op band does not apply to float32"),
                  (lambda g: dist.all_reduce(sparse_of(R), op=dist.ReduceOp.MAX, group=g),
                   "unsupported reduction operation"),
                  (lambda g: dist.all_gather([torch.zeros(3)], torch.zeros(3), group=g),
                   "invalid output tensor list"),
                  (lambda g: all_reduce_many([torch.zeros(3), torch.zeros(4)], group=g),
                   "invalid tensor size at index 1"),
                  (lambda g: broadcast_many([torch.zeros(3)], 0, group=g, src_tensor=1),
                   "invalid root tensor: 1")):
    try:
        bad(g)
    except gflow.InvalidArgumentError as e:  # gflow's errors keep their Python class
        assert what in str(e), str(e)
    else:
        raise AssertionError("no error: " + what)
    s = torch.arange(5, dtype=torch.int64) * (R + 1)
    dist.all_reduce(s, group=g)
    assert s.tolist() == [i * N * (N + 1) // 2 for i in range(5)], s

# bad input on one rank: the others fail at once with MismatchError naming it
g = dist.new_group()
start = time.time()
try:
    if R == 1:
        time.sleep(0.3)  # the others are in the allreduce
        dist.all_reduce(torch.zeros(12, dtype=torch.bool), op=dist.ReduceOp.AVG, group=g)
    else:
        dist.all_reduce(torch.zeros(12), group=g)
except gflow.Error as e:
    want = gflow.InvalidArgumentError if R == 1 else gflow.MismatchError
    assert isinstance(e, want) and "does not apply" in str(e), (type(e), str(e))
    assert time.time() - start < 10, time.time() - start
else:
    raise AssertionError("no error on rank %d" % R)
dist.barrier()
print("rank %d ok" % R, flush=True)
dist.destroy_process_group()
