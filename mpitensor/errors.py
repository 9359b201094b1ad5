"""The exception hierarchy of mpitensor.

Every error the library raises on purpose derives from :class:`MpiTensorError` (itself a
``RuntimeError``), except bad arguments, which raise plain ``ValueError`` / ``TypeError``
before any message is sent.
"""

from __future__ import annotations

__all__ = [
    "MpiTensorError",
    "NotInitializedError",
    "NotAGroupMemberError",
    "CollectiveMismatchError",
    "MessageTruncatedError",
    "DistributedTimeoutError",
    "PeerFailedError",
]


class MpiTensorError(RuntimeError):
    """Root of every mpitensor runtime error."""


class NotInitializedError(MpiTensorError):
    """A distributed call was made before ``init_process_group``."""


class NotAGroupMemberError(MpiTensorError, ValueError):
    """A rank used a process group it does not belong to."""


class CollectiveMismatchError(MpiTensorError):
    """Ranks entered the same collective with different op, dtype or shape (debug mode)."""


class MessageTruncatedError(MpiTensorError):
    """An incoming message was larger than the receive buffer."""


class DistributedTimeoutError(MpiTensorError, TimeoutError):
    """A blocking operation did not complete within the process group's timeout."""


class PeerFailedError(MpiTensorError):
    """A peer rank failed while this rank was communicating with it."""
