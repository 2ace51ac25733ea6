"""Bad input raises a gflow.Error naming what was wrong (one rank), and
failures across ranks (mismatch, timeout, a dead peer) raise the matching
subclass on every surviving rank instead of hanging (worker_errors.py)."""

import builtins

import numpy as np
import pytest
import torch

import gflow
from conftest import assert_all_ok, launch


def raises(cls, match, fn, *args, **kwargs):
    with pytest.raises(cls, match=match) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, gflow.Error)
    assert info.value.code == cls.code
    return info.value


def test_error_hierarchy():
    assert issubclass(gflow.InvalidArgumentError, ValueError)
    assert issubclass(gflow.TimeoutError, builtins.TimeoutError)
    assert issubclass(gflow.PeerLostError, ConnectionError)
    assert issubclass(gflow.UnauthorizedError, PermissionError)
    for cls in (gflow.MismatchError, gflow.AbortedError, gflow.InternalError):
        assert issubclass(cls, gflow.Error)
    assert [c.value for c in gflow.ErrorCode] == list(range(7))
    assert {c.name.lower() for c in gflow.ErrorCode} == set(gflow._gflow._error_codes().values())


def test_bad_arrays(single):
    e = raises(gflow.InvalidArgumentError, "not contiguous", single.allreduce,
               np.zeros(10, np.float32)[::2])
    assert e.op == "" and "ascontiguousarray" in e.detail
    raises(gflow.InvalidArgumentError, "not contiguous", single.allreduce,
           torch.zeros(4, 3).t())
    raises(gflow.InvalidArgumentError, "not supported", single.allreduce,
           np.zeros(3, np.complex64))
    raises(gflow.InvalidArgumentError, "not supported", single.allreduce,
           torch.zeros(3, dtype=torch.bool))
    ro = np.zeros(3)
    ro.flags.writeable = False
    raises(gflow.InvalidArgumentError, "read-only", single.allreduce, ro)
    raises(gflow.InvalidArgumentError, "read-only", single.broadcast, ro)
    raises(gflow.InvalidArgumentError, "expected a numpy array or a CPU torch tensor, got list",
           single.allreduce, [1.0, 2.0])
    raises(gflow.InvalidArgumentError, "reduce", single.allreduce, np.zeros(3), "median")
    raises(gflow.InvalidArgumentError, "expected", single.allreduce, np.zeros(3), 3.5)
    raises(gflow.InvalidArgumentError, "data type|dtype", single.allreduce,
           np.zeros(3, np.float32), wire="float8")
    raises(gflow.InvalidArgumentError, "in-place", single.allreduce, np.zeros(3, np.float32),
           out=np.zeros(3, np.float32), wire="float16")
    raises(gflow.InvalidArgumentError, "timeout", single.barrier(async_op=True).wait, -1)


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
    raises(gflow.InvalidArgumentError, "tensor 0", gflow.GradientReducer, single,
           [np.zeros(4)[::2]])
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


@pytest.mark.parametrize("case", ["mismatch", "timeout", "peer_lost"])
def test_multi_rank_failures(case):
    ranks = launch(3, ["worker_errors.py", case], timeout=90)
    assert_all_ok(ranks)
    for r in ranks:
        assert "expected error" in r.stdout or (case == "peer_lost" and r.rank == 2), repr(r)
