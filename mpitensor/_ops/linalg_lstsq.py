"""Least squares, pseudo-inverses, ranks, condition numbers and the tensor solves of
``torch.linalg``: ``lstsq``, ``pinv``, ``matrix_rank``, ``cond``, ``tensorinv``,
``tensorsolve`` and ``vander``, as compositions of recorded ops (the pseudo-inverse is
:class:`mpitensor._ops.legacy_solves.Pinv`, whose gradient is Golub and Pereyra's), so they
are differentiable where torch's are. :mod:`mpitensor.linalg` exports them.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from mpitensor._core.devices import xp
from mpitensor._core.opkit import Tensor, run, wrap
from mpitensor._ops.combine import stack
from mpitensor._ops.factorizations import mH
from mpitensor._ops.legacy_solves import Pinv
from mpitensor._ops.linalg import solve
from mpitensor._ops.linalg_legacy import _matrix, _result
from mpitensor._ops.linalg_more import _singular_safe, check_batches, eigvalsh, svdvals
from mpitensor._ops.norms import matrix_norm

__all__ = ["lstsq", "pinv", "matrix_rank", "cond", "tensorinv", "tensorsolve", "vander"]

_Lstsq = _result("linalg_lstsq", ["solution", "residuals", "rank", "singular_values"])
_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _eps(x: Any) -> float:
    return float(np.finfo(x.dtype).eps)


def _tol(v: Any, m: Any) -> Any:
    """A tolerance (a number, or a tensor broadcasting against the batch) as an array."""
    if v is None:
        return None
    return v._data if isinstance(v, Tensor) else m.asarray(float(v))


def _threshold(x: Any, smax: Any, atol: Any, rtol: Any) -> Any:
    """torch's cut-off: max(atol, rtol * smax), rtol defaulting to eps * max(m, n) unless a
    positive atol is given alone."""
    m = xp(x)
    at, rt = _tol(atol, m), _tol(rtol, m)
    if rt is None:
        positive_atol = at is not None and bool((at > 0).all())
        rt = m.asarray(0.0 if positive_atol else _eps(x) * max(x.shape[-2:]))
    at = m.asarray(0.0) if at is None else at
    return m.maximum(at, rt * smax)


def _hermitian_of_lower(a: Any) -> Any:
    """The Hermitian matrix of ``a``'s lower triangle (its diagonal's real part)."""
    m = xp(a)
    low = m.tril(a, -1)
    diag = m.diagonal(a, 0, -2, -1).real.astype(a.dtype)
    return low + mH(low) + m.eye(a.shape[-1], dtype=a.dtype) * diag[..., None, :]


class _PinvHermitian(Pinv):
    """``pinv`` of the Hermitian matrix of the lower triangle; the gradient is
    :class:`Pinv`'s formula with the input as given, as torch's."""

    @staticmethod
    def forward(ctx: Any, a: Any, rcond: Any) -> Any:
        p = Pinv.forward(ctx, _hermitian_of_lower(a), rcond)
        ctx.save_for_backward(a, p)
        return p


def _singular_values(A: Tensor, hermitian: bool) -> Tensor:  # noqa: N803
    if hermitian:
        return eigvalsh(A).abs().sort(-1, descending=True)[0]
    return svdvals(A)


def pinv(input: Tensor, rcond: Any = None, hermitian: bool = False, *, atol: Any = None,  # noqa: A002, N803
         rtol: Any = None) -> Tensor:
    """Return the Moore-Penrose pseudo-inverse: singular values at most
    ``max(atol, rtol * largest)`` are taken as zero (``rtol`` defaults to
    ``eps * max(m, n)`` unless a positive ``atol`` is given alone). ``hermitian``: ``A`` is
    Hermitian and only its lower triangle is read (the gradient, as torch's, is the
    pseudo-inverse's formula with ``A`` as given). ``rcond`` (torch's older form, by position
    too) is ``rtol``.

    Raises:
        TypeError: ``rcond`` given with ``atol`` or ``rtol``.
    """
    x = _matrix(input, "linalg.pinv()")
    if rcond is not None:
        if atol is not None or rtol is not None:
            raise TypeError("linalg.pinv(): give rcond (the older form) or atol/rtol, not "
                            "both")
        rtol = rcond
    m = xp(x)
    op = _PinvHermitian if hermitian else Pinv
    if x.shape[-1] == 0 or x.shape[-2] == 0:
        return run(Pinv, input, 0.0)
    s = m.linalg.svd(_hermitian_of_lower(x) if hermitian else x, compute_uv=False)
    smax = s[..., :1]
    thr = _threshold(x, smax, _unsqueeze(atol), _unsqueeze(rtol))
    rcond = m.where(smax > 0, thr / m.where(smax > 0, smax, 1), 0).astype(s.dtype)
    return run(op, input, rcond)


def _unsqueeze(v: Any) -> Any:
    """A batch-shaped tolerance tensor with a trailing 1, to meet ``(*, 1)`` arrays."""
    return v.unsqueeze(-1) if isinstance(v, Tensor) and v.dim() else v


def matrix_rank(input: Tensor, tol: Any = None, hermitian: bool = False, *,  # noqa: A002, N803
                atol: Any = None, rtol: Any = None) -> Tensor:
    """Return the number of singular values above ``max(atol, rtol * largest)`` (int64);
    ``tol`` (torch's older form) is ``atol`` with ``rtol = 0``; ``hermitian`` reads the
    lower triangle and uses the eigenvalues' magnitudes."""
    x = _matrix(input, "linalg.matrix_rank()")
    if tol is not None:
        atol, rtol = tol, 0.0
    s = _singular_values(input.detach(), hermitian)._data
    m = xp(x)
    if s.shape[-1] == 0:
        return wrap(m.zeros(x.shape[:-2], dtype=m.int64))
    thr = _threshold(x, s[..., 0], atol, rtol)
    return wrap((s > thr[..., None]).sum(axis=-1).astype(m.int64))


def cond(input: Tensor, p: Any = None) -> Tensor:  # noqa: A002, N803
    """Return the condition number in the norm ``p``: None or 2 (largest over smallest
    singular value), -2 (the reverse), or 'fro', 'nuc', inf, -inf, 1, -1 (``||A|| ||A^-1||``,
    square matrices only; a singular one gives inf).

    Raises:
        ValueError: an unknown ``p``, or a non-square matrix for a ``p`` that needs one.
    """
    x = _matrix(input, "linalg.cond()")
    if p is None or p in (2, -2):
        s = svdvals(input)
        if s.shape[-1] == 0:
            return s.sum(-1)
        top, bottom = s[..., 0], s[..., -1]
        return bottom / top if p == -2 else top / bottom
    if p not in ("fro", "nuc", math.inf, -math.inf, 1, -1):
        raise ValueError(f"linalg.cond(): p must be None, 2, -2, 'fro', 'nuc', inf, -inf, 1 "
                         f"or -1, got {p!r}")
    # the singular matrices are replaced by the identity, and their results by inf
    safe, bad, _ = _singular_safe(input, "linalg.cond()")
    out = matrix_norm(input, p) * matrix_norm(safe.inverse(), p)
    if bool(bad.any()):
        out = out.where(wrap(~bad), wrap(xp(x).asarray(np.inf, dtype=out._data.dtype)))
    return out


def lstsq(input: Tensor, b: Tensor, rcond: Optional[float] = None, *,  # noqa: A002, N803
          driver: Optional[str] = None) -> Any:
    """Return ``(solution, residuals, rank, singular_values)`` of ``min ||A X - B||``: the
    minimum-norm solution, singular values at most ``rcond`` times the largest taken as zero
    (``rcond`` defaults to ``eps * max(m, n)``). As torch's CPU drivers: ``rank`` for
    'gelsy' (the default), 'gelsd', 'gelss'; ``singular_values`` for 'gelsd', 'gelss';
    ``residuals`` (squared, per column) for every driver but 'gelsy' when m > n and every
    matrix has full rank; what is not computed is empty. A ``B`` with one dimension fewer
    than ``A`` is a (batch of) vector(s).

    Raises:
        ValueError: an unknown driver, or ``B``'s rows do not match ``A``'s.
    """
    driver = "gelsy" if driver is None else driver
    if driver not in _DRIVERS:
        raise ValueError(f"linalg.lstsq(): driver must be one of {', '.join(_DRIVERS)} on "
                         f"the CPU, got {driver!r}")
    x = _matrix(input, "linalg.lstsq()")
    vector = b.dim() == input.dim() - 1
    check_batches("linalg.lstsq()", input, b, ("input", "b"), vector)
    b = b.unsqueeze(-1) if vector else b
    rows, cols = x.shape[-2:]
    if b.dim() < 2 or b.shape[-2] != rows:
        raise ValueError(f"linalg.lstsq(): b must have {rows} rows (as input), got shape "
                         f"{list(b.shape)}")
    m = xp(x)
    rc = _eps(x) * max(rows, cols) if rcond is None or rcond < 0 else float(rcond)
    s = m.linalg.svd(x, compute_uv=False)
    if driver == "gels":
        rc = 0.0
    sol = run(Pinv, input, rc) @ b
    rank = (s > rc * s[..., :1]).sum(axis=-1) if s.shape[-1] else m.zeros(x.shape[:-2])
    real = s.dtype
    empty = wrap(m.empty((0,), dtype=real))
    res = empty
    if driver != "gelsy" and rows > cols and (driver == "gels" or bool((rank == cols).all())):
        res = ((input @ sol - b).abs() ** 2).sum(-2)
        res = res.squeeze(-1) if vector else res
    rank_t = wrap(m.empty((0,), dtype=m.int64)) if driver == "gels" else wrap(
        m.asarray(rank).astype(m.int64))
    sv = wrap(s) if driver in ("gelsd", "gelss") else empty
    return _Lstsq(sol.squeeze(-1) if vector else sol, res, rank_t, sv)


def tensorinv(input: Tensor, ind: int = 2) -> Tensor:  # noqa: A002, N803
    """Return the tensor ``X`` with ``tensordot(X, A, ind)`` the identity: the inverse of
    ``A`` seen as a matrix of ``prod(shape[:ind])`` rows, reshaped to
    ``shape[ind:] + shape[:ind]``.

    Raises:
        ValueError: ``ind`` not positive, or the two products differ.
    """
    if ind <= 0:
        raise ValueError(f"linalg.tensorinv(): ind must be a positive integer, got {ind}")
    head, tail = tuple(input.shape[:ind]), tuple(input.shape[ind:])
    rows, cols = math.prod(head), math.prod(tail)
    if rows != cols:
        raise ValueError(f"linalg.tensorinv(): the product of the first {ind} dimensions "
                         f"({rows}) must equal that of the rest ({cols})")
    return input.reshape(rows, cols).inverse().reshape(tail + head)


def tensorsolve(input: Tensor, other: Tensor, dims: Any = None) -> Tensor:  # noqa: A002, N803
    """Return ``X`` with ``tensordot(A, X, X.ndim) = B``; ``dims`` are dimensions of ``A``
    moved to its end first.

    Raises:
        ValueError: ``A``'s leading dimensions are not ``B``'s shape, or the rest does not
            make a square system.
    """
    if dims is not None:
        dims = [d % input.dim() for d in dims]
        keep = [d for d in range(input.dim()) if d not in dims]
        input = input.permute(*keep, *dims)  # noqa: A001
    bshape = tuple(other.shape)
    if tuple(input.shape[:other.dim()]) != bshape:
        raise ValueError(f"linalg.tensorsolve(): input's leading dimensions "
                         f"{list(input.shape)} must be other's shape {list(bshape)}")
    xshape = tuple(input.shape[other.dim():])
    n = math.prod(bshape)
    if math.prod(xshape) != n:
        raise ValueError(f"linalg.tensorsolve(): input's trailing dimensions {list(xshape)} "
                         f"must hold as many elements as other ({n})")
    return solve(input.reshape(n, n), other.reshape(n)).reshape(xshape)


def vander(x: Tensor, *, N: Optional[int] = None) -> Tensor:  # noqa: N803
    """Return the Vandermonde matrix of the last dimension of ``x``: columns
    ``x^0, x^1, ..., x^(N-1)`` (increasing powers; ``N`` defaults to ``x.shape[-1]``).

    Raises:
        ValueError: ``x`` is 0-D, or ``N`` is at most 1.
    """
    if x.dim() == 0:
        raise ValueError("linalg.vander(): x must have at least one dimension")
    n = x.shape[-1] if N is None else int(N)
    if n <= 1:
        raise ValueError(f"linalg.vander(): N must be greater than 1, got {n}")
    # repeated products, not cumprod: each power is one recorded multiplication
    ones = wrap(xp(x._data).ones(tuple(x.shape), dtype=x._data.dtype))
    cols = [ones, x]
    for _ in range(n - 2):
        cols.append(cols[-1] * x)
    return stack(cols, -1)
