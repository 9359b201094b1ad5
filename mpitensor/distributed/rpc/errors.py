"""Errors of ``mpitensor.distributed.rpc`` (all under mpitensor's :class:`MpiTensorError`).

Besides these, RPC raises mpitensor's :class:`~mpitensor.errors.DistributedTimeoutError` when a
call's deadline passes, :class:`~mpitensor.errors.PeerFailedError` when the destination has
shut down or exited, and ``TypeError`` when arguments cannot be pickled (before anything is
sent). An exception raised by the remote function is raised again at the caller, with its own
type wherever that type can be rebuilt, its message followed by the remote traceback.
"""

from __future__ import annotations

from ...errors import MpiTensorError

__all__ = ["RemoteError", "UnknownWorkerError", "RpcNotInitializedError"]


class RemoteError(MpiTensorError):
    """An exception raised on another worker whose type cannot be rebuilt on this one.

    ``remote_type`` names the original type; the message ends with the remote traceback.
    """


class UnknownWorkerError(MpiTensorError, ValueError):
    """``to`` names no worker of this RPC group (raised before anything is sent)."""


class RpcNotInitializedError(MpiTensorError):
    """An RPC function was called before ``init_rpc`` or after ``shutdown``."""
