"""The factorizations, eigen-decompositions and solvers of ``torch.linalg`` with its
conventions (``svd`` returns ``Vh`` and has ``full_matrices=True``; ``qr`` takes ``mode``;
``lu_factor`` returns ``(LU, pivots)``; the ``_ex`` forms return ``(result, info)``).

They are thin layers over the recorded ops of :mod:`mpitensor._ops.factorizations`,
:mod:`mpitensor._ops.eigen`, :mod:`mpitensor._ops.legacy_solves` and the legacy functions of
:mod:`mpitensor._ops.linalg_legacy`, so they are differentiable where torch's are.
:mod:`mpitensor.linalg` exports them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor._core.devices import xp
from mpitensor._core.opkit import Tensor, wrap
from mpitensor._ops import eigen as _e
from mpitensor._ops import factorizations as _f
from mpitensor._ops import ldl as _ldl
from mpitensor._ops import linalg_legacy as _leg
from mpitensor._ops.linalg import solve as _solve
from mpitensor._ops.linalg_legacy import _matrix, _parts, _result
from mpitensor.autograd import _mode as _grad_mode

__all__ = [
    "cholesky", "cholesky_ex", "inv_ex", "solve_ex", "solve_triangular", "qr", "svd",
    "svdvals", "eigh", "eigvalsh", "eig", "eigvals", "lu_factor", "lu_factor_ex", "lu",
    "lu_solve", "householder_product", "matrix_exp", "ldl_factor", "ldl_factor_ex", "ldl_solve",
    "check_batches",
]

_CholeskyEx = _result("linalg_cholesky_ex", ["L", "info"])
_InvEx = _result("linalg_inv_ex", ["inverse", "info"])
_SolveEx = _result("linalg_solve_ex", ["result", "info"])
_QR = _result("linalg_qr", ["Q", "R"])
_SVD = _result("linalg_svd", ["U", "S", "Vh"])
_Eigh = _result("linalg_eigh", ["eigenvalues", "eigenvectors"])
_Eig = _result("linalg_eig", ["eigenvalues", "eigenvectors"])
_LuFactor = _result("linalg_lu_factor", ["LU", "pivots"])
_LuFactorEx = _result("linalg_lu_factor_ex", ["LU", "pivots", "info"])
_Lu = _result("linalg_lu", ["P", "L", "U"])


def _raise_info(info: Any, what: str, why: str, batched: bool) -> None:
    """Raise :class:`LinAlgError` for the first batch element whose ``info`` is not 0."""
    flat = np.asarray(info.get() if hasattr(info, "get") else info).reshape(-1)
    bad = np.flatnonzero(flat)
    if bad.size:
        i = int(bad[0])
        where = f"(batch element {i}) " if batched else ""
        raise np.linalg.LinAlgError(f"{what}: {where}{why.format(int(flat[i]))}")


def check_batches(what: str, a: Tensor, b: Tensor, names: tuple = ("A", "B"),
                  vector: bool = False) -> None:
    """Raise unless the batch dimensions of ``a`` (all but its last two) and ``b`` (all but
    its last two; its last one for a batch of ``vector``) broadcast."""
    ba, bb = tuple(a.shape[:-2]), tuple(b.shape[:-1] if vector else b.shape[:-2])
    try:
        np.broadcast_shapes(ba, bb)
    except ValueError:
        raise ValueError(f"{what}: the batch dimensions of {names[0]} {list(ba)} and "
                         f"{names[1]} {list(bb)} do not broadcast; give them equal batch "
                         f"sizes (or 1)") from None


# --------------------------------------------------------------------------------------------
# Cholesky


def _leading_minor(m: Any, a: Any) -> int:
    """The order of the first leading minor of ``a`` that is not positive-definite (0: none)."""
    for k in range(1, a.shape[-1] + 1):
        try:
            low = m.linalg.cholesky(a[:k, :k])
        except np.linalg.LinAlgError:
            return k
        if bool(m.isnan(low).any()):
            return k
    return 0


def _cholesky_infos(x: Any) -> tuple:
    """``(L, info)``: the lower factors, and per matrix 0 or the order of the first leading
    minor that is not positive-definite (its factor: the leading block's, zeros after)."""
    m = xp(x)
    batch = x.shape[:-2]
    n = x.shape[-1]
    flat = x.reshape((int(np.prod(batch)), n, n))
    low = m.zeros_like(flat)
    info = np.zeros(flat.shape[0], dtype=np.int32)
    for i in range(flat.shape[0]):
        k = _leading_minor(m, flat[i])
        info[i] = k
        size = n if k == 0 else k - 1
        if size:
            low[i, :size, :size] = m.linalg.cholesky(flat[i, :size, :size])
    return low.reshape(x.shape), m.asarray(info.reshape(batch))


def cholesky_ex(input: Tensor, *, upper: bool = False, check_errors: bool = False) -> Any:  # noqa: A002, N803
    """Return ``(L, info)``: the Cholesky factor (``U = L^H`` where ``upper``) and per matrix
    an int32 ``info``, 0 or the order of the first leading minor that is not
    positive-definite (that matrix's factor is then only its leading block's).

    Raises:
        LinAlgError: ``check_errors`` and some ``info`` is not 0.
    """
    x = _matrix(input, "linalg.cholesky_ex()", square=True)
    m = xp(x)
    try:
        low = _f.cholesky(x)
        info = m.zeros(x.shape[:-2], dtype=m.int32)
    except np.linalg.LinAlgError:
        low, info = _cholesky_infos(x)
    if check_errors:
        _raise_info(info, "linalg.cholesky_ex", "the input is not positive-definite (the "
                    "leading minor of order {} is not)", x.ndim > 2)
    out = m.ascontiguousarray(_f.mH(low)) if upper else low
    return _CholeskyEx(_parts(input, (out,), _f.cholesky_vjp, (low, bool(upper)), (0,))[0],
                       wrap(info))


def cholesky(input: Tensor, *, upper: bool = False) -> Tensor:  # noqa: A002, N803
    """Return the Cholesky factor ``L`` of a Hermitian positive-definite matrix (``L^H``
    where ``upper``); only the lower triangle is read.

    Raises:
        LinAlgError: a matrix is not positive-definite (naming the batch element).
    """
    return _leg.cholesky(input, bool(upper))


# --------------------------------------------------------------------------------------------
# Inverses and solves that report singular matrices


def _singular_safe(A: Tensor, what: str) -> tuple:  # noqa: N803
    """``(A', bad, info)``: A with its singular matrices replaced by the identity, the mask of
    those (batch shape) and the int32 LU ``info`` (0, or the first zero of U's diagonal)."""
    x = _matrix(A, what, square=True)
    m = xp(x)
    info = _f.lu_factor(x)[2] if x.size else m.zeros(x.shape[:-2], dtype=m.int32)
    bad = info != 0
    if not bool(bad.any()):
        return A, bad, info
    eye = m.eye(x.shape[-1], dtype=x.dtype)
    return A.where(wrap(~bad[..., None, None]), wrap(eye)), bad, info


def _nan_where(t: Tensor, bad: Any, dims: int) -> Tensor:
    if not bool(bad.any()):
        return t
    mask = bad.reshape(bad.shape + (1,) * dims)
    return t.where(wrap(~mask), wrap(xp(bad).asarray(np.nan, dtype=t._data.dtype)))


_SINGULAR = "the diagonal element {} of U is zero: the matrix is singular"


def inv_ex(A: Tensor, *, check_errors: bool = False) -> Any:  # noqa: N803
    """Return ``(inverse, info)``: the inverse of each square matrix and an int32 ``info``,
    0 or the 1-based index of the first zero on U's diagonal of its LU factorization (that
    matrix's inverse is then NaN).

    Raises:
        LinAlgError: ``check_errors`` and a matrix is singular.
    """
    safe, bad, info = _singular_safe(A, "linalg.inv_ex()")
    if check_errors:
        _raise_info(info, "linalg.inv_ex", _SINGULAR, A.dim() > 2)
    return _InvEx(_nan_where(safe.inverse(), bad, 2), wrap(info))


def solve_ex(A: Tensor, B: Tensor, *, left: bool = True, check_errors: bool = False) -> Any:  # noqa: N803
    """Return ``(result, info)``: :func:`mpitensor.linalg.solve` with the singular matrices
    reported through ``info`` (as :func:`inv_ex`; their results are NaN).

    Raises:
        LinAlgError: ``check_errors`` and a matrix is singular.
    """
    vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and B.shape == A.shape[:-1])
    check_batches("linalg.solve_ex()", A, B, vector=vector)
    safe, bad, info = _singular_safe(A, "linalg.solve_ex()")
    if check_errors:
        _raise_info(info, "linalg.solve_ex", _SINGULAR, A.dim() > 2)
    out = _solve(safe, B, left=left)
    return _SolveEx(_nan_where(out, bad, 1 if vector else 2), wrap(info))


