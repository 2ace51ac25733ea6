"""PyTorch integration (docs/python.md).

DDP communication hooks that run the bucket's allreduce on gflow::

    comm = gflow.init()
    model = DistributedDataParallel(model, process_group=...)
    model.register_comm_hook(comm, gflow.torch.allreduce_hook)
    model.register_comm_hook(comm, gflow.torch.fp16_compress_hook)    # or bf16_
    model.register_comm_hook(gflow.torch.CSCState(comm, density=0.1), gflow.torch.csc_hook)
    model.register_comm_hook(gflow.torch.QuantizedState(comm), gflow.torch.int8_compress_hook)
    model.register_comm_hook(gflow.torch.AutoState(comm), gflow.torch.auto_compress_hook)

and the "gflow" torch.distributed backend, registered when this module is
imported::

    import gflow.torch
    torch.distributed.init_process_group(backend="gflow")

Each hook returns a torch.futures.Future that gflow's completion thread
completes (holding the GIL) when the allreduce has finished. A failure is an
error of the future itself, as DDP's C++ reducer sees it: ``fut.wait()``
raises a RuntimeError whose message holds the gflow error (torch 1.13 turns
an exception raised in a ``then`` callback into one).
"""

import functools
import inspect
import os

import torch
import torch.distributed as dist

import gflow

__all__ = [
    "AutoState", "CSCState", "HookState", "QuantizedState", "allreduce_hook", "auto_compress_hook",
    "bf16_compress_hook", "csc_hook", "fp16_compress_hook", "gflow_bf16_compress_hook",
    "int4_compress_hook", "int8_compress_hook", "register_backend",
]


class HookState:
    """State for the dense hooks: the communicator (None: gflow.init())."""

    def __init__(self, comm=None):
        self.comm = comm if comm is not None else gflow.init()


class CSCState(HookState):
    """State for csc_hook: coarse-grained sparse communication per bucket.

    density, chunk, momentum and warmup_steps are gflow.GradientReducer's
    (docs/compression.md); wire="float16"/"bfloat16" also compresses the
    chunks that are sent. Each DDP bucket gets its own reducer (and its own
    error-feedback residual), created on the bucket's first use and again when
    DDP rebuilds its buckets (after the first iteration), which restarts the
    residual of that bucket.
    """

    def __init__(self, comm=None, density=0.1, chunk=1024, momentum=0.0, warmup_steps=0,
                 wire=None):
        super().__init__(comm)
        self.density, self.chunk, self.momentum = density, chunk, momentum
        self.warmup_steps, self.wire = warmup_steps, wire
        self._reducers = {}  # bucket index -> (data_ptr, numel, GradientReducer)

    def reducer_for(self, buffer, index, is_last=False):
        if is_last:
            # DDP numbers its buckets 0 .. n-1 and runs bucket n-1 last: a
            # rebuild that left fewer buckets drops the reducers (and their
            # residuals) of the buckets that are gone.
            for gone in [i for i in self._reducers if i > index]:
                del self._reducers[gone]
        entry = self._reducers.get(index)
        if entry is None or entry[0] != buffer.data_ptr() or entry[1] != buffer.numel():
            reducer = gflow.GradientReducer(
                self.comm, [buffer], op="avg", density=self.density, chunk=self.chunk,
                momentum=self.momentum, warmup_steps=self.warmup_steps, wire=self.wire,
                names=["ddp_bucket_%d" % index])
            entry = (buffer.data_ptr(), buffer.numel(), reducer)
            self._reducers[index] = entry
        return entry[2]


def _comm(state):
    if state is None:
        return gflow.init()
    if isinstance(state, gflow.Communicator):
        return state
    return state.comm


def _complete(future, value, work):  # noqa: ARG001 (work is in value)
    # Runs on gflow's completion thread with the GIL held; the outcome is
    # checked by _check, in the then() callback.
    future.set_result(value)


