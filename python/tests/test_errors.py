"""Bad input raises a gflow.Error naming what was wrong (one rank), and
failures across ranks (mismatch, timeout, a dead peer) raise the matching
subclass on every surviving rank instead of hanging (worker_errors.py)."""

import builtins
import datetime

import numpy as np
import pytest
import torch

import gflow
from conftest import assert_all_ok, launch, make_single


def raises(cls, match, fn, *args, **kwargs):
    with pytest.raises(cls, match=match) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, gflow.Error)
    assert info.value.code == cls.code
    return info.value


def test_error_hierarchy():
    assert issubclass(gflow.Error, RuntimeError)  # as torch.distributed's backends raise
    assert issubclass(gflow.InvalidArgumentError, ValueError)
    assert issubclass(gflow.TimeoutError, builtins.TimeoutError)
    assert issubclass(gflow.PeerLostError, ConnectionError)
    assert issubclass(gflow.UnauthorizedError, PermissionError)
    for cls in (gflow.MismatchError, gflow.AbortedError, gflow.InternalError):
        assert issubclass(cls, gflow.Error)
    assert [c.value for c in gflow.ErrorCode] == list(range(7))
    assert {c.name.lower() for c in gflow.ErrorCode} == set(gflow._gflow._error_codes().values())


def _ro():
    ro = np.zeros(3)
    ro.flags.writeable = False
    return ro


@pytest.mark.parametrize("call, match, op", [
    (lambda c: c.allreduce(np.zeros(10, np.float32)[::2]), "ascontiguousarray", "allreduce"),
    (lambda c: c.allreduce(torch.zeros(4, 3).t()), "not contiguous", "allreduce"),
    (lambda c: c.allreduce(np.zeros(3, np.longdouble)), "not supported", "allreduce"),
    (lambda c: c.allreduce(torch.zeros(3, dtype=torch.complex32)), "not supported", "allreduce"),
    (lambda c: c.allreduce(np.zeros(3, np.float32), "bxor"),
     "reduce op bxor does not apply to float32", "allreduce"),
    (lambda c: c.allreduce(_ro()), "read-only", "allreduce"),
    (lambda c: c.broadcast(_ro()), "read-only", "broadcast"),
    (lambda c: c.broadcast(np.zeros(3), root="0"), "root must be an int", "broadcast"),
    (lambda c: c.allreduce([1.0, 2.0]),
     "expected a numpy array or a torch tensor \\(CPU or CUDA\\), got list", "allreduce"),
    (lambda c: c.allreduce(np.zeros(3), "median"), "reduce", "allreduce"),
    (lambda c: c.allreduce(np.zeros(3), 3.5), "expected", "allreduce"),
    (lambda c: c.allreduce(np.zeros(3, np.float32), wire="float8"), "data type|dtype",
     "allreduce"),
    (lambda c: c.allreduce(np.zeros(3, np.float32), out=np.zeros(3, np.float32), wire="float16"),
     "in-place", "allreduce"),
    (lambda c: c.reduce_scatter(np.zeros(3), _ro()), "read-only", "reduce_scatter"),
    (lambda c: c.allgather([1], np.zeros(3)), "got list", "allgather"),
    (lambda c: gflow.GradientReducer(c, [np.zeros(4)[::2]]), "tensor 0", "GradientReducer"),
    (lambda c: c.allgatherv(np.zeros(2), np.zeros(2), [1, 1]), "counts has 2 entries",
     "allgatherv"),
    (lambda c: c.allgatherv(np.zeros(2), np.zeros(2), 2), "sequence", "allgatherv"),
    (lambda c: c.gatherv(np.zeros(2), None, [2]), "the root .* passes", "gatherv"),
    (lambda c: c.scatterv(np.zeros(2), np.zeros(2), [-2]), "negative", "scatterv"),
    (lambda c: c.reduce_scatterv(np.zeros(2), np.zeros(2), [2], "median"), "reduce",
     "reduce_scatterv"),
    (lambda c: c.alltoallv(np.zeros(2), [2], np.zeros(2), [2.0]), "must be an int", "alltoallv"),
    (lambda c: c.alltoallv(np.zeros(2), [2], np.zeros(2), [2], in_offsets=[1]), "alltoallv",
     "alltoallv"),
    (lambda c: c.send(np.zeros(2), 5), "peer 5", "send"),
])
def test_bad_arrays_are_rejected(call, match, op):
    # A collective with bad arguments is rejected: the communicator stays
    # usable (peers that run the op raise MismatchError at once). A send or
    # recv fails the communicator (its peer has no op number to reject): the
    # next call raises the same error.
    comm = make_single()
    e = raises(gflow.InvalidArgumentError, match, call, comm)
    assert e.op == op and e.rank == 0, (e.op, e.rank)
    if op in ("send", "recv"):
        again = raises(gflow.InvalidArgumentError, match, comm.barrier)
        assert again.detail == e.detail
    else:
        comm.barrier()


