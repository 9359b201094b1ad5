"""torch's linear-algebra functions outside ``torch.linalg`` (``torch.qr``, ``torch.svd``,
``torch.cholesky``, ``torch.lu``, ``torch.triangular_solve``, ...) and their Tensor methods,
with torch's conventions where they differ from ``torch.linalg``'s (``torch.svd`` returns
``V``, not ``Vh``; ``torch.cholesky(upper=...)``; ``torch.lu`` returns 1-based int32 pivots),
and the special functions torch keeps at its top level (``i0``, ``igamma``, ``igammac``,
``polygamma``, ``mvlgamma``). ``mpitensor/__init__.py`` exports :data:`__all__`.

Every function is differentiable where torch's is: the factorizations through
``mpitensor._ops.factorizations`` (one recorded op per output), the solves through
``mpitensor._ops.legacy_solves``, ``matrix_exp`` through ``mpitensor._ops.matrix_exp``, and
``lu_solve``, ``orgqr``, ``ormqr``, ``svd_lowrank`` and ``pca_lowrank`` as compositions of
recorded ops. ``geqrf``, as torch's, has no gradient. torch's names that only raise in torch
(``torch.solve``, ``torch.eig``, ``torch.symeig``, ``torch.lstsq``) are not provided.

Example:
    >>> import mpitensor as torch
    >>> A = torch.tensor([[4.0, 2.0], [2.0, 3.0]], dtype=torch.float64)
    >>> L = torch.cholesky(A)
    >>> torch.cholesky_solve(torch.ones(2, 1, dtype=torch.float64), L).flatten()
    tensor([0.1250, 0.2500], dtype=mpitensor.float64)
"""

from __future__ import annotations

import operator
from collections import namedtuple
from typing import Any, Optional

from mpitensor import autograd as _autograd
from mpitensor import dtypes as _dt
from mpitensor import special as _special
from mpitensor._core.devices import xp
from mpitensor._core.opkit import NO_RECORD, Tensor, assign_result, run, tensor_methods, wrap
from mpitensor._ops import factorizations as _f
from mpitensor._ops.legacy_solves import CholeskyInverse, CholeskySolve, Pinv, TriangularSolve
from mpitensor._ops.matrix_exp import MatrixExp
from mpitensor._ops.random import randn

__all__ = [
    "qr", "svd", "cholesky", "cholesky_solve", "cholesky_inverse", "lu", "lu_solve",
    "lu_unpack", "triangular_solve", "pinverse", "matrix_exp", "chain_matmul", "geqrf", "orgqr",
    "ormqr", "svd_lowrank", "pca_lowrank", "i0", "igamma", "igammac", "polygamma", "mvlgamma",
]

_grad_mode = _autograd._mode


def _fields_repr(self: Any) -> str:
    body = ",\n".join(f"{k}={v!r}" for k, v in zip(self._fields, self))
    return f"mpitensor.return_types.{type(self).__name__}(\n{body})"


def _result(name: str, fields: list) -> type:
    t = namedtuple(name, fields)  # noqa: PYI024 - torch.return_types are plain named tuples
    t.__repr__ = _fields_repr
    return t


_QR = _result("qr", ["Q", "R"])
_SVD = _result("svd", ["U", "S", "V"])
_TriangularSolve = _result("triangular_solve", ["solution", "cloned_coefficient"])
_Geqrf = _result("geqrf", ["a", "tau"])
_LuUnpack = _result("lu_unpack", ["P", "L", "U"])
_LuWithInfo = _result("_lu_with_info", ["LU", "pivots", "info"])


