"""``torch.sparse``: products, sums and softmaxes of sparse COO tensors.

The tensors themselves are made by :func:`mpitensor.sparse_coo_tensor` and
:meth:`Tensor.to_sparse` (see ``mpitensor._ops.sparse``). Gradients follow torch's rules for these
functions: :func:`mm` gives the sparse operand a gradient with its own entries only.

Example:
    >>> import mpitensor as mt
    >>> s = mt.sparse_coo_tensor([[0, 1], [1, 0]], [2.0, 3.0], (2, 2))
    >>> mt.sparse.mm(s, mt.ones(2, 1))
    tensor([[2.],
            [3.]])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core.dims import wrap_dim
from mpitensor._core.opkit import wrap
from mpitensor._ops.sparse.coo import Gather, ScatterAdd, SparseTensor, is_sparse_tensor, sparse_sum
from mpitensor._ops.sparse.products import sparse_mm
from mpitensor.tensor import Tensor

__all__ = ["addmm", "check_sparse_tensor_invariants", "log_softmax", "mm", "softmax", "sum"]


def mm(mat1: Any, mat2: Any, reduce: str = "sum") -> Any:
    """Return ``mat1 @ mat2`` for a sparse ``mat1`` and a dense (dense result) or sparse
    (sparse result) ``mat2``; the sparse operand's gradient keeps its own entries.

    Raises:
        RuntimeError: shapes that do not multiply, dtypes that differ.
        NotImplementedError: ``reduce`` other than ``"sum"``.
    """
    if reduce != "sum":
        raise NotImplementedError(f"sparse.mm(): reduce={reduce!r} is not supported (only "
                                  f"'sum')")
    if not is_sparse_tensor(mat1):
        return mat1 @ mat2
    return sparse_mm(mat1, mat2, "sparse.mm", strict=False)


def addmm(mat: Tensor, mat1: Any, mat2: Any, *, beta: Any = 1.0, alpha: Any = 1.0) -> Tensor:
    """Return ``beta * mat + alpha * (mat1 @ mat2)`` for a dense ``mat``, a sparse ``mat1`` and
    a dense ``mat2`` (gradients as :func:`mm`)."""
    if is_sparse_tensor(mat):
        raise TypeError("sparse.addmm(): mat must be a dense tensor")
    prod = mm(mat1, mat2)
    prod = prod if alpha == 1 else prod * alpha
    return prod if beta == 0 else (mat if beta == 1 else mat * beta) + prod


def sum(input: SparseTensor, dim: Any = None, dtype: Any = None) -> Tensor:  # noqa: A001,A002
    """Sum a sparse tensor: over everything (a dense 0-d tensor), or over ``dim`` (a sparse
    result while a sparse dimension is left, else dense)."""
    if not is_sparse_tensor(input):
        raise TypeError("sparse.sum(): input must be a sparse COO tensor")
    return sparse_sum(input, dim, dtype)


def _max_at(out: Any, index: Any, src: Any) -> None:
    if isinstance(out, np.ndarray):
        np.maximum.at(out, index, src)
    else:
        import cupyx  # noqa: PLC0415 - only for GPU arrays

        cupyx.scatter_max(out, index, src)


def _softmax(input: SparseTensor, dim: int, dtype: Any, log: bool) -> SparseTensor:
    what = "sparse.log_softmax()" if log else "sparse.softmax()"
    if not is_sparse_tensor(input):
        raise TypeError(f"{what}: input must be a sparse COO tensor")
    s = input._co()
    if dtype is not None:
        s = s.to(_dt.to_dtype(dtype))
    if _dt.kind_of(s.dtype) != "f":
        raise RuntimeError(f"{what}: expected a floating point tensor, got "
                           f"{_dt.dt_repr(s.dtype)}")
    sd = s.sparse_dim()
    d = wrap_dim(dim, s.dim())
    vals = s._vals
    if d >= sd:  # a dense dimension: each value row on its own
        return s._with_values(vals.log_softmax(d - sd + 1) if log else vals.softmax(d - sd + 1))
    # entries that share every other sparse coordinate form one softmax group; the entries
    # not stored are left out (as if -inf), as torch's sparse softmax defines it
    xp = _backend.array_module(s._idx)
    keep = [k for k in range(sd) if k != d]
    nnz = s._nnz()
    if keep:
        lin = xp.ravel_multi_index(tuple(s._idx[keep]), tuple(s._size[k] for k in keep))
        _, grp = xp.unique(lin, return_inverse=True)
        grp = grp.reshape(-1)
        n = int(grp.max()) + 1 if nnz else 0
    else:
        grp = xp.zeros(nnz, dtype=np.int64)
        n = 1 if nnz else 0
    dense = tuple(vals.shape[1:])
    top = xp.full((n, *dense), -np.inf, dtype=vals.dtype)
    _max_at(top, grp, vals._data)
    shifted = vals - wrap(top[grp])
    e = shifted.exp()
    total = Gather.apply(ScatterAdd.apply(e, (grp,), (n, *dense)), (grp,))
    return s._with_values(shifted - total.log() if log else e / total)


def softmax(input: SparseTensor, dim: int, *, dtype: Any = None) -> SparseTensor:  # noqa: A002
    """Softmax over ``dim`` of the stored entries (entries not stored count as ``-inf``: they
    stay absent); a coalesced sparse result, differentiable."""
    return _softmax(input, dim, dtype, False)


def log_softmax(input: SparseTensor, dim: int, *, dtype: Any = None) -> SparseTensor:  # noqa: A002
    """Log-softmax over ``dim`` of the stored entries (see :func:`softmax`)."""
    return _softmax(input, dim, dtype, True)


class check_sparse_tensor_invariants:  # noqa: N801 - torch's name
    """torch's switch for checking the indices given to ``sparse_coo_tensor``.

    mpitensor always checks them (a bad index raises instead of corrupting memory), so this
    switch only records what was asked: :meth:`is_enabled` answers with it, and using it as
    a context manager or decorator sets it for the block.
    """

    _enabled = False

    def __init__(self, enable: bool = True) -> None:
        self.state = bool(enable)
        self.saved_state: Any = None

    @staticmethod
    def is_enabled() -> bool:
        """Whether checks were asked for (mpitensor checks either way)."""
        return check_sparse_tensor_invariants._enabled

    @staticmethod
    def enable() -> None:
        """Ask for the checks (mpitensor always makes them)."""
        check_sparse_tensor_invariants._enabled = True

    @staticmethod
    def disable() -> None:
        """Record that checks are not asked for; mpitensor still makes them."""
        check_sparse_tensor_invariants._enabled = False

    def __enter__(self) -> check_sparse_tensor_invariants:
        self.saved_state = check_sparse_tensor_invariants._enabled
        check_sparse_tensor_invariants._enabled = self.state
        return self

    def __exit__(self, *exc: Any) -> None:
        check_sparse_tensor_invariants._enabled = self.saved_state

    def __call__(self, fn: Any) -> Any:
        import functools  # noqa: PLC0415

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with check_sparse_tensor_invariants(self.state):
                return fn(*args, **kwargs)

        return wrapped
