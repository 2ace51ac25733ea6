"""Configuration keywords of gflow.init/gflow.create (the C++ Options groups
shm, tuning, device and progress) and the process-wide setters: a keyword
wins over its GFLOW_* variable, a bad value is an InvalidArgumentError
naming the field, and ranks that disagree fail at creation."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from conftest import PKG, free_port


def world(n, per_rank, timeout=30):
    """Creates n ranks in this process; returns (communicators, errors)."""
    import gflow
    root = "127.0.0.1:%d" % free_port()
    comms, errors = [None] * n, [None] * n

    def make(r):
        try:
            comms[r] = gflow.create(rank=r, size=n, root=root, timeout=timeout, **per_rank(r))
        except Exception as e:  # noqa: BLE001 (collected for the assertions)
            errors[r] = e

    threads = [threading.Thread(target=make, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return comms, errors


def allreduce_on_each(comms):
    threads = [threading.Thread(target=c.allreduce, args=(np.ones(64, np.float32),))
               for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_shm_keyword_wins_over_the_environment():
    # The environment of this process leaves GFLOW_SHM at its default (on).
    comms, errors = world(2, lambda r: {"shm": False})
    assert errors == [None, None], errors
    allreduce_on_each(comms)
    for c in comms:
        s = c.stats()
        assert s["network_ops"] == 1 and s["shared_memory_ops"] == 0, s
        assert [(r["op"], r["path"], r["ops"]) for r in s["routes"]] == [
            ("allreduce", "network", 1)], s
        # Two ranks over TCP: one peer, one socket (Stats::Resources).
        res = s["resources"]
        assert res["peers_connected"] == 1 and res["connections"] == 1, res
        assert res["threads_started"] > 0, res
        assert set(res) == {"peers_connected", "connections", "store_requests", "store_served",
                            "threads_started", "pinned_bytes", "shared_bytes"}, res


def test_tuning_and_progress_keywords_are_accepted():
    config = dict(piece_bytes=65536, ring_window=4, rd_max_bytes=1 << 20, hd_max_bytes=1 << 22,
                  hier_segment_bytes=1 << 20, codec_piece_bytes=1 << 20,
                  shm_chunk_bytes=1 << 16,
                  shm_single_copy="64K-",
                  unexpected_limit_bytes=1 << 24, spin_us=0, pin_threads=False,
                  progress_priority=-1,
                  device_backend="staged", verify_device_ops=True)
    comms, errors = world(2, lambda r: config)
    assert errors == [None, None], errors
    allreduce_on_each(comms)


@pytest.mark.parametrize("key,value,field", [
    ("ring_window", 0, "Options::tuning.ringWindow"),
    ("piece_bytes", 1, "Options::tuning.pieceBytes"),
    ("codec_piece_bytes", 4096, "Options::tuning.codecPieceBytes"),
    ("shm_chunk_bytes", 1, "Options::shm.chunkBytes"),
    ("spin_us", -1, "Options::progress.spinUs"),
    ("progress_priority", 40, "Options::progress.priority"),
    ("device_backend", "gpu", "Options::device.backend"),
    ("shm_single_copy", "1M-64K", "Options::shm.singleCopy"),
])
def test_bad_values_name_the_field(key, value, field):
    import gflow
    with pytest.raises(gflow.InvalidArgumentError, match=field.replace(".", r"\.")):
        gflow.create(rank=0, size=1, root="127.0.0.1:%d" % free_port(), **{key: value})


def test_unknown_keyword_is_a_type_error():
    import gflow
    with pytest.raises(TypeError, match="shm_chunk"):
        gflow.create(rank=0, size=1, root="127.0.0.1:%d" % free_port(), shm_chunk=4096)


def test_ranks_that_disagree_fail_naming_the_parameter():
    import gflow
    comms, errors = world(2, lambda r: {"shm": False} if r == 0 else {})
    for e in errors:
        assert isinstance(e, gflow.InvalidArgumentError), errors
        assert "GFLOW_SHM (Options::shm.enabled) differs" in str(e), str(e)


def test_set_log_level():
    import gflow
    gflow.set_log_level("warn")
    with pytest.raises(gflow.InvalidArgumentError, match="LOUD"):
        gflow.set_log_level("LOUD")


SCRIPT = """
import gflow
gflow.set_cuda_component("/nonexistent/libgflow_cuda.so.0")
print("set", flush=True)
"""


def test_set_cuda_component_before_the_load():
    env = {k: v for k, v in os.environ.items() if not k.startswith("GFLOW_")}
    env["PYTHONPATH"] = PKG
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and "set" in p.stdout, p.stdout + p.stderr


def _fixed_order_sum(xs):
    """float32 sums by reproducible mode's fixed tree (docs/algorithms.md): with
    p the largest power of two <= N, the first 2(N - p) ranks pair up as
    leaves, the others are leaves alone, and the p leaves are summed
    neighbours first, the lower half on the left."""
    n = len(xs)
    p = 1
    while p * 2 <= n:
        p *= 2
    rem = n - p
    level = [xs[2 * v] + xs[2 * v + 1] if v < rem else xs[v + rem] for v in range(p)]
    while len(level) > 1:
        level = [level[i] + level[i + 1] for i in range(0, len(level), 2)]
    return level[0]


def _run_each(comms, fn):
    threads = [threading.Thread(target=fn, args=(c,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_reproducible_keyword_and_per_op_argument_give_the_fixed_order_bits():
    import gflow
    rng = np.random.default_rng(3)
    n = 4
    xs = [(rng.standard_normal(30011) * 2.0 ** rng.integers(-12, 12, 30011)).astype(np.float32)
          for _ in range(n)]
    want = _fixed_order_sum(xs)
    for shm in (True, False):
        # The communicator's keyword; then per op on a default communicator.
        for per_op in (False, True):
            comms, errors = world(n, lambda r: {"shm": shm, "reproducible": not per_op})
            assert errors == [None] * n, errors
            got = [None] * n

            def run(c):
                x = xs[c.rank].copy()
                c.allreduce(x, "sum", reproducible=True if per_op else None)
                got[c.rank] = x

            _run_each(comms, run)
            for r in range(n):
                assert got[r].tobytes() == want.tobytes(), (shm, per_op, r)
    comms, _ = world(n, lambda r: {})
    with pytest.raises(gflow.InvalidArgumentError, match="reproducible"):
        comms[0].allreduce(np.zeros(4, np.float32), out=np.zeros(4, np.float32),
                           reproducible=True)


def test_reproducible_reducer_bits_do_not_depend_on_the_fusion_threshold():
    import gflow
    rng = np.random.default_rng(4)
    n, sizes = 3, [700, 3000, 50, 9000, 1]
    vals = [[rng.standard_normal(s).astype(np.float32) * 100 for s in sizes] for _ in range(n)]
    results = {}
    for threshold in (1024, 1 << 20):
        comms, errors = world(n, lambda r: {})
        assert errors == [None] * n, errors
        got = [None] * n

        def run(c):
            grads = [v.copy() for v in vals[c.rank]]
            red = gflow.GradientReducer(c, grads, op="sum", fusion_threshold=threshold,
                                        reproducible=True)
            for i in range(len(grads)):
                red.ready(i)
            red.wait(timeout=60)
            got[c.rank] = np.concatenate(grads)

        _run_each(comms, run)
        results[threshold] = got
    want = _fixed_order_sum([np.concatenate(v) for v in vals])
    for threshold, got in results.items():
        for r in range(n):
            assert got[r].tobytes() == want.tobytes(), (threshold, r)


def test_stats_name_the_straggler():
    # Rank 1 calls each allreduce 20 ms after rank 0: both name it.
    import time
    comms, errors = world(2, lambda r: {})
    assert errors == [None, None], errors

    def run(c):
        for _ in range(8):
            if c.rank == 1:
                time.sleep(0.02)
            c.allreduce(np.ones(64, np.float32))

    threads = [threading.Thread(target=run, args=(c,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c in comms:
        s = c.stats()
        assert s["times_last"][1] >= 7, s
        assert s["late_ns"][1] / s["times_last"][1] > 10e6, s
        assert len(s["times_last"]) == 2 and s["arrival_ops"] >= 8, s
        assert "rank 1 was last in" in s["straggler_summary"], s
