"""One rank of test_collectives.py: every collective on numpy arrays and CPU
torch tensors against a float64 / exact-integer reference computed from
every rank's inputs (each rank can generate all ranks' data). Exits 0 when
every check passed; an AssertionError exits non-zero with the reason."""

import gc
import math
import os
import sys
import threading
import time
import weakref

import numpy as np
import torch

import gflow
from waiting import wait_until

comm = gflow.init(timeout=60)
R, N = comm.rank, comm.size
assert (R, N) == (comm.rank, comm.size) and N >= 2
assert gflow.default_communicator() is not None


def inputs(dtype, count, seed, op="sum"):
    """Every rank's input for one case (list indexed by rank)."""
    out = []
    for r in range(N):
        rng = np.random.default_rng(seed * 1009 + r)
        if op == "prod":
            v = rng.integers(1, 3, count) * rng.choice([-1, 1], count)
        elif np.issubdtype(np.dtype(dtype), np.integer):
            lo = 0 if np.dtype(dtype) == np.uint8 else -1000
            hi = 255 // N if np.dtype(dtype) == np.uint8 else 1000
            v = rng.integers(lo, hi, count)
        else:
            v = rng.uniform(-1, 1, count)
        if op == "prod" and np.dtype(dtype) == np.uint8:
            v = np.abs(v)
        out.append(v.astype(dtype))
    return out


def reference(xs, op):
    a = np.stack([x.astype(np.float64) for x in xs])
    integer = np.issubdtype(xs[0].dtype, np.integer)
    if op == "sum":
        return a.sum(0)
    if op == "avg":
        return np.trunc(a.sum(0) / N) if integer else a.sum(0) / N
    if op == "min":
        return a.min(0)
    if op == "max":
        return a.max(0)
    return a.prod(0)


def check_close(got, want, xs, what):
    got = np.asarray(got, dtype=np.float64)
    if np.issubdtype(xs[0].dtype, np.integer):
        assert np.array_equal(got, want), what
        return
    eps = {np.float16: 2.0**-11, np.float32: 2.0**-24, np.float64: 2.0**-53}[xs[0].dtype.type]
    scale = np.stack([np.abs(x.astype(np.float64)) for x in xs]).sum(0)
    bound = (N + 1) * eps * scale + 1e-300
    assert np.all(np.abs(got - want) <= bound), "%s: max error %g" % (
        what, np.max(np.abs(got - want) - bound))


def same_everywhere(arr, what):
    """Bitwise equality of `arr` on every rank (allgather of its bytes)."""
    b = np.frombuffer(np.ascontiguousarray(arr).tobytes(), dtype=np.uint8).copy()
    out = np.empty(b.size * N, np.uint8)
    comm.allgather(b, out)
    rows = out.reshape(N, -1)
    assert all(np.array_equal(rows[0], rows[i]) for i in range(N)), what + " differs across ranks"


# ---- allreduce on numpy arrays, every dtype and op
seed = 1
for dtype in (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8):
    for op in ("sum", "avg", "min", "max", "prod"):
        for count in (1, 1000, 40001):
            seed += 1
            if dtype == np.float16 and count > 1000:
                continue
            xs = inputs(dtype, count, seed, op)
            x = xs[R].copy()
            comm.allreduce(x, op)
            check_close(x, reference(xs, op), xs, "allreduce %s %s n=%d" % (
                np.dtype(dtype).name, op, count))
            same_everywhere(x, "allreduce result")
# ReduceOp enum and 2-d arrays
xs = inputs(np.float32, 600, 7)
x = xs[R].reshape(20, 30).copy()
comm.allreduce(x, gflow.ReduceOp.MAX)
assert np.array_equal(x.ravel(), reference(xs, "max"))

# ---- torch tensors through DLPack: float32, bfloat16 (exact small integers), int64
xs = inputs(np.float32, 5000, 11)
t = torch.from_numpy(xs[R].copy())
comm.allreduce(t, "sum")
check_close(t.numpy(), reference(xs, "sum"), xs, "torch float32")
ints = [np.round(x * 8) for x in inputs(np.float32, 300, 12)]
tb = torch.tensor(ints[R], dtype=torch.bfloat16)
comm.allreduce(tb, "sum")
assert np.array_equal(tb.float().numpy(), reference(ints, "sum")), "torch bfloat16"
xs = inputs(np.int64, 777, 13)
ti = torch.from_numpy(xs[R].copy())
comm.allreduce(ti, "max")
assert np.array_equal(ti.numpy(), reference(xs, "max"))
p = torch.nn.Parameter(torch.full((4,), float(R + 1)))  # requires grad: shared memory
comm.allreduce(p, "sum")
assert torch.equal(p.detach(), torch.full((4,), N * (N + 1) / 2.0))

