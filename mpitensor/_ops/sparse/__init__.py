"""Sparse COO tensors: ``sparse_coo_tensor``, ``Tensor.to_sparse`` and the ops on them.

A sparse COO tensor of ``sparse_dim`` sparse and ``dense_dim`` dense dimensions keeps

- ``_idx``: an int64 array of shape ``(sparse_dim, nnz)``, the coordinates of the entries;
- ``_vals``: a dense :class:`Tensor` of shape ``(nnz, *size[sparse_dim:])``, their values;
- ``_size``: the full shape, and ``_coalesced``: whether the coordinates are sorted and unique.

Autograd flows through ``_vals``, an ordinary tensor: a sparse tensor built from values that
require grad passes gradients back to them, and a sparse leaf that requires grad (``requires_grad
=True``, or ``requires_grad_()``) gets a sparse ``.grad`` with its own coordinates, as torch's
``torch.sparse.mm`` and ``to_dense`` give. The kernels are vectorised NumPy (``np.add.at``) or,
for GPU arrays, CuPy (``cupyx.scatter_add``).

Operations that torch does not run on a sparse tensor raise ``NotImplementedError``: the
``_data`` of a sparse tensor is a placeholder that refuses every array operation, so a dense op
reached with a sparse tensor fails at once instead of computing on something else.

============  ==================================================================================
``coo``       :class:`SparseTensor`: data, kernels, arithmetic, maps, sums, ``sparse_coo_tensor``
``products``  ``mm``/``@`` with sparse operands, ``spmm``, ``smm``, ``hspmm``, ``dsmm``
``csr``       :class:`SparseCsrTensor`, ``sparse_csr_tensor``, ``to_sparse_csr``
``grad``      :class:`SparseGrad` (``nn.Embedding(sparse=True)``) and optimisers' helpers
============  ==================================================================================
"""

# ruff: noqa: F401 - this package re-exports the names of its modules
from __future__ import annotations

from mpitensor._ops.sparse.coo import SparseTensor, sparse_coo, sparse_coo_tensor, sparse_csr
from mpitensor._ops.sparse.csr import SparseCsrTensor, sparse_csr_tensor
from mpitensor._ops.sparse.grad import SparseGrad, add_sparse_, held_entries, sparse_of
from mpitensor._ops.sparse.products import dsmm, hsmm, hspmm, smm, spmm

__all__ = ["SparseCsrTensor", "SparseTensor", "dsmm", "hsmm", "hspmm", "smm", "sparse_coo",
           "sparse_coo_tensor", "sparse_csr", "sparse_csr_tensor", "spmm"]