def _check(future):
    # A then() callback: work.wait() raises the gflow error, which torch turns
    # into an error of the future returned by then() (its C++ side, what DDP's
    # reducer waits on); Future.set_exception would store the exception as a
    # successful value that DDP fails to cast to a tensor.
    work, result = future.value()
    work.wait()
    return result


def _future_of(work, result):
    done = torch.futures.Future()
    work.add_done_callback(functools.partial(_complete, done, (work, result)))
    return done.then(_check)


def _fail(state, op, message):
    """Raises InvalidArgumentError; the collective the hook skips is rejected
    on the communicator (peers that run it raise MismatchError at once)."""
    comm = state if isinstance(state, gflow.Communicator) else getattr(state, "comm", None)
    if isinstance(comm, gflow.Communicator):
        comm.reject_invalid_argument(op, message)  # raises InvalidArgumentError
    raise gflow.InvalidArgumentError(message)


def _buffer(bucket, hook):
    """The bucket's flat gradient buffer. DDP's compiled-autograd mode
    (torch._dynamo.config.optimize_ddp = "python_reducer", torch 2.x) calls
    a comm hook once per parameter with (grad, param) instead of a bucket:
    gflow's hooks refuse it, naming the mode."""
    if isinstance(bucket, tuple):
        raise gflow.InvalidArgumentError(
            "gflow.torch.%s: DDP called the hook with (grad, param), which it does in "
            "compiled autograd's 'python_reducer' mode (torch._dynamo.config.optimize_ddp); "
            "gflow's hooks take DDP's gradient buckets: set optimize_ddp to "
            "'ddp_optimizer' (or True), or register no gflow hook in that mode" % hook)
    return bucket.buffer()


def _allreduce(state, bucket, wire):
    buffer = _buffer(bucket, {None: "allreduce_hook", "float16": "fp16_compress_hook",
                              "bfloat16": "bf16_compress_hook"}[wire])
    comm = _comm(state)
    if wire is not None and buffer.dtype != torch.float32:
        _fail(comm, "allreduce", "gflow.torch: %s compression takes float32 gradients, the "
              "bucket holds %s" % (wire, buffer.dtype))
    work = comm.allreduce(buffer, "avg", wire=wire, async_op=True)
    return _future_of(work, buffer)


def allreduce_hook(state, bucket):
    """Averages the bucket with gflow's allreduce (state: Communicator, HookState or None)."""
    return _allreduce(state, bucket, None)


def fp16_compress_hook(state, bucket):
    """Averages the float32 bucket with float16 on the wire (float32 accumulation)."""
    return _allreduce(state, bucket, "float16")


def gflow_bf16_compress_hook(state, bucket):
    """Averages the float32 bucket with bfloat16 on the wire (float32 accumulation)."""
    return _allreduce(state, bucket, "bfloat16")


class QuantizedState(HookState):
    """State for the quantized hooks (int8_compress_hook, int4_compress_hook).

    Each bucket travels as blocks of 128 values, a float32 scale each and
    int8 or int4 values (0.26x and 0.13x the bytes of float32; every hop adds
    in float32; docs/compression.md). With error_feedback (the default) the
    state keeps a float32 residual per DDP bucket: what quantizing this
    rank's bucket lost is added to the next step's. A bucket's residual
    restarts when DDP rebuilds its buckets (after the first iteration).
    """

    def __init__(self, comm=None, error_feedback=True):
        super().__init__(comm)
        self.error_feedback = error_feedback
        self._residuals = {}  # bucket index -> (data_ptr, numel, residual)

    def residual_for(self, buffer, index, is_last=False):
        if not self.error_feedback:
            return None
        if is_last:  # a rebuild that left fewer buckets (see CSCState)
            for gone in [i for i in self._residuals if i > index]:
                del self._residuals[gone]
        entry = self._residuals.get(index)
        if entry is None or entry[0] != buffer.data_ptr() or entry[1] != buffer.numel():
            entry = (buffer.data_ptr(), buffer.numel(), torch.zeros_like(buffer))
            self._residuals[index] = entry
        return entry[2]


