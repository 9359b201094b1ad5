"""Recycled NumPy buffers and allocation that keeps an array's memory layout.

A training step allocates the same multi-megabyte arrays every iteration (activations, their
gradients, im2col matrices). :func:`empty` hands out recycled buffers (:class:`_Workspace`),
:func:`empty_like` keeps the axis order in memory of its model (the batch-innermost layout of
``nn``'s conv2d outputs stays so through relu and its gradient), and :func:`relu_into` is the
one ``max(x, 0)`` kernel of the package (``Tensor.relu`` and ``nn.functional.relu_``).
Array-level only: nothing here knows tensors or autograd.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

import numpy as np

from mpitensor import backend as _backend
from mpitensor._base.parallel import split_pass

__all__: list = []  # private module


class _Workspace:
    """Recycles large NumPy arrays once nothing but this cache refers to them.

    A training step allocates the same big arrays (im2col matrices, col2im products,
    activations) every iteration. Fresh multi-megabyte allocations are page-faulted in again
    each time glibc has handed the previous ones back to the OS, which on one core cost about as
    much as the arithmetic (LeNet: 17 ms a step without, 9.5 ms with). Buffers handed out here are
    views of cached 1-D byte arrays; a buffer is reused only when its reference count shows that
    no view of it is alive anywhere (saved for backward, wrapped in a Tensor, held by a hook...).
    The cache holds at most ``MAX_BUFFERS`` buffers and ``MAX_BYTES`` in all (free buffers are
    dropped oldest first; past the limit, arrays are simply not cached). CuPy arrays never come
    from here (CuPy has its own memory pool).
    """

    MIN_BYTES = 1 << 18  # small arrays come from NumPy's own cache just fine
    MAX_BUFFERS = 32
    MAX_BYTES = 512 << 20

    def __init__(self) -> None:
        self._bufs: list = []
        self._lock = threading.Lock()
        self._bufs.append(np.empty(1, np.uint8))
        self._free_refs = self._count(0)  # the count of a buffer that only the cache holds
        self._bufs.clear()

    def _count(self, i: int) -> int:
        return sys.getrefcount(self._bufs[i])

    def empty(self, shape: tuple, dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array, recycled when a free one of that size exists."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.MIN_BYTES:
            return np.empty(shape, dtype)
        with self._lock:
            bufs = self._bufs
            for i in range(len(bufs)):
                if bufs[i].nbytes == nbytes and self._count(i) == self._free_refs:
                    bufs.append(bufs.pop(i))  # most recently used last
                    return bufs[-1].view(dtype).reshape(shape)
            total = sum(b.nbytes for b in bufs) + nbytes
            i = 0
            while i < len(bufs) and (len(bufs) >= self.MAX_BUFFERS or total > self.MAX_BYTES):
                if self._count(i) == self._free_refs:
                    total -= bufs[i].nbytes
                    del bufs[i]
                else:
                    i += 1
            if len(bufs) >= self.MAX_BUFFERS or total > self.MAX_BYTES:
                return np.empty(shape, dtype)  # everything cached is in use: do not grow
            buf = np.empty(nbytes, np.uint8)
            bufs.append(buf)
            return buf.view(dtype).reshape(shape)


_workspace = _Workspace()


def empty(xp: Any, shape: tuple, dtype: Any) -> Any:
    """``xp.empty`` that recycles large NumPy buffers (see :class:`_Workspace`)."""
    if xp is np:
        return _workspace.empty(tuple(shape), dtype)
    return xp.empty(shape, dtype=dtype)


def zeros(xp: Any, shape: tuple, dtype: Any) -> Any:
    """``xp.zeros`` on a recycled buffer."""
    out = empty(xp, shape, dtype)
    out.fill(0)
    return out


def empty_like(x: Any) -> Any:
    """An uninitialised array shaped like ``x`` with the same axis order in memory."""
    xp = xp_of(x)
    if x.flags.c_contiguous:
        return empty(xp, x.shape, x.dtype)
    order = memory_order(x)
    buf = empty(xp, tuple(x.shape[a] for a in order), x.dtype)
    return buf.transpose(_inverse(order))


_zero_cache: dict = {}  # dtype -> read-only flat zeros (grows to the largest size asked for)


def relu_into(x: Any, out: Any) -> Any:
    """``out = max(x, 0)``.

    NumPy's ``maximum`` with a scalar takes a slow broadcast loop (about 2x slower than with an
    array operand), so on the CPU a read-only zero array is used instead. When ``x`` and
    ``out`` are single blocks of memory in the same axis order (the usual case: ``out`` is
    ``x`` or :func:`empty_like` of it) the pass runs over them flat, shared across threads when
    it is big (:func:`mpitensor._base.parallel.split_pass`).
    """
    xp = xp_of(x)
    if xp is not np:
        return xp.maximum(x, x.dtype.type(0), out=out)
    order = memory_order(x)
    xt = x.transpose(order)
    if not xt.flags.c_contiguous:
        return np.maximum(x, x.dtype.type(0), out=out)
    z = _zero_cache.get(x.dtype)
    if z is None or z.size < x.size:
        z = np.zeros(max(x.size, 1 << 16), dtype=x.dtype)
        z.flags.writeable = False
        _zero_cache[x.dtype] = z
    flat = flat_in_order(order, x, out)
    if flat is None:  # out laid out otherwise: one broadcast pass
        zz = z[:x.size].reshape(xt.shape).transpose(_inverse(order))
        return np.maximum(x, zz, out=out)
    xf, of = flat

    def part(span: tuple) -> None:
        np.maximum(xf[span[0]:span[1]], z[:span[1] - span[0]], out=of[span[0]:span[1]])

    split_pass(part, x.size, x.size)
    return out


def flat_in_order(order: tuple, *arrays: Any) -> Any:
    """The arrays as 1-D views of their memory, when each is one block laid out in the axis
    ``order`` (so that position ``i`` of every view is the same element); else None."""
    views = [a.transpose(order) for a in arrays]
    if not all(v.flags.c_contiguous for v in views):
        return None
    return [v.reshape(-1) for v in views]


def memory_order(x: Any) -> tuple:
    return tuple(sorted(range(x.ndim), key=lambda a: -abs(x.strides[a])))


def _inverse(order: tuple) -> tuple:
    inv = [0] * len(order)
    for i, a in enumerate(order):
        inv[a] = i
    return tuple(inv)


def xp_of(x: Any) -> Any:
    """The array module (numpy or cupy) of ``x`` (for a meta array, NumPy making meta arrays)."""
    return np if type(x) is np.ndarray else _backend.array_module(x)