def test_timeouts(single):
    w = single.barrier(async_op=True)
    w.wait(30)
    # Work.wait's timeout is local: misuse raises without failing the communicator.
    for bad in (-1, 0, float("nan"), "soon", [1]):
        raises(gflow.InvalidArgumentError, "timeout", w.wait, bad)
    for ok in (1e-7, 0.0004, float("inf"), datetime.timedelta(microseconds=1), None, 30):
        w.wait(ok)  # sub-millisecond rounds up to 1 ms, never to "no limit"
    single.barrier()
    raises(gflow.InvalidArgumentError, "timeout", gflow.create, rank=0, size=1,
           root="127.0.0.1:1", timeout=float("nan"))


def test_reject_invalid_argument(single):
    e = raises(gflow.InvalidArgumentError, "my check", single.reject_invalid_argument, "allreduce",
               "my check")
    assert e.op == "allreduce"
    # The collective is rejected, the communicator stays usable.
    x = np.arange(3.0)
    single.allreduce(x)
    np.testing.assert_array_equal(x, np.arange(3.0))


@pytest.mark.parametrize("call, match, op", [
    (lambda c: c.allgather(np.zeros(3, np.float32), np.zeros(4, np.float32)), "out.count",
     "allgather"),
    (lambda c: c.reduce_scatter(np.zeros(3, np.float32), np.zeros(3, np.float64)), "",
     "reduce_scatter"),
    (lambda c: c.broadcast(np.zeros(3), root=5), "root", "broadcast"),
    (lambda c: c.allreduce(np.zeros(3, np.int32), wire="float16"), "", "allreduce"),
])
def test_bad_shapes_and_roots(single, call, match, op):
    # The C++ argument checks surface with their op name (a fresh
    # communicator each: a failed op fails its communicator, docs/errors.md).
    e = raises(gflow.InvalidArgumentError, match, call, single)
    assert e.op == op and e.rank == 0


def test_reducer_misuse(single):
    g = np.zeros(8, np.float32)
    r = gflow.GradientReducer(single, [g])
    raises(gflow.InvalidArgumentError, "", r.ready, 1)
    r.ready(0)
    raises(gflow.InvalidArgumentError, "", r.ready, 0)
    r.wait(timeout=10)
    raises(gflow.InvalidArgumentError, "comm is None", gflow.GradientReducer, None, [g])


def test_values_without_init(single):
    assert single.rank == 0 and single.size == 1 and single.num_hosts == 1
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    single.allreduce(x, "avg")
    assert np.array_equal(x, np.arange(6).reshape(2, 3))
    assert single.split(-1) is None
    sub = single.split(0)
    assert sub.size == 1


def test_abort_fails_pending_and_later_ops(single):
    single.abort()
    e = raises(gflow.AbortedError, "", single.barrier)
    assert e.rank == 0


@pytest.mark.parametrize("case", ["mismatch", "timeout", "peer_lost", "bad_input"])
def test_multi_rank_failures(case):
    ranks = launch(3, ["worker_errors.py", case], timeout=90)
    assert_all_ok(ranks)
    for r in ranks:
        assert "expected error" in r.stdout or (case == "peer_lost" and r.rank == 2), repr(r)
