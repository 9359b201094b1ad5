"""Sparse CSR matrices: :class:`SparseCsrTensor` (a coalesced 2-D COO tensor that also keeps
its row pointers), :func:`sparse_csr_tensor`, and ``to_sparse_csr`` on COO and dense tensors.
"""

from __future__ import annotations

import operator
from typing import Any, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor._core.devices import parse_device
from mpitensor._core.opkit import methods_of, tensor_methods, wrap
from mpitensor._ops.sparse.coo import SparseTensor, as_index_array, sparse_coo_tensor, sparse_csr
from mpitensor.tensor import Tensor

__all__ = ["SparseCsrTensor", "sparse_csr_tensor"]


# --------------------------------------------------------------------------------------------
# CSR: a coalesced 2-D COO tensor that also keeps its row pointers


class SparseCsrTensor(SparseTensor):
    """A sparse CSR matrix (``layout == mpitensor.sparse_csr``): 2-D, its entries sorted by
    row then column, described by ``crow_indices()``, ``col_indices()`` and ``values()``.
    Make one with :func:`sparse_csr_tensor` or :meth:`Tensor.to_sparse_csr`; it computes as
    the COO matrix of the same entries (products, maps, gradients through the values).
    """

    __slots__ = ("_crow",)

    is_sparse = False
    is_sparse_csr = True
    layout = sparse_csr

    @classmethod
    def _make(cls, idx: Any, vals: Tensor, size: tuple, coalesced: bool) -> SparseCsrTensor:
        if len(size) != 2 or idx.shape[0] != 2:
            raise RuntimeError(f"sparse CSR tensors here are 2-D matrices with no dense "
                               f"dimensions, got size {list(size)}")
        if not coalesced:  # a result with repeated entries: summed first, as CSR holds none
            return SparseTensor._make(idx, vals, size, False).coalesce().to_sparse_csr()
        t = super()._make(idx, vals, size, True)
        xp = _backend.array_module(idx)
        counts = xp.bincount(idx[0], minlength=int(size[0])) if idx.shape[1] else \
            xp.zeros(int(size[0]), dtype=np.int64)
        t._crow = xp.concatenate([xp.zeros(1, dtype=np.int64),
                                  xp.cumsum(counts).astype(np.int64)])
        return t

    def crow_indices(self) -> Tensor:
        """Return the row pointers: row ``i`` holds entries ``crow[i]:crow[i + 1]``."""
        return wrap(self._crow)

    def col_indices(self) -> Tensor:
        """Return the column of each entry."""
        return wrap(self._idx[1])

    def values(self) -> Tensor:
        """Return the values, in row order."""
        return self._vals

    def indices(self) -> Tensor:
        raise RuntimeError("indices() is for sparse COO tensors; a CSR tensor has "
                           "crow_indices() and col_indices()")

    _indices = indices

    def coalesce(self) -> SparseCsrTensor:
        raise RuntimeError("coalesce() is for sparse COO tensors; a CSR tensor holds no "
                           "repeated entries")

    def _co(self) -> SparseCsrTensor:
        return self

    def to_sparse(self, sparse_dim: Optional[int] = None, *, layout: Any = None,
                  blocksize: Any = None, dense_dim: Any = None) -> SparseTensor:
        """Return the sparse COO form (coalesced); ``layout=sparse_csr``: self."""
        if layout is sparse_csr:
            return self
        out = SparseTensor._make(self._idx, self._vals, self._size, True)
        return SparseTensor.to_sparse(out, sparse_dim, layout=layout)

    def to_sparse_csr(self, dense_dim: Any = None) -> SparseCsrTensor:
        """Return self."""
        return self

    def transpose(self, dim0: int = 0, dim1: int = 1) -> SparseTensor:
        raise NotImplementedError("transposing a CSR matrix gives torch's CSC layout, which "
                                  "mpitensor does not have; use .to_sparse().t() (COO)")

    t = swapaxes = swapdims = transpose

    def __repr__(self) -> str:
        rows = repr(wrap(self._crow))
        cols = repr(wrap(self._idx[1]))
        val = repr(self._vals.detach()).replace("\n", "\n" + " " * 14)
        return (f"tensor(crow_indices={rows},\n       col_indices={cols},\n       "
                f"values={val}, size={self._size}, nnz={self._nnz()},\n       "
                f"layout=mpitensor.sparse_csr)")

    __str__ = __repr__