def _quantized(state, bucket, wire):
    if not isinstance(state, QuantizedState):
        _fail(state, "allreduce", "gflow.torch.%s_compress_hook needs a "
              "gflow.torch.QuantizedState (it keeps the error-feedback residuals), got %s"
              % (wire[1:], type(state).__name__))
    buffer = _buffer(bucket, "%s_compress_hook" % wire[1:])
    if buffer.dtype != torch.float32:
        _fail(state, "allreduce", "gflow.torch: %s compression takes float32 gradients, the "
              "bucket holds %s" % (wire, buffer.dtype))
    is_last = getattr(bucket, "is_last", None)
    residual = state.residual_for(buffer, bucket.index(), bool(is_last()) if is_last else False)
    work = state.comm.allreduce(buffer, "avg", wire=wire, residual=residual, async_op=True)
    return _future_of(work, buffer)


def int8_compress_hook(state, bucket):
    """Averages the float32 bucket as int8 blocks (state: QuantizedState)."""
    return _quantized(state, bucket, "qint8")


def int4_compress_hook(state, bucket):
    """Averages the float32 bucket as int4 blocks (state: QuantizedState)."""
    return _quantized(state, bucket, "qint4")


class AutoState(HookState):
    """State for auto_compress_hook: gflow picks each DDP bucket's wire.

    DDP's buckets are averaged dense until their memory has stayed put for
    two iterations (DDP rebuilds them after the first); then a
    gflow.WireChooser over the buckets picks each one's wire per step
    (docs/compression.md, Automatic wire), and the bucket's allreduce runs on
    it, as the other hooks' do, with a float32 error-feedback residual per
    bucket on the quantized wires. ``auto_wire`` holds the chooser's settings
    (candidates, warmup_steps, period, reprobe, probe_steps, slack,
    residual_limit; unset ones come from GFLOW_WIRE_AUTO_*). A step is
    finished (and, when due, agreed across ranks: a small allreduce) at the
    next iteration's first bucket. If DDP moves its buckets again, the
    chooser and the residuals start over.
    """

    def __init__(self, comm=None, error_feedback=True, timeline="", **auto_wire):
        super().__init__(comm)
        self.error_feedback, self.timeline, self.auto_wire = error_feedback, timeline, auto_wire
        self.chooser = None
        self._layouts = []     # bucket layouts of the last two iterations
        self._layout = []      # this iteration's: (data_ptr, numel) per bucket
        self._buffers = []     # this iteration's bucket buffers
        self._works = []       # this iteration's allreduces (with a chooser)
        self._residuals = {}   # bucket index -> error-feedback residual

    @property
    def wires(self):
        """Each DDP bucket's wire for the next iteration ([] while dense)."""
        return self.chooser.wires if self.chooser is not None else []

    def _bucket(self, buffer, index, is_last):
        """The future of one bucket; runs the iteration's bookkeeping."""
        if index == 0:
            self._finish_step()
            self._layout, self._buffers = [], []
        if index != len(self._layout):
            _fail(self, "allreduce", "gflow.torch.auto_compress_hook: DDP bucket %d came "
                  "before bucket %d" % (index, len(self._layout)))
        self._layout.append(_key(buffer))
        self._buffers.append(buffer)
        if self.chooser is not None and self._chooser_layout[index:index + 1] != [_key(buffer)]:
            self.chooser, self._residuals, self._layouts = None, {}, []  # DDP moved its buckets
        if self.chooser is None:
            future = _future_of(self.comm.allreduce(buffer, "avg", async_op=True), buffer)
            if is_last:
                self._layouts = (self._layouts + [self._layout])[-2:]
                if len(self._layouts) == 2 and self._layouts[0] == self._layouts[1]:
                    self._chooser_layout = self._layout
                    self.chooser = gflow.WireChooser(
                        self.comm, len(self._layout), timeline=self.timeline,
                        names=["ddp_bucket_%d" % i for i in range(len(self._layout))],
                        auto_wire=self.auto_wire)
            return future
        wire = self.chooser.wire(index)
        residual = None
        if wire.startswith("qint") and self.error_feedback:
            residual = self._residuals.get(index)
            if residual is None:
                residual = self._residuals[index] = torch.zeros_like(buffer)
        self.chooser.ready(index)
        work = self.comm.allreduce(buffer, "avg", wire=None if wire == "float32" else wire,
                                   residual=residual, async_op=True)
        work.add_done_callback(functools.partial(_chooser_done, self.chooser, index))
        self._works.append(work)
        return _future_of(work, buffer)

    def _finish_step(self):
        # The last iteration's allreduces have completed (DDP waited for them).
        works, self._works = self._works, []
        if self.chooser is not None and works:
            ratios = functools.partial(self._ratios, self.chooser.wires)
            self.chooser.finish_step(any(w.nonfinite for w in works), ratios)

    def _ratios(self, wires):
        """Per bucket: L1 of its residual over its buffer's, from a strided
        sample (called back from within finish_step: no chooser calls)."""
        out = []
        for i, buffer in enumerate(self._buffers):
            r = self._residuals.get(i)
            if r is None or not wires[i].startswith("qint"):
                out.append(0.0)
                continue
            stride = max(1, r.numel() // 65536)
            rs, gs = float(r[::stride].abs().sum()), float(buffer[::stride].abs().sum())
            out.append(rs / gs if gs > 0 else (1e300 if rs > 0 else 0.0))
        return out


def _key(buffer):
    return (buffer.data_ptr(), buffer.numel())


def _chooser_done(chooser, index, work):  # noqa: ARG001 (a done callback)
    chooser.done(index)


def auto_compress_hook(state, bucket):
    """Averages the float32 bucket on the wire gflow picks for it (state: AutoState)."""
    if not isinstance(state, AutoState):
        _fail(state, "allreduce", "gflow.torch.auto_compress_hook needs a gflow.torch.AutoState, "
              "got " + type(state).__name__)
    buffer = _buffer(bucket, "auto_compress_hook")
    if buffer.dtype != torch.float32:
        _fail(state, "allreduce", "gflow.torch: automatic compression takes float32 gradients, "
              "the bucket holds %s" % buffer.dtype)
    return state._bucket(buffer, bucket.index(), bool(bucket.is_last()))


# DDP refuses hooks *named* bf16_compress_hook without CUDA 11 + NCCL 2.10
# (it takes them for torch's own); the function keeps another name.
bf16_compress_hook = gflow_bf16_compress_hook


def csc_hook(state, bucket):
    """Coarse-grained sparse averaging of the bucket (state: CSCState)."""
    if not isinstance(state, CSCState):
        _fail(state, "GradientReducer",
              "gflow.torch.csc_hook needs a gflow.torch.CSCState, got " + type(state).__name__)
    buffer = _buffer(bucket, "csc_hook")
    is_last = getattr(bucket, "is_last", None)
    reducer = state.reducer_for(buffer, bucket.index(), bool(is_last()) if is_last else False)
    reducer.ready(0)
    return _future_of(reducer.wait_async(), buffer)


def _create_process_group(store, rank, size, timeout):
    from . import _gflow_torch  # built where libtorch-dev was found
    # gflow groups ranks into hosts itself; the launcher's local rank and size
    # are only a cross-check, and they describe the world group. For a
    # subgroup (new_group) of a one-host job the group is the host's local
    # group; on several hosts gflow's grouping alone decides.
    local = (-1, -1)
    world = os.environ.get("WORLD_SIZE") or os.environ.get("GFLOW_WORLD_SIZE")
    if world is not None and int(world) != size:
        local_world = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("GFLOW_LOCAL_SIZE")
        if local_world == world:
            local = (rank, size)
        elif local_world is not None and int(local_world) > size:
            raise gflow.InvalidArgumentError(
                "gflow backend: a subgroup of %d ranks in a job on several hosts with "
                "LOCAL_WORLD_SIZE=%s is not supported (the launcher's local size describes the "
                "world group and gflow checks it against the subgroup)" % (size, local_world))
    return _gflow_torch.create_process_group(store, rank, size, timeout, *local)


def _monitored_barrier_for(torch_monitored_barrier):
    """torch.distributed.monitored_barrier that also takes gflow groups:
    torch 1.13 refuses every backend but gloo by name before it reaches the
    process group, whose monitoredBarrier gflow implements."""

    @functools.wraps(torch_monitored_barrier)
    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        c10d = dist.distributed_c10d
        pg = c10d._get_default_group() if group is None or group is c10d.GroupMember.WORLD \
            else group
        if c10d._rank_not_in_group(pg) or dist.get_backend(pg) != "gflow":
            return torch_monitored_barrier(group=group, timeout=timeout,
                                           wait_all_ranks=wait_all_ranks)
        if timeout is None:
            timeout = c10d.default_pg_timeout
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier._gflow = True
    return monitored_barrier


def _batch_isend_irecv_for(torch_batch_isend_irecv):
    """torch.distributed.batch_isend_irecv that, on a gflow group, posts the
    ops as one gflow sendRecv call: they start together (one NCCL group
    with GFLOW_NCCL_P2P=1) instead of as separate isend/irecv calls, which
    through NCCL would wait for one another. Every returned request is the
    call's one Work."""

    @functools.wraps(torch_batch_isend_irecv)
    def batch_isend_irecv(p2p_op_list):
        c10d = dist.distributed_c10d
        check = getattr(c10d, "_check_p2p_op_list", None)
        if check is not None:
            check(p2p_op_list)  # torch's own argument errors
        group = p2p_op_list[0].group if p2p_op_list else None
        world = group is None or group is c10d.GroupMember.WORLD
        pg = c10d._get_default_group() if world else group
        if (not p2p_op_list or c10d._rank_not_in_group(pg) or dist.get_backend(pg) != "gflow"
                or not hasattr(pg, "size")):
            return torch_batch_isend_irecv(p2p_op_list)
        from . import _gflow_torch
        group_rank = getattr(c10d, "get_group_rank", None) or c10d._get_group_rank
        ops = [(op.op.__name__ == "isend", op.tensor,
                op.peer if world else group_rank(pg, op.peer), op.tag)
               for op in p2p_op_list]
        # torch 2.x: the group routes to gflow's Backend; 1.13: it is gflow's.
        backend = pg._get_backend(torch.device("cpu")) if hasattr(pg, "_get_backend") else pg
        work = _gflow_torch.batch_send_recv(backend, ops)
        return [work] * len(ops)

    batch_isend_irecv._gflow = True
    return batch_isend_irecv


def register_backend():
    """Registers the "gflow" torch.distributed backend (idempotent), lets
    torch.distributed.monitored_barrier run on gflow groups, and posts
    torch.distributed.batch_isend_irecv on them as one call."""
    if not hasattr(dist.Backend, "GFLOW"):
        if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
            # torch >= 2.0 registers a backend per device type: gflow takes both.
            dist.Backend.register_backend("gflow", _create_process_group,
                                          devices=["cpu", "cuda"])
        else:  # torch 1.13: one backend for every device
            dist.Backend.register_backend("gflow", _create_process_group)
    if not getattr(dist.monitored_barrier, "_gflow", False):
        patched = _monitored_barrier_for(dist.distributed_c10d.monitored_barrier)
        dist.distributed_c10d.monitored_barrier = patched
        dist.monitored_barrier = patched
    if not getattr(dist.batch_isend_irecv, "_gflow", False):
        patched = _batch_isend_irecv_for(dist.distributed_c10d.batch_isend_irecv)
        dist.distributed_c10d.batch_isend_irecv = patched
        dist.batch_isend_irecv = patched


register_backend()
