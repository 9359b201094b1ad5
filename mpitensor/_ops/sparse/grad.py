"""Sparse gradients of dense leaves (``nn.Embedding(sparse=True)``): :class:`SparseGrad`, which
backward carries as rows of values, and the helpers optimisers use on such gradients.
"""

from __future__ import annotations

from typing import Any, Optional

from mpitensor import backend as _backend
from mpitensor._core.opkit import wrap
from mpitensor._ops.sparse.coo import SparseData, SparseTensor, add_at, is_sparse_tensor
from mpitensor.tensor import Tensor


class SparseGrad:
    """A gradient that backward carries for a dense leaf as rows ``idx`` (1, n) of values
    ``vals`` (n, D): what a lookup with ``sparse=True`` gives its table. On reaching the leaf
    it becomes a sparse COO ``.grad`` (uncoalesced, as torch's), or is added into a dense one.
    Added to another gradient it stays sparse with a sparse one, turns dense with an array."""

    is_sparse_grad = True
    __array_ufunc__ = None  # array + SparseGrad: NumPy leaves it to __radd__

    def __init__(self, idx: Any, vals: Any, shape: tuple) -> None:
        self.idx, self.vals, self.shape, self.dtype = idx, vals, tuple(shape), vals.dtype

    def to_tensor(self) -> SparseTensor:
        return SparseTensor._make(self.idx, wrap(self.vals), self.shape, self.idx.shape[1] <= 1)

    def dense(self) -> Any:
        xp = _backend.array_module(self.vals)
        out = xp.zeros(self.shape, dtype=self.dtype)
        add_at(out, tuple(self.idx), self.vals)
        return out

    def __add__(self, other: Any) -> Any:
        if isinstance(other, SparseGrad):
            xp = _backend.array_module(self.vals)
            return SparseGrad(xp.concatenate([self.idx, other.idx], axis=1),
                              xp.concatenate([self.vals, other.vals]), self.shape)
        out = other.astype(self.dtype) if other.dtype != self.dtype else other.copy()
        add_at(out, tuple(self.idx), self.vals)
        return out

    __radd__ = __add__

    def accumulate_into(self, t: Tensor) -> None:
        """Add this gradient into leaf ``t``'s ``.grad`` (running its gradient hooks)."""
        hooks = getattr(t, "_hooks", None)
        g: Tensor = self.to_tensor()
        for h in (hooks[0] if hooks is not None else ()):
            r = h(g)
            g = g if r is None else r
        if t.grad is None:
            t.grad = g
        elif is_sparse_tensor(t.grad):
            t.grad = t.grad + g if is_sparse_tensor(g) else t.grad.to_dense() + g
        else:
            t.grad._data += g.to_dense()._data if is_sparse_tensor(g) else g._data
        for h in (hooks[1] if hooks is not None else ()):
            h(t)


def sparse_of(x: Any) -> Optional[SparseTensor]:
    """The sparse tensor whose ``_data`` is ``x``, or None for an ordinary array (how an
    optimiser, which works on ``grad._data``, recognises a sparse gradient)."""
    return x.tensor if isinstance(x, SparseData) else None


def add_sparse_(param: Any, grad: SparseTensor, alpha: float) -> None:
    """``param += alpha * grad`` in place on the array ``param``, entry by entry (repeated
    entries each add), as torch adds a sparse tensor into a dense one."""
    vals = grad._vals._data
    add_at(param, tuple(grad._idx), vals * vals.dtype.type(alpha))


def held_entries(param: Any, grad: SparseTensor) -> tuple:
    """``(dense gradient, mask of the entries the sparse gradient holds)`` for an array
    ``param``: the entries a lazy optimiser (SparseAdam) updates."""
    s = grad._co()
    xp = _backend.array_module(param)
    held = xp.zeros(param.shape, dtype=bool)
    held[tuple(s._idx)] = True
    return s.to_dense().detach()._data, held