def _coo_to_csr(s: SparseTensor) -> SparseCsrTensor:
    if s.sparse_dim() != 2 or s.dense_dim() != 0:
        raise RuntimeError(f"to_sparse_csr(): a 2-D sparse matrix is needed (2 sparse, 0 "
                           f"dense dimensions), got size {list(s._size)} with "
                           f"{s.sparse_dim()} sparse dimensions")
    c = s._co()
    out = SparseCsrTensor._make(c._idx, c._vals, c._size, True)
    out._src = c._src
    return out


def sparse_csr_tensor(crow_indices: Any, col_indices: Any, values: Any, size: Any = None, *,
                      dtype: Any = None, device: Any = None, pin_memory: bool = False,
                      requires_grad: bool = False,
                      check_invariants: Optional[bool] = None) -> SparseCsrTensor:
    """Make a sparse CSR matrix from row pointers, column indices and values.

    The invariants are always checked (as torch does with ``check_invariants=True``): the row
    pointers start at 0, never decrease and end at nnz; each row's columns are in range,
    sorted and unique.

    Raises:
        RuntimeError: an invariant does not hold, or a size that is not 2-D.

    Example:
        >>> import mpitensor as mt
        >>> mt.sparse_csr_tensor([0, 1, 2], [1, 0], [5.0, 6.0], (2, 2)).to_dense()
        tensor([[0., 5.],
                [6., 0.]])
    """
    dev = parse_device(device)
    crow = as_index_array(crow_indices, dev)
    col = as_index_array(col_indices, dev)
    if crow.ndim != 1 or col.ndim != 1:
        raise RuntimeError("sparse_csr_tensor(): crow_indices and col_indices must be 1-D "
                           "(batched CSR tensors are not supported)")
    xp = _backend.array_module(crow)
    nrows, nnz = crow.shape[0] - 1, col.shape[0]
    c = _backend.to_numpy(crow)
    if nrows < 0 or (c.size and c[0] != 0):
        raise RuntimeError("sparse_csr_tensor(): crow_indices must start at 0")
    if (np.diff(c) < 0).any() or c[-1] != nnz:
        raise RuntimeError(f"sparse_csr_tensor(): crow_indices must not decrease and must end "
                           f"at nnz ({nnz}), got last {int(c[-1])}")
    rows = xp.repeat(xp.arange(nrows, dtype=np.int64), xp.asarray(np.diff(c)))
    if size is None:
        cols = _backend.to_numpy(col)
        size = (nrows, int(cols.max()) + 1 if nnz else 0)
    size = tuple(operator.index(n) for n in size)
    if len(size) != 2 or size[0] != nrows:
        raise RuntimeError(f"sparse_csr_tensor(): size must be 2-D with {nrows} rows (from "
                           f"crow_indices), got {list(size)}")
    if nnz:
        lin = rows * size[1] + col
        if bool((col < 0).any()) or bool((col >= size[1]).any()):
            raise RuntimeError(f"sparse_csr_tensor(): column indices must be in [0, "
                               f"{size[1]})")
        if nnz > 1 and not bool((lin[1:] > lin[:-1]).all()):
            raise RuntimeError("sparse_csr_tensor(): each row's column indices must be "
                               "sorted and unique")
    coo = sparse_coo_tensor(xp.stack([rows, col]), values, size, dtype=dtype, device=dev,
                            requires_grad=requires_grad)
    out = SparseCsrTensor._make(coo._idx, coo._vals, size, True)
    return out


@methods_of(SparseTensor)
class _CooToCsr:
    def to_sparse_csr(self, dense_dim: Any = None) -> SparseCsrTensor:
        """Return the sparse CSR form of a 2-D sparse matrix (coalesced)."""
        return _coo_to_csr(self)


@tensor_methods
class _DenseToCsr:
    def to_sparse_csr(self, dense_dim: Any = None) -> SparseCsrTensor:
        """Return the sparse CSR form of a 2-D tensor (its nonzero entries); differentiable."""
        if self.dim() != 2:
            raise RuntimeError(f"to_sparse_csr(): a 2-D tensor is needed, got {self.dim()}-D")
        return _coo_to_csr(self.to_sparse())