def solve_triangular(input: Tensor, B: Tensor, *, upper: bool, left: bool = True,  # noqa: A002, N803
                     unitriangular: bool = False) -> Tensor:
    """Return ``X`` with ``A X = B`` (``X A = B`` where not ``left``) for the upper (or
    lower) triangle of ``A``, its diagonal taken as ones where ``unitriangular``; batch
    dimensions broadcast."""
    check_batches("linalg.solve_triangular()", input, B, ("input", "B"))
    if left:
        return _leg.triangular_solve(B, input, bool(upper), False, bool(unitriangular))[0]
    # X input = B  <=>  input^T X^T = B^T
    xt = _leg.triangular_solve(B.mT, input, bool(upper), True, bool(unitriangular))[0]
    return xt.mT


# --------------------------------------------------------------------------------------------
# QR and the SVD


def qr(A: Tensor, mode: str = "reduced") -> Any:  # noqa: N803
    """Return ``(Q, R)`` with ``A = Q R``: ``mode='reduced'`` (k = min(m, n) columns of Q),
    ``'complete'`` (square Q) or ``'r'`` (R only; Q is empty and there is no gradient).

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"linalg.qr(): mode must be 'reduced', 'complete' or 'r', got "
                         f"{mode!r}")
    x = _matrix(A, "linalg.qr()")
    complete = mode == "complete"
    q, r = _f.qr(x, complete)
    if mode == "r":
        out = _parts(A, (r,), _qr_r_vjp, None, (0,))[0]
        return _QR(wrap(xp(x).empty((0,), dtype=x.dtype)), out)
    return _QR(*_parts(A, (q, r), _f.qr_vjp, (q, r, complete), (0, 1)))


def _qr_r_vjp(x: Any, state: Any, i: int, g: Any) -> Any:
    raise RuntimeError("linalg.qr(mode='r'): the gradient needs Q, which mode='r' does not "
                       "compute; use mode='reduced'")


def svd(A: Tensor, full_matrices: bool = True, *, driver: Any = None) -> Any:  # noqa: N803
    """Return ``(U, S, Vh)`` with ``A = U diag(S) Vh``; ``full_matrices=True`` gives square
    ``U`` and ``Vh``. ``driver`` (a CUDA choice in torch) must be None."""
    _no_driver(driver, "linalg.svd()")
    u, s, v = _leg.svd(A, not full_matrices)
    return _SVD(u, s, v.mH)


def _no_driver(driver: Any, what: str) -> None:
    if driver is not None:
        raise ValueError(f"{what}: driver is only for CUDA inputs in torch; pass driver=None")


def svdvals(A: Tensor, *, driver: Any = None) -> Tensor:  # noqa: N803
    """Return the singular values of each matrix, in descending order (real)."""
    _no_driver(driver, "linalg.svdvals()")
    x = _matrix(A, "linalg.svdvals()")
    m = xp(x)
    if _grad_mode.enabled and A._requires_grad:
        u, s, vh = m.linalg.svd(x, full_matrices=False)
        return _parts(A, (s,), _e.svdvals_vjp, (u, s, vh), (0,))[0]
    return wrap(m.linalg.svd(x, compute_uv=False))


# --------------------------------------------------------------------------------------------
# Eigen-decompositions


def _uplo(uplo: Any, what: str) -> str:
    if not isinstance(uplo, str) or uplo.upper() not in ("L", "U"):
        raise ValueError(f"{what}: UPLO must be 'L' or 'U', got {uplo!r}")
    return uplo.upper()


def eigh(input: Tensor, UPLO: str = "L") -> Any:  # noqa: A002, N803
    """Return ``(eigenvalues, eigenvectors)`` of a Hermitian matrix (only its ``UPLO``
    triangle read): real eigenvalues in ascending order, orthonormal eigenvectors as
    columns."""
    uplo = _uplo(UPLO, "linalg.eigh()")
    x = _matrix(input, "linalg.eigh()", square=True)
    w, v = _e.eigh(x, uplo)
    return _Eigh(*_parts(input, (w, v), _e.eigh_vjp, (w, v), (0, 1)))


def eigvalsh(input: Tensor, UPLO: str = "L") -> Tensor:  # noqa: A002, N803
    """Return the real eigenvalues of a Hermitian matrix, ascending."""
    return eigh(input, UPLO)[0]


def eig(input: Tensor) -> Any:  # noqa: A002, N803
    """Return ``(eigenvalues, eigenvectors)`` of a square matrix, complex always (columns of
    unit norm). The gradient needs a loss invariant to each eigenvector's phase.

    Raises:
        NotImplementedError: a CuPy tensor (CuPy has no general eigen-solver).
    """
    x = _matrix(input, "linalg.eig()", square=True)
    w, v = _e.eig(x)
    return _Eig(*_parts(input, (w, v), _e.eig_vjp, (w, v), (0, 1)))


def eigvals(input: Tensor) -> Tensor:  # noqa: A002, N803
    """Return the (complex) eigenvalues of a square matrix."""
    return eig(input)[0]


# --------------------------------------------------------------------------------------------
# LU


def _lu_pivot(pivot: bool, what: str) -> None:
    if not pivot:
        raise NotImplementedError(f"{what}: LU without pivoting exists only on CUDA in torch "
                                  f"and is not implemented; use pivot=True")


def lu_factor_ex(A: Tensor, *, pivot: bool = True, check_errors: bool = False) -> Any:  # noqa: N803
    """Return ``(LU, pivots, info)``: L (unit diagonal, not stored) and U packed in one
    matrix, 1-based int32 row swaps, and ``info`` (0, or the 1-based index of the first zero
    on U's diagonal; a singular matrix still factors).

    Raises:
        LinAlgError: ``check_errors`` and some ``info`` is not 0.
    """
    _lu_pivot(pivot, "linalg.lu_factor_ex()")
    packed, piv, info = _leg.lu(A, True, True)
    if check_errors:
        _raise_info(info._data, "linalg.lu_factor_ex", _SINGULAR, A.dim() > 2)
    return _LuFactorEx(packed, piv, info)


def lu_factor(A: Tensor, *, pivot: bool = True) -> Any:  # noqa: N803
    """Return ``(LU, pivots)`` of :func:`lu_factor_ex` (a singular matrix is factored too:
    :func:`lu_solve` with it gives infinities or NaN)."""
    _lu_pivot(pivot, "linalg.lu_factor()")
    packed, piv = _leg.lu(A, True, False)
    return _LuFactor(packed, piv)


def lu(A: Tensor, *, pivot: bool = True) -> Any:  # noqa: N803
    """Return ``(P, L, U)`` with ``A = P L U`` (``L`` unit lower, ``U`` upper)."""
    _lu_pivot(pivot, "linalg.lu()")
    packed, piv = _leg.lu(A, True, False)
    return _Lu(*_leg.lu_unpack(packed, piv))


def lu_solve(LU: Tensor, pivots: Tensor, B: Tensor, *, left: bool = True,  # noqa: N803
             adjoint: bool = False) -> Tensor:
    """Return ``X`` with ``A X = B`` for ``A`` given by :func:`lu_factor` (``A^H X = B``
    where ``adjoint``; ``X A = B`` or ``X A^H = B`` where not ``left``)."""
    check_batches("linalg.lu_solve()", LU, B, ("LU", "B"))
    if not left:
        # X op(A) = B  <=>  op(A)^H X^H = B^H
        return lu_solve(LU, pivots, B.mH, left=True, adjoint=not adjoint).mH
    if not adjoint:
        return _leg.lu_solve(B, LU, pivots)
    perm, low, up = _leg.lu_unpack(LU, pivots)
    # A^H = U^H L^H P^T, so X = P L^-H U^-H B
    y = _leg.triangular_solve(B, up.mH, upper=False)[0]
    y = _leg.triangular_solve(y, low.mH, upper=True, unitriangular=True)[0]
    return perm @ y


def householder_product(input: Tensor, tau: Tensor) -> Tensor:  # noqa: A002, N803
    """Return the first ``n`` columns of ``H_1 ... H_k``, ``H_i = I - tau_i v_i v_i^H`` with
    the Householder vectors ``v_i`` below the diagonal of ``A`` (:func:`mpitensor.orgqr`)."""
    return _leg.orgqr(input, tau)


def matrix_exp(input: Tensor) -> Tensor:  # noqa: A002, N803
    """Return the matrix exponential of each square matrix."""
    return _leg.matrix_exp(input)


# --------------------------------------------------------------------------------------------
# LDL^T (Bunch-Kaufman)

_LdlFactorEx = _result("linalg_ldl_factor_ex", ["LD", "pivots", "info"])
_LdlFactor = _result("linalg_ldl_factor", ["LD", "pivots"])


def _no_ldl_grad(x: Any, state: Any, i: int, g: Any) -> Any:
    raise RuntimeError("linalg.ldl_factor/ldl_solve: their derivatives are not implemented "
                       "(as in torch); use linalg.solve or cholesky for a differentiable "
                       "solve")


def ldl_factor_ex(input: Tensor, *, hermitian: bool = False, check_errors: bool = False) -> Any:  # noqa: A002, N803
    """Return ``(LD, pivots, info)``: the compact LDL^T factorization of a symmetric matrix
    (LDL^H of a Hermitian one where ``hermitian``; lower triangle read) with Bunch-Kaufman
    pivoting, as LAPACK's sytrf (hetrf); ``info`` is 0 or the 1-based index of a zero
    diagonal block (the matrix is singular).

    Raises:
        LinAlgError: ``check_errors`` and some ``info`` is not 0.
    """
    x = _matrix(input, "linalg.ldl_factor_ex()", square=True)
    ld, piv, info = _ldl.ldl_factor(x, bool(hermitian))
    if check_errors:
        _raise_info(info, "linalg.ldl_factor_ex", "the diagonal block {} of D is zero: the "
                    "matrix is singular", x.ndim > 2)
    return _LdlFactorEx(_parts(input, (ld,), _no_ldl_grad, None, (0,))[0], wrap(piv), wrap(info))


def ldl_factor(input: Tensor, *, hermitian: bool = False) -> Any:  # noqa: A002, N803
    """Return ``(LD, pivots)`` of :func:`ldl_factor_ex`.

    Raises:
        LinAlgError: a matrix is singular.
    """
    ld, piv, _ = ldl_factor_ex(input, hermitian=hermitian, check_errors=True)
    return _LdlFactor(ld, piv)


def ldl_solve(LD: Tensor, pivots: Tensor, B: Tensor, *, hermitian: bool = False) -> Tensor:  # noqa: N803
    """Return ``X`` with ``A X = B`` for ``A`` given by :func:`ldl_factor`'s ``(LD,
    pivots)`` (``hermitian`` as given to it); batches broadcast."""
    x = _matrix(LD, "linalg.ldl_solve()", square=True)
    b = _matrix(B, "linalg.ldl_solve()")
    check_batches("linalg.ldl_solve()", LD, B, ("LD", "B"))
    if b.shape[-2] != x.shape[-1]:
        raise ValueError(f"linalg.ldl_solve(): B must have {x.shape[-1]} rows, got shape "
                         f"{list(b.shape)}")
    out = _ldl.ldl_solve(x, pivots._data, b, bool(hermitian))
    for t in (B, LD):
        if t._requires_grad and _grad_mode.enabled:
            return _parts(t, (out,), _no_ldl_grad, None, (0,))[0]
    return wrap(out)
