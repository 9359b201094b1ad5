"""``mpitensor.linalg``: the common functions of ``torch.linalg``.

``import mpitensor as torch`` then ``torch.linalg.norm(x)``, ``torch.linalg.solve(A, B)``,
``torch.linalg.eigh(A)``, ``torch.linalg.lstsq(A, B)``... under their ``torch.linalg`` names
and signatures, differentiable where torch's are (the factorizations, eigen-decompositions
and solvers are in ``mpitensor._ops.linalg_more`` and ``mpitensor._ops.linalg_lstsq``); a
singular matrix raises :class:`LinAlgError` (NumPy's, a ``ValueError``). See docs/linalg.md.

Example:
    >>> import mpitensor as mt
    >>> mt.linalg.norm(mt.tensor([3.0, 4.0]))
    tensor(5.)
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from mpitensor._core import autocast as _autocast
from mpitensor._ops.linalg import solve
from mpitensor._ops.linalg_lstsq import (
    cond,
    lstsq,
    matrix_rank,
    pinv,
    tensorinv,
    tensorsolve,
    vander,
)
from mpitensor._ops.linalg_more import (
    cholesky,
    cholesky_ex,
    eig,
    eigh,
    eigvals,
    eigvalsh,
    householder_product,
    inv_ex,
    ldl_factor,
    ldl_factor_ex,
    ldl_solve,
    lu,
    lu_factor,
    lu_factor_ex,
    lu_solve,
    matrix_exp,
    qr,
    solve_ex,
    solve_triangular,
    svd,
    svdvals,
)
from mpitensor._ops.norms import matrix_norm, vector_norm
from mpitensor.tensor import Tensor

__all__ = [
    "norm", "vector_norm", "matrix_norm", "inv", "det", "slogdet", "solve", "matmul", "cross",
    "diagonal", "matrix_power", "multi_dot", "vecdot", "LinAlgError",
    "cholesky", "cholesky_ex", "inv_ex", "solve_ex", "solve_triangular", "qr", "svd", "svdvals",
    "eigh", "eigvalsh", "eig", "eigvals", "lu_factor", "lu_factor_ex", "lu", "lu_solve",
    "householder_product", "matrix_exp", "lstsq", "pinv", "matrix_rank", "cond", "tensorinv",
    "tensorsolve", "vander", "ldl_factor", "ldl_factor_ex", "ldl_solve",
]

LinAlgError = np.linalg.LinAlgError


def norm(A: Tensor, ord: Any = None, dim: Any = None, keepdim: bool = False, *,  # noqa: N803, A002
         dtype: Any = None) -> Tensor:
    """Return a vector or matrix norm, as ``torch.linalg.norm``: over every element (2-norm)
    when ``ord`` and ``dim`` are None; a vector norm for an int ``dim`` or a 1-D input; a matrix
    norm for a pair ``dim`` or a 2-D input.

    Raises:
        ValueError: ``ord`` given without ``dim`` for an input of more than 2 dimensions.
    """
    nd = A.dim()
    if dim is None:
        if ord is None:
            return vector_norm(A, 2, None, keepdim, dtype=dtype)
        if nd == 1:
            return vector_norm(A, ord, None, keepdim, dtype=dtype)
        if nd == 2:
            return matrix_norm(A, ord, (-2, -1), keepdim, dtype=dtype)
        raise ValueError(f"linalg.norm(): with ord, the input must be 1-D or 2-D unless dim is "
                         f"given; it has {nd} dimensions")
    if isinstance(dim, (int, np.integer)) or len(dim) == 1:
        return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype)
    if len(dim) == 2:
        return matrix_norm(A, "fro" if ord is None else ord, dim, keepdim, dtype=dtype)
    raise ValueError(f"linalg.norm(): dim must name 1 or 2 dimensions, got {dim!r}")


def _of_matrix(name: str, method: str, what: str) -> Callable:
    """``torch.linalg.<name>(A)``: the Tensor method ``method`` of ``A``, returning ``what``."""
    def fn(A: Tensor) -> Any:  # noqa: N803 - torch's name
        return getattr(A, method)()
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Return {what}."
    return fn


inv, det, slogdet = (_of_matrix(*row) for row in (
    ("inv", "inverse", "the inverse of a square matrix (or of each in a batch)"),
    ("det", "det", "the determinant of a square matrix (or of each in a batch)"),
    ("slogdet", "slogdet", "``(sign, logabsdet)`` of the determinant")))


def matmul(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    """Return ``input @ other``."""
    return input @ other


def cross(input: Tensor, other: Tensor, *, dim: int = -1) -> Tensor:  # noqa: A002
    """Return the cross product along ``dim`` (the last by default)."""
    return input.cross(other, dim)


def diagonal(A: Tensor, *, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:  # noqa: N803
    """Return the view of the diagonals of the last two dimensions (by default)."""
    return A.diagonal(offset, dim1, dim2)


def matrix_power(A: Tensor, n: int) -> Tensor:  # noqa: N803
    """Return the square matrix to the integer power ``n``."""
    return A.matrix_power(n)


def multi_dot(tensors: Any) -> Tensor:
    """Return the product of the matrices in order (the first may be 1-D, as the last)."""
    ts = list(tensors)
    if len(ts) < 2:
        raise ValueError("multi_dot(): expected at least two tensors")
    out = ts[0]
    for t in ts[1:]:
        out = out @ t
    return out


@_autocast.op("linalg_vecdot")
def vecdot(x: Tensor, y: Tensor, *, dim: int = -1) -> Tensor:
    """Return the dot products of ``x`` (conjugated) and ``y`` along ``dim``."""
    return (x.conj() * y).sum(dim)
