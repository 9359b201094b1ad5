"""The exception hierarchy of mpitensor.

Every error the library raises on purpose derives from :class:`MpiTensorError` (itself a
``RuntimeError``), except bad arguments, which raise plain ``ValueError`` / ``TypeError``
before any message is sent.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "MpiTensorError",
    "OutOfMemoryError",
    "AcceleratorError",
    "NotInitializedError",
    "NotAGroupMemberError",
    "CollectiveMismatchError",
    "MessageTruncatedError",
    "MessageMismatchError",
    "DistributedTimeoutError",
    "PeerFailedError",
    "ReplicaDivergenceError",
    "DtypeMismatchError",
]


class MpiTensorError(RuntimeError):
    """Root of every mpitensor runtime error."""

    def _carry(self, **facts: Any) -> None:
        """Keep ``facts`` (what a handler may read of the failure) as attributes."""
        for name, value in facts.items():
            setattr(self, name, value)


class NotInitializedError(MpiTensorError):
    """A distributed call was made before ``init_process_group``."""


class NotAGroupMemberError(MpiTensorError, ValueError):
    """A rank used a process group it does not belong to."""


class CollectiveMismatchError(MpiTensorError):
    """Ranks entered the same collective with different op, dtype or shape (debug mode)."""


class MessageTruncatedError(MpiTensorError):
    """An incoming message was larger than the receive buffer."""


class MessageMismatchError(MpiTensorError):
    """Debug mode: a point-to-point message's dtype or size differs from the receive buffer."""


class DistributedTimeoutError(MpiTensorError, TimeoutError):
    """A blocking operation did not complete within the process group's timeout.

    Attributes (``None`` where unknown): ``op`` (operation name), ``group`` (group name),
    ``seq`` (sequence number), ``elapsed`` (seconds waited), ``missing`` (global ranks that had
    not arrived in the operation, as far as this rank could tell), ``request`` (the MPI
    request still pending, or ``None`` where it was cancelled: a blocking receive is cancelled
    on timeout, so that link stays usable).

    After a timeout the communicator is in an undefined state (the operation may still be
    pending inside MPI): do not use the group again. Uncaught, it aborts the whole job when
    the abort handler is installed (``init_process_group`` does that under ``mpiexec``).
    """

    def __init__(self, message: str, op: "str | None" = None, group: "str | None" = None,
                 seq: "int | None" = None, elapsed: "float | None" = None,
                 missing: "list | None" = None) -> None:
        super().__init__(message)
        self._carry(op=op, group=group, seq=seq, elapsed=elapsed, missing=missing, request=None)


class PeerFailedError(MpiTensorError):
    """A peer rank failed while this rank was communicating with it."""


class DtypeMismatchError(TypeError, ValueError):
    """Buffers handed to one collective have different dtypes (checked before any traffic).

    Both a ``TypeError`` (Python's convention for a wrong type) and a ``ValueError`` (what
    the other argument checks of a collective raise), so either ``except`` clause catches it.
    """


class ReplicaDivergenceError(MpiTensorError):
    """DDP replicas hold different parameter or buffer values (raised on every rank).

    Raised by :meth:`mpitensor.nn.parallel.DistributedDataParallel.verify_in_sync` (and at
    construction with ``init_sync=False``). Attributes: ``differences``, one dict per tensor
    that differs (keys ``kind`` ("parameter" or "buffer"), ``name``, ``shape``, ``dtype``,
    ``ranks`` (global ranks whose values differ from the reference rank's), ``max_abs_diff``,
    ``count`` (elements beyond the tolerance, summed over those ranks) and ``detail`` (per rank:
    count, max difference, first worst index, value there and on the reference rank); ``ranks``,
    the sorted global ranks that differ somewhere; ``reference_rank``, the global rank compared
    against (the group's rank 0).
    """

    def __init__(self, message: str, differences: Optional[list] = None,
                 ranks: Optional[list] = None, reference_rank: Optional[int] = None) -> None:
        super().__init__(message)
        self._carry(differences=differences or [], ranks=ranks or [],
                    reference_rank=reference_rank)


class OutOfMemoryError(MpiTensorError):
    """A device ran out of memory (torch's ``OutOfMemoryError``, a ``RuntimeError``).

    CuPy's pool, once mpitensor counts its allocations (``torch.cuda``'s memory statistics),
    raises one that is also CuPy's own ``OutOfMemoryError`` (a ``MemoryError``), so a handler
    written for either catches it. Freeing cached blocks (``mpitensor.cuda.empty_cache()``) or
    a smaller batch are the usual ways out.
    """


class AcceleratorError(MpiTensorError):
    """An accelerator (a GPU) reported an error while running work (torch's
    ``AcceleratorError``, a ``RuntimeError``)."""


_DEVICE_OOM: dict = {}


def device_out_of_memory(exc: BaseException, library_class: type) -> OutOfMemoryError:
    """An :class:`OutOfMemoryError` that is also an instance of ``library_class`` (the array
    library's own out-of-memory error, ``exc``'s class), with ``exc``'s message."""
    cls = _DEVICE_OOM.get(library_class)
    if cls is None:
        cls = _DEVICE_OOM[library_class] = type(
            "OutOfMemoryError", (OutOfMemoryError, library_class),
            {"__module__": __name__, "__qualname__": "OutOfMemoryError"})
    return cls(f"{exc}; free memory (del tensors, mpitensor.cuda.empty_cache()) or use a "
               f"smaller batch")
