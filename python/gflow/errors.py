"""gflow's errors as Python exceptions (docs/errors.md).

Every failure raises a subclass of :class:`gflow.Error`; ``except
gflow.Error`` catches them all. The attributes say where it happened:
``code`` (:class:`ErrorCode`), ``detail`` (the message without context),
``op`` ("allreduce", "bootstrap", ...; "" if none), ``seq`` (the op's
sequence number on its communicator, 0 if none), ``rank`` (the rank raising
it) and ``peer`` (the peer involved; -1 if none).

Error is a RuntimeError, as torch.distributed's backends raise them, so code
written for Gloo or NCCL (``except RuntimeError``, torch's own tests) handles
gflow's errors too. The subclasses also derive from the closest built-in
exception, so generic handlers work: InvalidArgumentError is a ValueError,
TimeoutError the built-in TimeoutError, PeerLostError a ConnectionError,
UnauthorizedError a PermissionError.
"""

import builtins
import enum


class ErrorCode(enum.IntEnum):
    """gflow::ErrorCode."""

    INVALID_ARGUMENT = 0
    TIMEOUT = 1
    PEER_LOST = 2
    MISMATCH = 3
    UNAUTHORIZED = 4
    ABORTED = 5
    INTERNAL = 6


class Error(RuntimeError):
    """Base class of every gflow error."""

    code = ErrorCode.INTERNAL

    def __init__(self, message, detail=None, op="", seq=0, rank=-1, peer=-1):
        RuntimeError.__init__(self, message)
        self.detail = message if detail is None else detail
        self.op = op
        self.seq = seq
        self.rank = rank
        self.peer = peer


class InvalidArgumentError(Error, ValueError):
    """The caller passed something wrong; nothing was sent."""

    code = ErrorCode.INVALID_ARGUMENT


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 (like asyncio.TimeoutError)
    """A deadline passed while waiting on a peer."""

    code = ErrorCode.TIMEOUT


class PeerLostError(Error, ConnectionError):
    """A peer closed its connection or died."""

    code = ErrorCode.PEER_LOST


class MismatchError(Error):
    """Ranks called different collectives or shapes."""

    code = ErrorCode.MISMATCH


class UnauthorizedError(Error, PermissionError):
    """A peer failed the job-token challenge."""

    code = ErrorCode.UNAUTHORIZED


class AbortedError(Error):
    """Communicator.abort() was called (or the communicator was destroyed)."""

    code = ErrorCode.ABORTED


class InternalError(Error):
    """A system call failed or an invariant broke."""

    code = ErrorCode.INTERNAL


_BY_CODE = {cls.code: cls for cls in (InvalidArgumentError, TimeoutError, PeerLostError,
                                      MismatchError, UnauthorizedError, AbortedError,
                                      InternalError)}


def _from_native(code, message, detail, op, seq, rank, peer):
    """Called by the native module to turn a gflow::Error into an exception."""
    cls = _BY_CODE.get(code, Error)
    # One positional argument only: OSError subclasses read two as (errno, text).
    exc = cls(message)
    exc.detail, exc.op, exc.seq, exc.rank, exc.peer = detail, op, seq, rank, peer
    return exc