# ---- int8, int16, bool and complex (numpy and torch), bitwise ops: exact
def small_ints(dtype, count, seed, lo, hi):
    return [np.random.default_rng(seed * 1009 + r).integers(lo, hi, count).astype(dtype)
            for r in range(N)]


bitwise = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
for dtype, tdtype in ((np.int8, torch.int8), (np.int16, torch.int16)):
    for op in ("sum", "avg", "min", "max", "band", "bor", "bxor"):
        seed += 1
        xs = small_ints(dtype, 3001, seed, -100 // N, 100 // N)
        want = (bitwise[op].reduce(np.stack(xs), axis=0) if op in bitwise
                else reference(xs, op))
        x = xs[R].copy()
        comm.allreduce(x, op)
        assert np.array_equal(x.astype(np.float64), want), "%s %s" % (np.dtype(dtype).name, op)
        t = torch.from_numpy(xs[R].copy())
        assert t.dtype == tdtype
        comm.allreduce(t, op)
        assert np.array_equal(t.numpy().astype(np.float64), want), "torch %s %s" % (tdtype, op)
# bool: sum and max are "or", prod and min "and"
bools = [np.random.default_rng(500 + r).integers(0, 2, 999).astype(np.bool_) for r in range(N)]
for op, fold in (("sum", np.logical_or), ("max", np.logical_or), ("prod", np.logical_and),
                 ("min", np.logical_and), ("band", np.logical_and), ("bor", np.logical_or),
                 ("bxor", np.logical_xor)):
    want = fold.reduce(np.stack(bools), axis=0)
    x = bools[R].copy()
    comm.allreduce(x, op)
    assert x.dtype == np.bool_ and np.array_equal(x, want), "numpy bool " + op
    t = torch.from_numpy(bools[R].copy())
    comm.allreduce(t, op)
    assert t.dtype == torch.bool and np.array_equal(t.numpy(), want), "torch bool " + op
# complex: sum and avg part by part (small integers, exact)
cs = [(np.random.default_rng(600 + r).integers(-8, 8, 777)
       + 1j * np.random.default_rng(700 + r).integers(-8, 8, 777)).astype(np.complex64)
      for r in range(N)]
for op in ("sum", "avg"):
    total = np.stack([c.astype(np.complex128) for c in cs]).sum(0)
    # avg divides each part (numpy's complex division by N + 0j may differ)
    want = total if op == "sum" else total.real / N + 1j * (total.imag / N)
    x = cs[R].copy()
    comm.allreduce(x, op)
    assert np.array_equal(x, want.astype(np.complex64)), "numpy complex64 " + op
    t = torch.from_numpy(cs[R].astype(np.complex128))
    comm.allreduce(t, op)
    assert np.array_equal(t.numpy(), want), "torch complex128 " + op

# ---- out-of-place: the input is untouched
xs = inputs(np.float64, 999, 14)
x = xs[R].copy()
out = np.empty_like(x)
comm.allreduce(x, "sum", out=out)
assert np.array_equal(x, xs[R])
check_close(out, reference(xs, "sum"), xs, "out-of-place")

# ---- reduce_scatter, allgather, broadcast, barrier
k = 1234
xs = inputs(np.float32, k * N, 15)
out = np.empty(k, np.float32)
comm.reduce_scatter(xs[R].copy(), out, "sum")
check_close(out, reference(xs, "sum")[R * k:(R + 1) * k], [x[R * k:(R + 1) * k] for x in xs],
            "reduce_scatter")
xs = inputs(np.int32, 321, 16)
out = torch.empty(321 * N, dtype=torch.int32)
comm.allgather(xs[R], out)
assert np.array_equal(out.numpy(), np.concatenate(xs)), "allgather"
xs = inputs(np.float64, 100, 17)
x = xs[R].copy()
comm.broadcast(x, root=N - 1)
assert np.array_equal(x, xs[N - 1]), "broadcast"
comm.barrier()

# ---- reduce, gather, scatter, alltoall (the root's array only on the root)
xs = inputs(np.int64, 77, 18)
out = np.full(77, -1, np.int64)
root = N - 1
comm.reduce(xs[R], root=root, op="max", out=out if R == root else None)
expect = np.max(np.stack(xs), axis=0) if R == root else np.full(77, -1, np.int64)
assert np.array_equal(out, expect), "reduce"
x = xs[R].copy()
comm.reduce(x, root=0)  # in place on the root; untouched elsewhere
assert np.array_equal(x, np.sum(np.stack(xs), axis=0) if R == 0 else xs[R]), "reduce in place"
g = np.empty(77 * N, np.int64) if R == root else None
comm.gather(xs[R], g, root=root)
assert R != root or np.array_equal(g, np.concatenate(xs)), "gather"
s = np.empty(77, np.int64)
comm.scatter(np.concatenate(xs) if R == 0 else None, s, root=0)
assert np.array_equal(s, xs[R]), "scatter"
a = np.arange(N * 5, dtype=np.float32) + 1000 * R
b = np.empty_like(a)
comm.alltoall(a, b)
assert np.array_equal(b, np.concatenate([np.arange(R * 5, R * 5 + 5, dtype=np.float32) + 1000 * j
                                         for j in range(N)])), "alltoall"
st = comm.stats()
assert (st["reduce"], st["gather"], st["scatter"], st["alltoall"]) == (2, 1, 1, 1), st

# ---- the uneven (v) forms: rank r's block has counts[r] elements (one empty)
before = comm.stats()
counts = [(3 * r + 2) % 7 for r in range(N)]  # then the last is 0: N=3 gives 2, 5, 0
counts[N - 1] = 0
offs = np.concatenate([[0], np.cumsum(counts)]).astype(int)
blocks = [np.arange(counts[r], dtype=np.int32) + 100 * r for r in range(N)]
whole = np.concatenate(blocks)
out = np.full(sum(counts), -1, np.int32)
comm.allgatherv(blocks[R], out, counts)
assert np.array_equal(out, whole), "allgatherv"
g = np.full(sum(counts), -1, np.int32) if R == root else None
comm.gatherv(blocks[R], g, counts, root=root)
assert R != root or np.array_equal(g, whole), "gatherv"
mine = np.full(counts[R], -1, np.int32)
comm.scatterv(whole if R == 0 else None, mine, counts, root=0)
assert np.array_equal(mine, blocks[R]), "scatterv"
xs = inputs(np.float64, sum(counts), 19)
mine = np.empty(counts[R], np.float64)
w = comm.reduce_scatterv(xs[R].copy(), mine, counts, "sum", async_op=True)
w.wait()
assert w.source is None  # only a receive has one
check_close(mine, reference(xs, "sum")[offs[R]:offs[R + 1]],
            [x[offs[R]:offs[R + 1]] for x in xs], "reduce_scatterv")
# alltoallv: rank i sends i + j + 1 elements to rank j, valued 1000 * i + j
send_counts = [R + j + 1 for j in range(N)]
recv_counts = [i + R + 1 for i in range(N)]
a = np.concatenate([np.full(send_counts[j], 1000 * R + j, np.int64) for j in range(N)])
b = np.full(sum(recv_counts), -1, np.int64)
comm.alltoallv(a, send_counts, b, recv_counts)
assert np.array_equal(b, np.concatenate([np.full(recv_counts[i], 1000 * i + R, np.int64)
                                         for i in range(N)])), "alltoallv"
# explicit offsets: the received blocks in reverse rank order, 2 apart
out_offs, at = [0] * N, 0
for i in reversed(range(N)):
    out_offs[i] = at
    at += recv_counts[i] + 2
b = np.full(at, -1, np.int64)
comm.alltoallv(a, send_counts, b, recv_counts, out_offsets=out_offs)
for i in range(N):
    assert np.array_equal(b[out_offs[i]:out_offs[i] + recv_counts[i]],
                          np.full(recv_counts[i], 1000 * i + R)), "alltoallv offsets"
    assert np.all(b[out_offs[i] + recv_counts[i]:out_offs[i] + recv_counts[i] + 2] == -1)
st = comm.stats()
assert [st[k] - before[k] for k in ("allgather", "gather", "scatter", "alltoall")] == [
    1, 1, 1, 2], (before, st)

# ---- send / recv: a ring, then every other rank to rank 0 from any source
nxt, prv = (R + 1) % N, (R - 1) % N
mine = np.arange(40, dtype=np.int16) * (R + 1)
theirs = np.zeros(40, np.int16)
if R % 2 == 0:
    comm.send(mine, nxt, tag=3)
    assert comm.recv(theirs, prv, tag=3) == prv
else:
    w = comm.recv(theirs, prv, tag=3, async_op=True)
    comm.send(mine, nxt, tag=3)
    w.wait()
    assert w.source == prv, w.source
assert np.array_equal(theirs, np.arange(40, dtype=np.int16) * (prv + 1)), "recv"
if R == 0:
    got = set()
    for _ in range(N - 1):
        v = np.zeros(1, np.float64)
        src = comm.recv(v)
        assert v[0] == src * 1.5, (src, v)
        got.add(src)
    assert got == set(range(1, N)), got
    v = np.zeros(1, np.float64)
    w = comm.recv(v, tag=5, async_op=True)  # any source, async: the Work names the sender
    w.wait()
    assert w.source == N - 1 and v[0] == -1.0, (w.source, v)
else:
    comm.send(np.array([R * 1.5]), 0)
    if R == N - 1:
        comm.send(np.array([-1.0]), 0, tag=5)  # its own tag: not taken by the loop above
assert comm.stats()["point_to_point"] == (
    3 + (R == N - 1) if R != 0 else 2 + N), comm.stats()
comm.barrier()

# ---- a large send/recv ring: between the ranks of one host the receiver
# reads it from the sender's buffer (single copy, GFLOW_LOCAL_SINGLE_COPY)
big = np.arange(100000, dtype=np.float32) + R
got_big = np.zeros(100000, np.float32)
sent_before = comm.stats()["single_copy_bytes_sent"]
w = comm.recv(got_big, prv, tag=9, async_op=True)
comm.send(big, nxt, tag=9)
w.wait()
assert np.array_equal(got_big, np.arange(100000, dtype=np.float32) + prv), "large recv"


def kernel_allows_single_copy():
    # Root may read any process; otherwise Yama must not restrict ptrace.
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        scope = "0"
    return os.geteuid() == 0 or scope == "0"


single = comm.stats()["single_copy_bytes_sent"] - sent_before
if comm.local_size == N and os.environ.get("GFLOW_SHM", "1") != "0" and kernel_allows_single_copy():
    assert single == big.nbytes, (single, comm.stats())
elif comm.local_size == 1:
    assert single == 0, single
comm.barrier()

# ---- async: several in flight, waited in reverse, callbacks once each
cases = [inputs(np.float32, 3000 + i, 20 + i) for i in range(4)]
arrays = [c[R].copy() for c in cases]
works = [comm.allreduce(a, "sum", async_op=True) for a in arrays]
calls = []
works[0].add_done_callback(lambda w: calls.append(("cb", w.test())))
for w in reversed(works):
    w.wait(timeout=60)
    assert w.test() and w.done()
for a, c in zip(arrays, cases):
    check_close(a, reference(c, "sum"), c, "async allreduce")
deadline = time.time() + 10
while not calls and time.time() < deadline:
    time.sleep(0.01)
assert calls == [("cb", True)], calls
# a dropped Work keeps its tensor alive until the op is done (rank 0 joins
# late, so the op is in flight on the others when they look)
tmp = torch.from_numpy(inputs(np.float32, 100000, 30)[R].copy())
alive = weakref.ref(tmp)
if R == 0:
    time.sleep(0.3)
comm.allreduce(tmp, "sum", async_op=True)
del tmp
gc.collect()
if R != 0:
    assert alive() is not None, "the tensor of a dropped Work in flight was freed"
comm.barrier(async_op=True).wait(timeout=60)
wait_until(lambda: (gc.collect(), alive() is None)[1], what="release after completion")

# ---- float16 / bfloat16 on the wire: the error bound of docs/compression.md
for wire, u, eta in (("float16", 2.0**-11, 2.0**-25), ("bfloat16", 2.0**-8, 2.0**-134)):
    xs = inputs(np.float32, 10000, 40)
    x = xs[R].copy()
    w = comm.allreduce(x, "sum", wire=wire, async_op=True)
    w.wait(timeout=60)
    S = np.stack([np.abs(v.astype(np.float64)) for v in xs]).sum(0)
    err = np.abs(x.astype(np.float64) - reference(xs, "sum"))
    assert np.all(err <= (N + 1) * u * S + N * eta), "%s wire error %g" % (wire, err.max())
    assert not w.nonfinite
    same_everywhere(x, wire + " result")
x = np.ones(10, np.float32)
if R == 0:
    x[3] = 70000.0  # beyond float16's range
w = comm.allreduce(x, "sum", wire=torch.float16, async_op=True)
w.wait(timeout=60)
assert w.nonfinite, "float16 overflow not reported"

# ---- GIL released during a blocking collective: a Python thread keeps running
ticks = [0]
stop = threading.Event()


def spin():
    while not stop.is_set():
        ticks[0] += 1


th = threading.Thread(target=spin)
th.start()
comm.barrier()
if R == 0:
    time.sleep(1.0)  # rank 0 arrives late: the others block in allreduce
before, t0 = ticks[0], time.time()
comm.allreduce(np.ones(8, np.float32), "sum")
during, blocked = ticks[0] - before, time.time() - t0
stop.set()
th.join()
if R != 0:
    # Blocked about 1 s (they left the barrier with rank 0): a thread that
    # cannot take the GIL would not count at all.
    assert blocked > 0.1, "allreduce returned after %.3f s" % blocked
    assert during > 1000, "the thread ran only %d times in %.3f s of allreduce" % (during, blocked)

# ---- GradientReducer: dense, gradients ready in a rank-dependent order
grads = [np.zeros(5000, np.float32), torch.zeros(300), np.zeros(70000, np.float32)]
reducer = gflow.GradientReducer(comm, grads, op="avg", fusion_threshold=64 << 10)
assert len(reducer) == 3 and reducer.buckets
for step in range(3):
    vals = [inputs(np.float32, g.numel() if torch.is_tensor(g) else g.size, 50 + 10 * step + i)
            for i, g in enumerate(grads)]
    order = list(range(3)) if R % 2 == 0 else [2, 0, 1]
    for i in order:
        src = torch.from_numpy(vals[i][R]) if torch.is_tensor(grads[i]) else vals[i][R]
        grads[i][:] = src
        reducer.ready(i)
    reducer.wait(timeout=60)
    for i, g in enumerate(grads):
        got = g.numpy() if torch.is_tensor(g) else g
        check_close(got, reference(vals[i], "avg"), vals[i], "reducer step %d tensor %d" % (
            step, i))
assert reducer.stats()["steps"] == 3

# ---- GradientReducer with CSC against a numpy simulation (integer values: exact)
C, density, count = 4, 0.5, 64
g = np.zeros(count, np.float32)
csc = gflow.GradientReducer(comm, [g], op="sum", density=density, chunk=C)
residual = [np.zeros(count) for _ in range(N)]
for step in range(4):
    vals = [np.round(v * 10) for v in inputs(np.float64, count, 90 + step)]
    for r in range(N):
        residual[r] += vals[r]
    norms = sum(np.abs(residual[r]).reshape(-1, C).sum(1) for r in range(N))
    k = math.ceil(density * (count // C))
    picked = sorted(sorted(range(count // C), key=lambda c: (-norms[c], c))[:k])
    want = np.zeros(count)
    for c in picked:
        sl = slice(c * C, (c + 1) * C)
        want[sl] = sum(residual[r][sl] for r in range(N))
        for r in range(N):
            residual[r][sl] = 0
    g[:] = vals[R]
    csc.ready(0)
    w = csc.wait_async()
    w.wait(timeout=60)
    assert np.array_equal(g.astype(np.float64), want), "CSC step %d" % step
st = csc.stats()
assert st["sparse_chunks_sent"] * 2 == st["sparse_chunks"], st

# ---- stats
s = comm.stats()
assert s["allreduce"] > 0 and s["bytes_sent"] > 0
# One host: every rank shares it, nothing went over the network.
assert s["same_host"] == [True] * N and s["network_bytes_sent"] == 0, s
print("rank %d ok" % R)
gflow.finalize()