def _matrix(t: Any, what: str, square: bool = False) -> Any:
    """``t``'s array after checking that it is a (square) float or complex matrix batch."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: expected a Tensor, got {type(t).__name__}")
    _f.check_matrix(t._data, what, square)
    return t._data


def _same_dtype(what: str, *ts: Tensor) -> None:
    dts = {t._data.dtype for t in ts}
    if len(dts) > 1:
        names = ", ".join(_dt.dt_repr(t._data.dtype) for t in ts)
        raise TypeError(f"{what}: expected the tensors to have one dtype, got {names}")


def _recorded(*ts: Tensor) -> bool:
    return _grad_mode.enabled and any(t._requires_grad for t in ts)


def _call(fn: Any, tensors: tuple, *args: Any) -> Tensor:
    """Op ``fn`` on the tensors then plain ``args``, recorded where a tensor requires grad."""
    if _recorded(*tensors):
        return fn.apply(*tensors, *args)
    return wrap(fn.forward(NO_RECORD, *(t._data for t in tensors), *args))


def _parts(t: Tensor, outs: tuple, vjp: Any, state: Any, diff: tuple) -> list:
    """Tensors of a factorization's outputs ``outs`` of ``t``; those numbered in ``diff`` are
    recorded (with ``vjp``) where ``t`` requires grad: those get copies, so that writing into
    an output in place leaves the factors the gradient reads as they were."""
    rec = _recorded(t)
    return [_f.Part.apply(t, o.copy(), i, vjp, state) if rec and i in diff else wrap(o)
            for i, o in enumerate(outs)]


# --------------------------------------------------------------------------------------------
# Factorizations


def qr(input: Tensor, some: bool = True) -> Any:  # noqa: A002 - torch's names
    """Return the QR factorization ``(Q, R)`` of a matrix (or of each in a batch):
    ``torch.linalg.qr(input, "reduced" if some else "complete")``.

    Raises:
        ValueError: fewer than 2 dimensions. TypeError: not float32/64 or complex.
    """
    x = _matrix(input, "qr()")
    q, r = _f.qr(x, not some)
    return _QR(*_parts(input, (q, r), _f.qr_vjp, (q, r, not some), (0, 1)))


def svd(input: Tensor, some: bool = True, compute_uv: bool = True) -> Any:  # noqa: A002
    """Return ``(U, S, V)`` with ``input = U diag(S) V^H`` (``V``, not ``V^H``); ``some=False``
    gives square ``U`` and ``V``; ``compute_uv=False`` gives zero-filled square ``U`` and ``V``
    (only ``S`` then has a gradient)."""
    x = _matrix(input, "svd()")
    u, s, v = _f.svd(x, not some and compute_uv)
    if compute_uv:
        return _SVD(*_parts(input, (u, s, v), _f.svd_vjp, (u, s, v), (0, 1, 2)))
    m = xp(x)
    rows, cols = x.shape[-2:]
    zu = m.zeros(x.shape[:-2] + (rows, rows), dtype=x.dtype)
    zv = m.zeros(x.shape[:-2] + (cols, cols), dtype=x.dtype)
    return _SVD(*_parts(input, (zu, s, zv), _f.svd_vjp, (u, s, v), (1,)))


def cholesky(input: Tensor, upper: bool = False) -> Tensor:  # noqa: A002
    """Return the Cholesky factor ``L`` (``A = L L^H``) of a Hermitian positive-definite
    matrix, or ``U = L^H`` where ``upper``; only the lower triangle of ``input`` is read.

    Raises:
        numpy.linalg.LinAlgError (``mpitensor.linalg.LinAlgError``): not positive-definite.
        ValueError: not square.
    """
    x = _matrix(input, "cholesky()", square=True)
    low = _f.cholesky(x)
    out = xp(x).ascontiguousarray(_f.mH(low)) if upper else low
    return _parts(input, (out,), _f.cholesky_vjp, (low, bool(upper)), (0,))[0]


def _two(b: Any, a: Any, what: str, names: tuple) -> None:
    _matrix(b, what)
    _matrix(a, what, square=True)
    if b._data.shape[-2] != a._data.shape[-1]:
        raise ValueError(f"{what}: {names[0]} has {b._data.shape[-2]} rows, {names[1]} is "
                         f"{a._data.shape[-1]} x {a._data.shape[-1]}")
    _same_dtype(what, b, a)


def cholesky_solve(input: Tensor, input2: Tensor, upper: bool = False) -> Tensor:  # noqa: A002
    """Return ``X`` with ``A X = input``, for ``A = L L^H`` given its Cholesky factor
    ``input2`` (``U^H U`` where ``upper``); batch dimensions broadcast."""
    _two(input, input2, "cholesky_solve()", ("input", "input2"))
    return _call(CholeskySolve, (input, input2), bool(upper))


def cholesky_inverse(input: Tensor, upper: bool = False) -> Tensor:  # noqa: A002
    """Return ``(L L^H)^-1`` for the Cholesky factor ``input`` (``(U^H U)^-1`` where
    ``upper``)."""
    _matrix(input, "cholesky_inverse()", square=True)
    return run(CholeskyInverse, input, bool(upper))


def lu(A: Tensor, pivot: bool = True, get_infos: bool = False) -> Any:  # noqa: N803
    """Return ``(LU, pivots)`` (``(LU, pivots, info)`` where ``get_infos``): L (unit diagonal,
    not stored) and U packed in one matrix, and the 1-based int32 row swaps of partial
    pivoting, so that ``A = P L U`` (see :func:`lu_unpack`); ``info`` is 0, or the 1-based
    index of the first zero on U's diagonal. A singular matrix raises no error.

    Raises:
        NotImplementedError: ``pivot=False`` (torch has it only on CUDA).
    """
    x = _matrix(A, "lu()")
    if not pivot:
        raise NotImplementedError("lu(pivot=False): LU without pivoting is not implemented; "
                                  "use pivot=True")
    packed, piv, infos = _f.lu_factor(x)
    out = _parts(A, (packed,), _f.lu_vjp, (packed, piv), (0,))[0]
    if get_infos:
        return _LuWithInfo(out, wrap(piv), wrap(infos))
    return out, wrap(piv)


def _pivots(piv: Any, what: str) -> Any:
    if not isinstance(piv, Tensor) or _dt.kind_of(piv._data.dtype) not in "iu":
        raise TypeError(f"{what}: LU_pivots must be an integer tensor (torch.lu's int32 "
                        f"pivots)")
    return piv._data


def lu_unpack(LU_data: Tensor, LU_pivots: Tensor, unpack_data: bool = True,  # noqa: N803
              unpack_pivots: bool = True) -> Any:
    """Return ``(P, L, U)`` from :func:`lu`'s output, with ``A = P @ L @ U``; what is not
    unpacked is an empty tensor. ``L`` and ``U`` are differentiable in ``LU_data``."""
    x = _matrix(LU_data, "lu_unpack()")
    piv = _pivots(LU_pivots, "lu_unpack()")
    m = xp(x)
    rows, cols = x.shape[-2:]
    k = min(rows, cols)
    empty = wrap(m.empty((0,), dtype=x.dtype))
    low = up = perm = empty
    if unpack_data:
        low = LU_data[..., :, :k].tril(-1) + wrap(m.eye(rows, k, dtype=x.dtype))
        up = LU_data[..., :k, :].triu()
    if unpack_pivots:
        perm = wrap(_f.permutation(piv, rows, x.dtype))
    return _LuUnpack(perm, low, up)


def lu_solve(input: Tensor, LU_data: Tensor, LU_pivots: Tensor) -> Tensor:  # noqa: A002, N803
    """Return ``X`` with ``A X = input``, for ``A`` given by :func:`lu`'s ``(LU_data,
    LU_pivots)`` (differentiable in ``input`` and ``LU_data``)."""
    _two(input, LU_data, "lu_solve()", ("input", "LU_data"))
    perm, low, up = lu_unpack(LU_data, LU_pivots)
    y = perm.mT @ input
    y = triangular_solve(y, low, upper=False, unitriangular=True)[0]
    return triangular_solve(y, up, upper=True)[0]


def triangular_solve(input: Tensor, A: Tensor, upper: bool = True,  # noqa: A002, N803
                     transpose: bool = False, unitriangular: bool = False) -> Any:
    """Return ``(solution, cloned_coefficient)``: ``X`` with ``op(A) X = input`` for the
    upper (or lower) triangle of ``A`` (its diagonal taken as ones where ``unitriangular``),
    ``op`` the transpose where ``transpose``, and a copy of ``A``; batches broadcast."""
    _two(input, A, "triangular_solve()", ("input", "A"))
    x = _call(TriangularSolve, (input, A), bool(upper), bool(transpose), bool(unitriangular))
    return _TriangularSolve(x, A.clone())


def pinverse(input: Tensor, rcond: float = 1e-15) -> Tensor:  # noqa: A002
    """Return the Moore-Penrose pseudo-inverse (singular values at most ``rcond`` times the
    largest are taken as zero)."""
    _matrix(input, "pinverse()")
    return run(Pinv, input, float(rcond))


def matrix_exp(input: Tensor) -> Tensor:  # noqa: A002
    """Return the matrix exponential of a square matrix (or of each in a batch)."""
    _matrix(input, "matrix_exp()", square=True)
    return run(MatrixExp, input)


def chain_matmul(*matrices: Tensor) -> Tensor:
    """Return the product of the 2-D ``matrices`` in order (``torch.linalg.multi_dot``).

    Raises:
        ValueError: no matrix, or one that is not 2-D.
    """
    if not matrices:
        raise ValueError("chain_matmul(): expected one matrix or more")
    for i, t in enumerate(matrices):
        if not isinstance(t, Tensor) or t._data.ndim != 2:
            raise ValueError(f"chain_matmul(): matrix {i} must be a 2-D tensor")
    if len(matrices) == 1:
        return matrices[0].clone()
    out = matrices[0]
    for t in matrices[1:]:
        out = out @ t
    return out


# --------------------------------------------------------------------------------------------
# Householder QR in LAPACK's compact form


def _geqrf_vjp(x: Any, state: Any, i: int, g: Any) -> Any:
    raise RuntimeError("geqrf(): its derivative is not implemented (as in torch); "
                       "differentiate torch.qr or torch.linalg.qr instead")


def geqrf(input: Tensor) -> Any:  # noqa: A002
    """Return ``(a, tau)``, LAPACK's geqrf: R on and above the diagonal of ``a``, the
    Householder vectors below it, and their scales ``tau`` (see :func:`orgqr`)."""
    x = _matrix(input, "geqrf()")
    a, tau = _f.geqrf(x)
    return _Geqrf(*_parts(input, (a, tau), _geqrf_vjp, None, (0, 1)))


def _reflectors(input: Tensor, tau: Tensor, what: str) -> tuple:
    """The Householder vectors (unit first entry) as the columns of a tensor, and ``k``."""
    x = _matrix(input, what)
    if not isinstance(tau, Tensor):
        raise TypeError(f"{what}: tau must be a Tensor, got {type(tau).__name__}")
    _same_dtype(what, input, tau)
    rows, cols = x.shape[-2:]
    k = tau._data.shape[-1] if tau._data.ndim else 0
    if tau._data.ndim != x.ndim - 1 or tau._data.shape[:-1] != x.shape[:-2] or k > cols:
        raise ValueError(f"{what}: tau must have shape {list(x.shape[:-2])} + [k] with k at "
                         f"most {cols}, got {list(tau._data.shape)}")
    eye = wrap(xp(x).eye(rows, k, dtype=x.dtype))
    return input[..., :, :k].tril(-1) + eye, k


def _reflect(c: Tensor, v: Tensor, t: Tensor, left: bool) -> Tensor:
    """``H c`` (``c H`` where not ``left``) for ``H = I - t v v^H``."""
    if left:
        return c - (v * t) @ (v.mH @ c)
    return c - (c @ v) @ (v.mH * t)


def orgqr(input: Tensor, input2: Tensor) -> Tensor:  # noqa: A002
    """Return the first ``n`` columns of ``H_1 ... H_k`` from :func:`geqrf`'s ``(a, tau)``
    (``torch.linalg.householder_product``), differentiable in both.

    Raises:
        ValueError: not ``rows >= cols >= k``.
    """
    v, k = _reflectors(input, input2, "orgqr()")
    rows, cols = input._data.shape[-2:]
    if rows < cols:
        raise ValueError(f"orgqr(): input must have at least as many rows as columns, got "
                         f"{rows} x {cols}")
    q = wrap(xp(input._data).eye(rows, cols, dtype=input._data.dtype))
    for i in reversed(range(k)):
        q = _reflect(q, v[..., :, i:i + 1], input2[..., i:i + 1, None], True)
    return q


def ormqr(input: Tensor, input2: Tensor, input3: Tensor, left: bool = True,  # noqa: A002
          transpose: bool = False) -> Tensor:
    """Return ``Q @ input3`` (``Q^H`` where ``transpose``; on the right where not ``left``)
    for the ``Q = H_1 ... H_k`` of :func:`geqrf`'s ``(a, tau)``, differentiable in all.

    Raises:
        ValueError: ``input3``'s size does not match ``Q``'s.
    """
    v, k = _reflectors(input, input2, "ormqr()")
    c = input3
    _matrix(c, "ormqr()")
    _same_dtype("ormqr()", input, c)
    rows = input._data.shape[-2]
    side = c._data.shape[-2] if left else c._data.shape[-1]
    if side != rows:
        raise ValueError(f"ormqr(): input3 must have {rows} {'rows' if left else 'columns'} "
                         f"(Q is {rows} x {rows}), got shape {list(c._data.shape)}")
    tau = input2.conj() if transpose and input2.is_complex() else input2
    order = range(k) if left == transpose else reversed(range(k))
    for i in order:
        c = _reflect(c, v[..., :, i:i + 1], tau[..., i:i + 1, None], left)
    return c


# --------------------------------------------------------------------------------------------
# Randomized low-rank SVD and PCA (Halko, Martinsson and Tropp, 2011)


def _range_basis(a: Tensor, q: int, niter: int) -> Tensor:
    """An orthonormal basis of the range of ``a`` (at most ``q`` columns), by random
    projection and ``niter`` subspace iterations."""
    d = a._data
    r = randn(*d.shape[:-2], d.shape[-1], q, dtype=a.dtype, device=a.device)
    basis = qr(a @ r)[0]
    for _ in range(niter):
        basis = qr(a.mH @ basis)[0]
        basis = qr(a @ basis)[0]
    return basis


def svd_lowrank(A: Tensor, q: Optional[int] = 6, niter: Optional[int] = 2,  # noqa: N803
                M: Optional[Tensor] = None) -> Any:  # noqa: N803
    """Return ``(U, S, V)``, an approximate SVD of rank ``q`` of ``A - M``, by the
    randomized method of Halko, Martinsson and Tropp (differentiable: recorded ops only).

    Raises:
        ValueError: ``q`` or ``niter`` negative.
    """
    _matrix(A, "svd_lowrank()")
    q = 6 if q is None else operator.index(q)
    niter = 2 if niter is None else operator.index(niter)
    if q < 0 or niter < 0:
        raise ValueError(f"svd_lowrank(): q and niter must be non-negative, got {q}, {niter}")
    a = A if M is None else A - M
    rows, cols = a._data.shape[-2:]
    if rows < cols:
        v, s, u = svd_lowrank(a.mH, q, niter)
        return u, s, v
    basis = _range_basis(a, q, niter)
    u, s, v = svd(basis.mH @ a)
    return basis @ u, s, v


def pca_lowrank(A: Tensor, q: Optional[int] = None, center: bool = True,  # noqa: N803
                niter: int = 2) -> Any:
    """Return ``(U, S, V)`` of :func:`svd_lowrank` of ``A`` with its column means removed
    (where ``center``): the principal directions are ``V``'s columns.

    Raises:
        ValueError: ``q`` outside ``[0, min(rows, cols)]``.
    """
    _matrix(A, "pca_lowrank()")
    rows, cols = A._data.shape[-2:]
    q = min(6, rows, cols) if q is None else operator.index(q)
    if not 0 <= q <= min(rows, cols):
        raise ValueError(f"pca_lowrank(): q must be between 0 and min(rows, cols) = "
                         f"{min(rows, cols)}, got {q}")
    if center:
        return svd_lowrank(A, q, niter, A.mean(-2, keepdim=True))
    return svd_lowrank(A, q, niter)


# --------------------------------------------------------------------------------------------
# Special functions at torch's top level


def i0(input: Tensor) -> Tensor:  # noqa: A002
    """Return the modified Bessel function of the first kind of order 0, element-wise."""
    return _special.i0(input)


def igamma(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Return the regularized lower incomplete gamma function ``P(input, other)``
    (``special.gammainc``; differentiable in ``other`` only, as torch)."""
    return _special.gammainc(input, other)


