"""Matrix factorizations on arrays and their gradients: Cholesky, QR, SVD, LU with partial
pivoting and Householder QR in LAPACK's compact form (``geqrf``).

A factorization is computed once; each of its outputs is then recorded as its own op of the
input (:class:`Part`), whose backward is the factorization's vector-Jacobian product with the
other outputs' gradients taken as zero. The product is linear in the outputs' gradients, so
autograd's sum over the outputs is the whole gradient. The formulas (derived in the comments)
hold for real and complex inputs, with ``g`` the conjugate Wirtinger gradient as elsewhere in
mpitensor.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core.devices import xp
from mpitensor.autograd import ArrayFunction as Function

__all__ = [
    "Part", "mH", "tri_solve", "cholesky", "cholesky_vjp", "qr", "qr_vjp", "svd", "svd_vjp",
    "lu_factor", "lu_vjp", "permutation", "geqrf",
]


def mH(a: Any) -> Any:  # noqa: N802 - the conjugate transpose, named as torch's Tensor.mH
    a = a.swapaxes(-1, -2)
    return a.conj() if a.dtype.kind == "c" else a


def check_matrix(x: Any, what: str, square: bool = False) -> None:
    """Raise unless ``x`` is a (batch of) float or complex matrices (square ones if asked)."""
    if x.ndim < 2:
        raise ValueError(f"{what}: the input must have at least 2 dimensions, got {x.ndim}")
    if square and x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{what}: expected a square matrix or a batch of them, got shape "
                         f"{list(x.shape)}")
    if _dt.kind_of(x.dtype) not in "fc" or x.dtype.itemsize < 4 or (
            x.dtype.kind == "V"):
        raise TypeError(f"{what}: expected a float32, float64, complex64 or complex128 "
                        f"tensor, got {_dt.dt_repr(x.dtype)}")


class Part(Function):
    """Output ``i`` (the array ``out``) of a factorization of ``x``, computed beforehand;
    its gradient for ``x`` is ``vjp(x, state, i, g)``."""

    @staticmethod
    def forward(ctx: Any, x: Any, out: Any, i: int, vjp: Callable, state: Any) -> Any:
        ctx.meta = (i, vjp, state, x.shape, x.dtype)
        ctx.save_for_backward(x)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        i, vjp, state, shape, dtype = ctx.meta
        (x,) = ctx.saved_tensors
        gx = vjp(x, state, i, g)
        if gx.dtype.kind == "c" and np.dtype(dtype).kind != "c":
            gx = gx.real
        return gx.astype(dtype, copy=False), None, None, None, None


def _eye_like(m: Any, a: Any, n: int) -> Any:
    return m.eye(n, dtype=a.dtype)


def tri_solve(t: Any, b: Any, upper: bool, unit: bool = False) -> Any:
    """``t^-1 b`` for the triangle of ``t`` named by ``upper`` (its diagonal taken as ones
    where ``unit``); the other triangle is not read."""
    m = xp(t)
    tri = m.triu(t) if upper else m.tril(t)
    if unit:
        n = t.shape[-1]
        eye = m.eye(n, dtype=bool)
        tri = m.where(eye, m.asarray(1, dtype=t.dtype), tri)
    return m.linalg.solve(tri, b)


def _opt(g: Optional[Any], like: Any) -> Any:
    return xp(like).zeros_like(like) if g is None else g


# --------------------------------------------------------------------------------------------
# Cholesky


def cholesky(a: Any) -> Any:
    """The lower Cholesky factor of each Hermitian positive-definite matrix of ``a``.

    Raises:
        numpy.linalg.LinAlgError: a matrix is not positive-definite (the message names the
            first failing matrix of the batch).
    """
    m = xp(a)
    try:
        low = m.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        low = None
    if low is not None and (m is np or not bool(m.isnan(low).any())):
        return low
    # NumPy raised, or CuPy (which fills a failed factor with NaN instead of raising): find
    # the first matrix that is not positive-definite
    flat = a.reshape((int(np.prod(a.shape[:-2])),) + a.shape[-2:])
    for i in range(flat.shape[0]):
        try:
            bad = bool(m.isnan(m.linalg.cholesky(flat[i])).any()) and not bool(
                m.isnan(flat[i]).any())
        except np.linalg.LinAlgError:
            bad = True
        if bad:
            where = f" (batch element {i})" if a.ndim > 2 else ""
            raise np.linalg.LinAlgError(
                f"cholesky: the input is not positive-definite{where}; check that the matrix "
                f"is symmetric (Hermitian) with positive eigenvalues, or add a multiple of "
                f"the identity")
    return low


def cholesky_vjp(a: Any, state: Any, i: int, g: Any) -> Any:
    """A = L L^H. dA = dL L^H + L dL^H, so L^-1 dA L^-H = X + X^H with X = L^-1 dL lower
    triangular: dL = L (tril(Y, -1) + diag(Y) / 2), Y = L^-1 dA L^-H. With M = tril(L^H gL),
    gA = L^-H S L^-1 for S the Hermitian part (M + tril(M, -1)^H) / 2, as torch."""
    low, upper = state
    m = xp(g)
    gl = mH(g) if upper else g
    big = m.tril(mH(low) @ gl)
    sym = 0.5 * (big + mH(m.tril(big, -1)))
    inner = tri_solve(mH(low), sym, upper=True)            # L^-H S
    return mH(tri_solve(mH(low), mH(inner), upper=True))   # (L^-H (L^-H S)^H)^H = L^-H S L^-1


# --------------------------------------------------------------------------------------------
# QR


def qr(a: Any, complete: bool) -> tuple:
    """``(Q, R)`` of each matrix of ``a`` (LAPACK's signs: those of ``numpy.linalg.qr``)."""
    q, r = xp(a).linalg.qr(a, mode="complete" if complete else "reduced")
    return q, r


def _qr_square_vjp(q: Any, r: Any, gq: Any, gr: Any) -> Any:
    """A = QR with Q m x n orthonormal and R n x n (m >= n). Q^H dA R^-1 = C + dR R^-1 with
    C = Q^H dQ skew-Hermitian, so C's strict lower triangle is Y's, Y = Q^H dA R^-1; carrying
    the loss through C and dR gives gA = (gQ + Q herm(M)) R^-H, M = gR R^H - Q^H gQ and
    herm(M) the Hermitian matrix with M's upper triangle (a real diagonal)."""
    m = xp(gq)
    big = gr @ mH(r) - mH(q) @ gq
    up = m.triu(big, 1)
    d = m.diagonal(big, 0, -2, -1).real
    herm = up + mH(up) + d[..., None] * _eye_like(m, big, big.shape[-1])
    b = gq + q @ herm
    return mH(tri_solve(r, mH(b), upper=True))   # b R^-H = (R^-1 b^H)^H


def qr_vjp(a: Any, state: Any, i: int, g: Any) -> Any:
    """The gradient of ``(Q, R) = qr(A)`` for one output's gradient. A wide A = [X | Y] has
    Q R1 = X and R2 = Q^H Y, so gY = Q gR2 and X's Q gets Y gR2^H more."""
    q, r, complete = state
    rows, cols = a.shape[-2:]
    if complete and rows > cols:
        raise RuntimeError("qr(some=False): the gradient is not defined when the matrix has "
                           "more rows than columns (the completed Q is not unique); use "
                           "some=True")
    gq = g if i == 0 else None
    gr = g if i == 1 else None
    if rows >= cols:
        return _qr_square_vjp(q, r, _opt(gq, q), _opt(gr, r))
    m = xp(g)
    gr = _opt(gr, r)
    gq = _opt(gq, q) + a[..., rows:] @ mH(gr[..., rows:])
    gx = _qr_square_vjp(q, r[..., :rows], gq, gr[..., :rows])
    return m.concatenate([gx, q @ gr[..., rows:]], axis=-1)


# --------------------------------------------------------------------------------------------
# SVD


def svd(a: Any, full: bool) -> tuple:
    """``(U, S, V)`` of each matrix of ``a`` (V, not V^H)."""
    u, s, vh = xp(a).linalg.svd(a, full_matrices=full)
    return u, s, mH(vh)


def svd_vjp(a: Any, state: Any, i: int, g: Any) -> Any:
    """A = U S V^H, k singular values. With dP = U^H dA V, ωU = U^H dU and ωV = V^H dV
    (skew-Hermitian): dP = ωU S + dS - S ωV, so dS = Re diag(dP) and, off the diagonal,
    ωU_ij (s_j^2 - s_i^2) = dP_ij s_j + conj(dP_ji) s_i (ωV alike with s_i, s_j swapped). The
    phases are fixed by ωV's diagonal being 0 (ωU_ii = i Im(dP_ii) / s_i). A tall U (or a wide
    V) adds (I - U U^H) gU S^-1 V^H (or U S^-1 gV^H (I - V V^H))."""
    u, s, v = state[:3]
    m = xp(g)
    k = s.shape[-1]
    u, v = u[..., :k], v[..., :k]
    eye = _eye_like(m, s, k).astype(bool)
    e = s[..., None, :] ** 2 - s[..., :, None] ** 2
    e = m.where(eye, 1, e)
    vh = mH(v)
    if i == 1:
        return (u * g[..., None, :]) @ vh
    g = g[..., :k]
    if i == 0:
        j = mH(u) @ g
        inner = m.where(eye, 0, (j - mH(j)) / e) * s[..., None, :]
        if j.dtype.kind == "c":
            inner = inner + m.where(eye, 1j * j.imag / s[..., None, :], 0)
        out = u @ inner @ vh
        if u.shape[-2] > k:
            out = out + ((g - u @ j) / s[..., None, :]) @ vh
        return out
    j = mH(v) @ g
    inner = s[..., :, None] * m.where(eye, 0, (j - mH(j)) / e)
    out = u @ inner @ vh
    if v.shape[-2] > k:
        out = out + (u / s[..., None, :]) @ mH(g - v @ j)
    return out


# --------------------------------------------------------------------------------------------
# LU with partial pivoting


def _magnitude(m: Any, x: Any) -> Any:
    # LAPACK's i?amax: |re| + |im| for complex numbers
    return m.abs(x.real) + m.abs(x.imag) if x.dtype.kind == "c" else m.abs(x)


def lu_factor(a: Any) -> tuple:
    """``(LU, pivots, infos)`` of each matrix of ``a`` by Gaussian elimination with partial
    pivoting (the row of largest magnitude, the first of equals, as LAPACK's getrf): LU packs
    L (unit diagonal, not stored) under U; pivots are 1-based int32 row swaps; infos is 0, or
    the 1-based index of the first zero on U's diagonal."""
    m = xp(a)
    rows, cols = a.shape[-2:]
    batch = a.shape[:-2]
    k = min(rows, cols)
    nb = int(np.prod(batch))
    w = a.reshape((nb, rows, cols)).copy()
    piv = m.empty((nb, k), dtype=m.int32)
    idx = m.arange(nb)
    for c in range(k):
        p = m.argmax(_magnitude(m, w[:, c:, c]), axis=1) + c
        piv[:, c] = p + 1
        top = w[idx, c, :].copy()
        w[idx, c, :] = w[idx, p, :]
        w[idx, p, :] = top
        pivot = w[:, c, c]
        safe = m.where(pivot == 0, m.asarray(1, dtype=w.dtype), pivot)
        w[:, c + 1:, c] /= safe[:, None]
        w[:, c + 1:, c + 1:] -= w[:, c + 1:, c, None] * w[:, c, None, c + 1:]
    diag = m.diagonal(w, 0, -2, -1) == 0
    infos = m.zeros(nb, dtype=m.int32) if k == 0 else m.where(
        diag.any(axis=-1), m.argmax(diag, axis=-1) + 1, 0).astype(m.int32)
    return w.reshape(a.shape), piv.reshape(batch + (k,)), infos.reshape(batch)


def permutation(piv: Any, rows: int, dtype: Any) -> Any:
    """The permutation matrices P (``A = P L U``) of 1-based LAPACK row swaps ``piv``."""
    m = xp(piv)
    batch = piv.shape[:-1]
    nb = int(np.prod(batch))
    flat = piv.reshape((nb, piv.shape[-1])).astype(np.int64) - 1
    perm = m.broadcast_to(m.arange(rows), (nb, rows)).copy()
    idx = m.arange(nb)
    for c in range(flat.shape[1]):
        p = flat[:, c]
        here = perm[:, c].copy()
        perm[:, c] = perm[idx, p]
        perm[idx, p] = here
    out = m.zeros((nb, rows, rows), dtype=dtype)
    # perm[i] is the row of A that became row i of L U: P^T A = A[perm]
    out[idx[:, None], perm, m.arange(rows)[None, :]] = 1
    return out.reshape(batch + (rows, rows))


def _lu_square_vjp(low: Any, up: Any, gl: Any, gu: Any) -> Any:
    """P^T A = L U, square: L^-1 P^T dA U^-1 = L^-1 dL + dU U^-1 (strictly lower plus upper),
    so gA = P L^-H (tril(L^H gL, -1) + triu(gU U^H)) U^-H (the P applied by the caller)."""
    m = xp(gl)
    phi = m.tril(mH(low) @ gl, -1) + m.triu(gu @ mH(up))
    x = tri_solve(mH(low), phi, upper=True, unit=True)        # L^-H phi
    return mH(tri_solve(up, mH(x), upper=True))               # (U^-1 (L^-H phi)^H)^H


def lu_vjp(a: Any, state: Any, i: int, g: Any) -> Any:
    """The gradient of the packed LU for its gradient ``g``: gL = tril(g, -1), gU = triu(g).
    A tall P^T A = [L1; L2] U adds L2 = A2 U^-1 (gU gets -L2^H gL2 U^-H, gA2 = gL2 U^-H); a
    wide one, U2 = L^-1 A2 (gL gets -L^-H gU2 U2^H, gA2 = L^-H gU2)."""
    lu, piv = state
    m = xp(g)
    rows, cols = lu.shape[-2:]
    k = min(rows, cols)
    eye = _eye_like(m, lu, k)
    low = m.tril(lu[..., :k, :k], -1) + eye
    up = m.triu(lu[..., :k, :k])
    gl = m.tril(g[..., :k, :k], -1)
    gu = m.triu(g[..., :k, :k])
    if rows > cols:
        l2, gl2 = lu[..., k:, :], g[..., k:, :]
        ga2 = mH(tri_solve(up, mH(gl2), upper=True))           # gL2 U^-H
        gu = gu - m.triu(mH(l2) @ ga2)
        ga = m.concatenate([_lu_square_vjp(low, up, gl, gu), ga2], axis=-2)
    elif cols > rows:
        u2, gu2 = lu[..., :, k:], g[..., :, k:]
        ga2 = tri_solve(mH(low), gu2, upper=True, unit=True)   # L^-H gU2
        gl = gl - m.tril(ga2 @ mH(u2), -1)
        ga = m.concatenate([_lu_square_vjp(low, up, gl, gu), ga2], axis=-1)
    else:
        ga = _lu_square_vjp(low, up, gl, gu)
    return permutation(piv, rows, ga.dtype) @ ga


# --------------------------------------------------------------------------------------------
# Householder QR in LAPACK's compact form


def geqrf(a: Any) -> tuple:
    """``(packed, tau)`` of LAPACK's geqrf: R on and above the diagonal, below it the
    Householder vectors v_j (v_j[j] = 1 implied), A = H_1 ... H_k R with
    H_j = I - tau_j v_j v_j^H; beta = -sign(Re alpha) ||(alpha, x)||, as LAPACK's larfg."""
    m = xp(a)
    rows, cols = a.shape[-2:]
    k = min(rows, cols)
    w = a.reshape((int(np.prod(a.shape[:-2])), rows, cols)).copy()
    tau = m.zeros((w.shape[0], k), dtype=w.dtype)
    cplx = w.dtype.kind == "c"
    for j in range(k):
        alpha = w[:, j, j].copy()
        x = w[:, j + 1:, j]
        xnorm2 = (m.abs(x) ** 2).sum(axis=1)
        plain = (xnorm2 == 0) & ((alpha.imag == 0) if cplx else True)
        norm = m.sqrt(m.abs(alpha) ** 2 + xnorm2)
        beta = -m.where(alpha.real >= 0, norm, -norm)
        safe_beta = m.where(plain, 1, beta)
        t = m.where(plain, 0, (safe_beta - alpha) / safe_beta)
        scale = m.where(plain, 0, 1 / m.where(plain, 1, alpha - safe_beta))
        w[:, j + 1:, j] = m.where(plain[:, None], x, x * scale[:, None])
        w[:, j, j] = m.where(plain, alpha, beta)
        tau[:, j] = t
        v = m.concatenate([m.ones((w.shape[0], 1), dtype=w.dtype), w[:, j + 1:, j]], axis=1)
        rest = w[:, j:, j + 1:]
        proj = m.einsum("bi,bij->bj", v.conj() if cplx else v, rest)
        tc = t.conj() if cplx else t
        rest -= tc[:, None, None] * v[:, :, None] * proj[:, None, :]
    return w.reshape(a.shape), tau.reshape(a.shape[:-2] + (k,))
