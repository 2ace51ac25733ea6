"""gflow: allreduce for data-parallel training (docs/python.md).

    import gflow
    comm = gflow.init()            # gflowrun / torchrun / mpirun / srun environment
    comm.allreduce(grad, "avg")    # numpy array or CPU torch tensor, in place
    work = comm.allreduce(grad, async_op=True); ...; work.wait()

PyTorch: ``gflow.torch`` has DDP communication hooks and registers the
"gflow" torch.distributed backend.
"""

import atexit as _atexit

from . import errors
from ._gflow import (  # noqa: F401 (re-exported)
    Communicator,
    DataType,
    GradientReducer,
    ReduceOp,
    WireChooser,
    Work,
    create,
    default_communicator,
    finalize,
    init,
    join,
    set_cuda_component,
    set_log_level,
)
from . import _gflow
from .errors import (  # noqa: F401 (re-exported)
    AbortedError,
    Error,
    ErrorCode,
    InternalError,
    InvalidArgumentError,
    MismatchError,
    PeerLostError,
    TimeoutError,
    UnauthorizedError,
)

__all__ = [
    "AbortedError", "Communicator", "DataType", "Error", "ErrorCode", "GradientReducer",
    "InternalError", "InvalidArgumentError", "MismatchError", "PeerLostError", "ReduceOp",
    "TimeoutError", "UnauthorizedError", "WireChooser", "Work", "allreduce", "barrier", "broadcast", "create",
    "default_communicator", "errors", "finalize", "init", "join", "set_cuda_component", "set_log_level",
]


def allreduce(tensor, op="sum", **kwargs):
    """Communicator.allreduce on the default communicator (gflow.init())."""
    return default_communicator().allreduce(tensor, op, **kwargs)


def broadcast(tensor, root=0, **kwargs):
    """Communicator.broadcast on the default communicator."""
    return default_communicator().broadcast(tensor, root, **kwargs)


def barrier(**kwargs):
    """Communicator.barrier on the default communicator."""
    return default_communicator().barrier(**kwargs)


# Work callbacks run on one native thread; at exit it must stop calling into
# Python before the interpreter goes away.
_atexit.register(_gflow._shutdown)