def igammac(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Return the regularized upper incomplete gamma function ``Q(input, other)``
    (``special.gammaincc``; differentiable in ``other`` only, as torch)."""
    return _special.gammaincc(input, other)


def polygamma(n: int, input: Tensor) -> Tensor:  # noqa: A002
    """Return the ``n``-th derivative of the digamma function, element-wise."""
    return _special.polygamma(n, input)


def mvlgamma(input: Tensor, p: int) -> Tensor:  # noqa: A002
    """Return the log of the multivariate gamma function of dimension ``p``
    (``special.multigammaln``)."""
    return _special.multigammaln(input, p)


# --------------------------------------------------------------------------------------------
# The Tensor methods


@tensor_methods
class _LegacyMethods:
    def qr(self, some: bool = True) -> Any:
        """:func:`mpitensor.qr` of this tensor."""
        return qr(self, some)

    def svd(self, some: bool = True, compute_uv: bool = True) -> Any:
        """:func:`mpitensor.svd` of this tensor."""
        return svd(self, some, compute_uv)

    def cholesky(self, upper: bool = False) -> Tensor:
        """:func:`mpitensor.cholesky` of this tensor."""
        return cholesky(self, upper)

    def cholesky_solve(self, input2: Tensor, upper: bool = False) -> Tensor:
        """:func:`mpitensor.cholesky_solve` with this tensor as the right-hand side."""
        return cholesky_solve(self, input2, upper)

    def cholesky_inverse(self, upper: bool = False) -> Tensor:
        """:func:`mpitensor.cholesky_inverse` of this Cholesky factor."""
        return cholesky_inverse(self, upper)

    def lu(self, pivot: bool = True, get_infos: bool = False) -> Any:
        """:func:`mpitensor.lu` of this tensor."""
        return lu(self, pivot, get_infos)

    def lu_solve(self, LU_data: Tensor, LU_pivots: Tensor) -> Tensor:  # noqa: N803
        """:func:`mpitensor.lu_solve` with this tensor as the right-hand side."""
        return lu_solve(self, LU_data, LU_pivots)

    def triangular_solve(self, A: Tensor, upper: bool = True, transpose: bool = False,  # noqa: N803
                         unitriangular: bool = False) -> Any:
        """:func:`mpitensor.triangular_solve` with this tensor as the right-hand side."""
        return triangular_solve(self, A, upper, transpose, unitriangular)

    def pinverse(self, rcond: float = 1e-15) -> Tensor:
        """:func:`mpitensor.pinverse` of this tensor."""
        return pinverse(self, rcond)

    def matrix_exp(self) -> Tensor:
        """:func:`mpitensor.matrix_exp` of this tensor."""
        return matrix_exp(self)

    def geqrf(self) -> Any:
        """:func:`mpitensor.geqrf` of this tensor."""
        return geqrf(self)

    def orgqr(self, input2: Tensor) -> Tensor:
        """:func:`mpitensor.orgqr` of this tensor and ``tau``."""
        return orgqr(self, input2)

    def ormqr(self, input2: Tensor, input3: Tensor, left: bool = True,
              transpose: bool = False) -> Tensor:
        """:func:`mpitensor.ormqr` of this tensor, ``tau`` and ``input3``."""
        return ormqr(self, input2, input3, left, transpose)

    def i0(self) -> Tensor:
        """:func:`mpitensor.i0` of this tensor."""
        return i0(self)

    def igamma(self, other: Any) -> Tensor:
        """:func:`mpitensor.igamma` of this tensor and ``other``."""
        return igamma(self, other)

    def igammac(self, other: Any) -> Tensor:
        """:func:`mpitensor.igammac` of this tensor and ``other``."""
        return igammac(self, other)

    def polygamma(self, n: int) -> Tensor:
        """:func:`mpitensor.polygamma` of order ``n`` of this tensor."""
        return polygamma(n, self)

    def mvlgamma(self, p: int) -> Tensor:
        """:func:`mpitensor.mvlgamma` of dimension ``p`` of this tensor."""
        return mvlgamma(self, p)

    def i0_(self) -> Tensor:
        """:meth:`i0` in place; returns self."""
        return assign_result(self, i0(self), "i0_()")

    def igamma_(self, other: Any) -> Tensor:
        """:meth:`igamma` in place; returns self."""
        return assign_result(self, igamma(self, other), "igamma_()")

    def igammac_(self, other: Any) -> Tensor:
        """:meth:`igammac` in place; returns self."""
        return assign_result(self, igammac(self, other), "igammac_()")

    def polygamma_(self, n: int) -> Tensor:
        """:meth:`polygamma` in place; returns self."""
        return assign_result(self, polygamma(n, self), "polygamma_()")

    def mvlgamma_(self, p: int) -> Tensor:
        """:meth:`mvlgamma` in place; returns self."""
        return assign_result(self, mvlgamma(self, p), "mvlgamma_()")
