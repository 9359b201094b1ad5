"""Products with sparse matrices: ``S @ D`` (and its gradient to the values and to ``D``),
``D @ S``, ``torch.sparse.mm``, ``spmm``, ``smm``, ``hspmm``, ``dsmm``, and the ``mm``/``matmul``
methods of :class:`SparseTensor`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core.opkit import methods_of
from mpitensor._ops.sparse.coo import Gather, SparseTensor, add_at, is_sparse_tensor, refusal
from mpitensor.autograd import ArrayFunction as Function, grad_enabled_for
from mpitensor.tensor import Tensor

__all__ = ["dsmm", "hsmm", "hspmm", "smm", "spmm"]


class _SpMM(Function):
    """``S @ D`` for a 2-D sparse ``S`` given as (values, rows, cols, rows of S) and a dense
    2-D ``D``; gradients to the values (masked to S's entries) and to ``D``."""

    @staticmethod
    def forward(ctx: Any, vals: Any, dense: Any, rows: Any, cols: Any, m: int) -> Any:
        xp = _backend.array_module(dense)
        ctx.save_for_backward(vals, dense)
        ctx.rows, ctx.cols = rows, cols
        out = xp.zeros((m, dense.shape[1]), dtype=dense.dtype)
        add_at(out, rows, vals[:, None] * dense[cols])
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        vals, dense = ctx.saved_tensors
        rows, cols = ctx.rows, ctx.cols
        gv = gd = None
        if ctx.needs_input_grad[0]:
            gv = (g[rows] * dense[cols]).sum(axis=1)
        if ctx.needs_input_grad[1]:
            xp = _backend.array_module(g)
            gd = xp.zeros(dense.shape, dtype=g.dtype)
            add_at(gd, cols, vals[:, None] * g[rows])
        return gv, gd, None, None, None


def _check_mm(s: SparseTensor, d: Tensor, what: str) -> None:
    if s.sparse_dim() != 2 or s.dense_dim() != 0:
        raise RuntimeError(f"{what}: the sparse operand must be a 2-D sparse matrix (2 sparse, "
                           f"0 dense dimensions), got size {list(s._size)} with "
                           f"{s.sparse_dim()} sparse dimensions")
    if d.dim() not in (1, 2):
        raise RuntimeError(f"{what}: the other operand must be 1-D or 2-D, got {d.dim()}-D")
    if d.shape[0] != s._size[1]:
        raise RuntimeError(f"{what}: shapes {list(s._size)} and {list(d.shape)} cannot be "
                           f"multiplied ({s._size[1]} != {d.shape[0]})")
    if d.dtype != s.dtype:
        raise RuntimeError(f"{what}: expected both operands to have one dtype, got "
                           f"{_dt.dt_repr(s.dtype)} and {_dt.dt_repr(d.dtype)}")


def _refuse_leaf_grad(s: SparseTensor, what: str) -> None:
    # torch gives a sparse leaf a *dense* gradient through mm/@ but a sparse one through
    # torch.sparse.mm; a sparse .grad is all this class holds, so only the latter is offered
    if s._vals.requires_grad and s._vals.grad_fn is None:
        raise NotImplementedError(
            f"{what}: a sparse leaf that requires grad gets a dense gradient from this "
            f"operation in torch, which mpitensor cannot hold; use torch.sparse.mm(sparse, "
            f"dense) (a gradient with the sparse tensor's own entries, as torch gives there)")


def sparse_mm(s: SparseTensor, other: Any, what: str, strict: bool) -> Any:
    if not isinstance(other, Tensor):
        raise TypeError(f"{what}(): expected a tensor, got {type(other).__name__}")
    if strict:
        _refuse_leaf_grad(s, what)
    if is_sparse_tensor(other):
        if other.sparse_dim() != 2 or other.dense_dim() != 0:
            raise RuntimeError(f"{what}: the second sparse operand must be a 2-D sparse matrix")
        return sparse_mm(s, other.to_dense(), what, False).to_sparse()
    _check_mm(s, other, what)
    d = other if other.dim() == 2 else other.unsqueeze(1)
    if other.is_cuda != s.is_cuda:
        raise RuntimeError(f"{what}: the operands are on different devices ({s.device} and "
                           f"{other.device})")
    if strict and s._src is not None and grad_enabled_for(s._src):
        return s._src @ other  # the same values; the dense gradient torch gives here
    out = _SpMM.apply(s._vals, d, s._idx[0], s._idx[1], s._size[0])
    return out if other.dim() == 2 else out.squeeze(1)


def _dense_mm_sparse(d: Tensor, s: SparseTensor) -> Tensor:
    """``d @ s`` for a dense 2-D ``d``: computed as ``(s.t() @ d.t()).t()``."""
    if d.dim() != 2:
        raise RuntimeError(f"mm: dense @ sparse needs a 2-D dense operand, got {d.dim()}-D")
    _refuse_leaf_grad(s, "mm")
    return sparse_mm(s.t(), d.t(), "mm", True).t()


def dsmm(input: Any, mat2: Any) -> Tensor:  # noqa: A002 - torch's name
    """Return ``input @ mat2`` (a dense result) for a sparse 2-D ``input``."""
    return spmm(input, mat2)


def hspmm(mat1: Any, mat2: Any) -> SparseTensor:
    """Return ``mat1 @ mat2`` for a sparse ``mat1`` and a dense ``mat2`` as a hybrid sparse
    tensor: one sparse dimension (the rows ``mat1`` has entries in) and one dense (each row's
    values); differentiable."""
    out = spmm(mat1, mat2)
    xp = _backend.array_module(mat1._idx)
    rows = xp.unique(mat1._idx[0]).astype(np.int64)
    return SparseTensor._make(rows[None, :], Gather.apply(out, (rows,)), tuple(out.shape),
                              False)


hsmm = hspmm


def smm(input: Any, mat: Any) -> SparseTensor:  # noqa: A002 - torch's name
    """Return ``input @ mat`` as a sparse matrix holding every entry of the rows ``input`` has
    entries in (two sparse dimensions; see :func:`hspmm` for the hybrid form)."""
    h = hspmm(input, mat)
    xp = _backend.array_module(h._idx)
    k = h._size[1]
    rows = xp.repeat(h._idx[0], k)
    cols = xp.tile(xp.arange(k, dtype=np.int64), h._idx.shape[1])
    return SparseTensor._make(xp.stack([rows, cols]), h._vals.reshape(-1), h._size, False)


def spmm(input: Any, mat2: Any) -> Any:  # noqa: A002 - torch's name
    """Return ``input @ mat2`` for a sparse 2-D ``input`` and a dense 2-D ``mat2``."""
    if not is_sparse_tensor(input):
        raise TypeError("spmm(): input must be a sparse COO tensor (use mm for dense ones)")
    return input.mm(mat2)


@methods_of(SparseTensor)
class _SparseProducts:
    def smm(self, mat: Any) -> SparseTensor:
        """``mpitensor.smm(self, mat)``."""
        return smm(self, mat)

    # ---- products -----------------------------------------------------------------------------

    def mm(self, mat2: Any) -> Any:
        """``self @ mat2`` for a 2-D sparse ``self`` and a dense (dense result) or sparse
        (sparse result) 2-D ``mat2``."""
        return sparse_mm(self, mat2, "mm", strict=True)

    def matmul(self, other: Any) -> Any:
        """``self @ other`` (a 1-D or 2-D dense ``other``, or a 2-D sparse one)."""
        return sparse_mm(self, other, "matmul", strict=True)

    __matmul__ = matmul
    spmm = mm

    def __rmatmul__(self, other: Any) -> Any:  # dense @ sparse
        if not isinstance(other, Tensor):
            return NotImplemented
        return _dense_mm_sparse(other, self)

    def addmm(self, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
        raise refusal("addmm() with a sparse tensor as input (the added term)")
