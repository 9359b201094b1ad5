"""``GradBucket`` and ``BuiltinCommHookType``: what DistributedDataParallel hands a
communication hook (``DistributedDataParallel.register_comm_hook``).

A bucket is one flat gradient buffer of DDP (parameters of one dtype and device, in the
reverse order of registration); the hook receives it once all its gradients are in and returns
a :class:`~mpitensor.futures.Future` whose value is the tensor (of the buffer's size) that DDP
writes back into the parameters' gradients.
"""

from __future__ import annotations

import enum
from typing import Any, List

import numpy as np

from .._core.opkit import wrap
from ..tensor import Tensor

__all__ = ["BuiltinCommHookType", "GradBucket"]


class BuiltinCommHookType(enum.Enum):
    """The built-in hooks of ``DistributedDataParallel._register_builtin_comm_hook``:
    ``ALLREDUCE`` (sum, then divide by the world size: DDP's default) and ``FP16_COMPRESS``
    (the same on a float16 copy of the bucket)."""

    ALLREDUCE = 0
    FP16_COMPRESS = 1


class GradBucket:
    """One DDP gradient bucket, as a communication hook sees it.

    Args:
        index: the bucket's position in launch order (0 holds the last registered parameters).
        buffer: the flat 1-D array holding every gradient of the bucket.
        shapes: per parameter, the shape of its gradient (their slots tile ``buffer`` in
            order).
        parameters: the model parameters whose gradients the bucket holds.
        is_last: whether this is the last bucket of the backward pass.
    """

    __slots__ = ("_index", "_buffer", "_shapes", "_params", "_last")

    def __init__(self, index: int, buffer: Any, shapes: List[tuple], parameters: List[Tensor],
                 is_last: bool) -> None:
        self._index = int(index)
        self._buffer = buffer
        self._shapes = [tuple(s) for s in shapes]
        self._params = list(parameters)
        self._last = bool(is_last)

    def index(self) -> int:
        """The bucket's index (the same on every rank; stable across iterations)."""
        return self._index

    def buffer(self) -> Tensor:
        """The flat 1-D tensor of the bucket's gradients (shares memory with the bucket)."""
        return wrap(self._buffer)

    def gradients(self) -> List[Tensor]:
        """The gradients of :meth:`parameters`, each a view of :meth:`buffer` (of the tensor
        given to :meth:`set_buffer`, once called)."""
        out, at = [], 0
        for shape in self._shapes:
            n = int(np.prod(shape, dtype=np.int64))
            out.append(wrap(self._buffer[at:at + n].reshape(shape)))
            at += n
        return out

    def parameters(self) -> List[Tensor]:
        """The model parameters whose gradients the bucket holds, in bucket order."""
        return list(self._params)

    def is_last(self) -> bool:
        """Whether this bucket is the last one of the iteration (hooks count iterations so)."""
        return self._last

    def set_buffer(self, buffer: Tensor) -> None:
        """Make ``buffer`` (a tensor with the bucket's number of elements, of any dtype) the
        tensor :meth:`buffer` returns from now on, as the compression wrappers do with a
        low-precision copy. DDP's own gradient storage is not replaced: it receives the value
        of the hook's future.

        Raises:
            TypeError: ``buffer`` is not a tensor.
            ValueError: its number of elements differs from the bucket's.
        """
        if not isinstance(buffer, Tensor):
            raise TypeError(f"GradBucket.set_buffer: expected a Tensor, got "
                            f"{type(buffer).__name__}")
        arr = buffer._data
        if arr.size != self._buffer.size:
            raise ValueError(f"GradBucket.set_buffer: the tensor has {arr.size} elements but "
                             f"bucket {self._index} holds {self._buffer.size}")
        self._buffer = arr.reshape(-1)

    def __repr__(self) -> str:
        return (f"GradBucket(index={self._index}, numel={self._buffer.size}, "
                f"dtype={self._buffer.dtype}, is_last={self._last})")
