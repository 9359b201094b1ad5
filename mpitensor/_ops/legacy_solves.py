"""Solves and inverses of torch's older linear-algebra functions, on arrays with their
gradients: ``triangular_solve``, ``cholesky_solve``, ``cholesky_inverse`` and ``pinverse``.

Their gradients are torch's: a triangular solve's gradient for its matrix is kept to the
triangle it reads (and off the diagonal for a unit triangle); ``cholesky_solve`` and
``cholesky_inverse`` take the factor ``L`` as a full matrix in ``A = L L^H``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor._core.devices import same_device, xp
from mpitensor._ops.factorizations import mH, tri_solve
from mpitensor._ops.operators import fit_grad
from mpitensor.autograd import ArrayFunction as Function

__all__ = ["TriangularSolve", "CholeskySolve", "CholeskyInverse", "Pinv"]


def _broadcast(b: Any, a: Any) -> tuple:
    """``b`` and ``a`` with their batch dimensions broadcast against each other."""
    m = xp(a)
    batch = tuple(np.broadcast_shapes(b.shape[:-2], a.shape[:-2]))
    return (m.broadcast_to(b, batch + b.shape[-2:]), m.broadcast_to(a, batch + a.shape[-2:]))


class TriangularSolve(Function):
    """``X = op(A)^-1 B`` for a triangular ``A`` (op: transpose or not): gB = op(A)^-H g,
    g op(A) = -gB X^H, and A's gradient is kept to its triangle."""

    @staticmethod
    def forward(ctx: Any, b: Any, a: Any, upper: bool, transpose: bool, unit: bool) -> Any:
        b, a = same_device(b, a)
        bb, ab = _broadcast(b, a)
        op = ab.swapaxes(-1, -2) if transpose else ab
        x = tri_solve(op, bb, upper != transpose, unit)
        ctx.meta = (upper, transpose, unit, b.shape, b.dtype, a.shape, a.dtype)
        ctx.save_for_backward(ab, x)
        return x

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        upper, transpose, unit, bshape, bdtype, ashape, adtype = ctx.meta
        a, x = ctx.saved_tensors
        m = xp(g)
        op = a.swapaxes(-1, -2) if transpose else a
        gb = tri_solve(mH(op), g, upper == transpose, unit)
        ga = None
        if ctx.needs_input_grad[1]:
            gop = -(gb @ mH(x))
            full = gop.swapaxes(-1, -2) if transpose else gop
            ga = m.triu(full, int(unit)) if upper else m.tril(full, -int(unit))
            ga = fit_grad(ga, ashape, adtype)
        gb = fit_grad(gb, bshape, bdtype) if ctx.needs_input_grad[0] else None
        return gb, ga, None, None, None


def _gram(f: Any, upper: bool) -> Any:
    return mH(f) @ f if upper else f @ mH(f)


class CholeskySolve(Function):
    """``X = (L L^H)^-1 B`` (``U^H U`` where ``upper``): gB = A^-1 g and, for the factor as a
    full matrix, gL = -(C + C^H) L with C = gB X^H (L (C + C^H) for U)."""

    @staticmethod
    def forward(ctx: Any, b: Any, f: Any, upper: bool) -> Any:
        b, f = same_device(b, f)
        bb, fb = _broadcast(b, f)
        x = _chol_solve(fb, bb, upper)
        ctx.meta = (upper, b.shape, b.dtype, f.shape, f.dtype)
        ctx.save_for_backward(fb, x)
        return x

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        upper, bshape, bdtype, fshape, fdtype = ctx.meta
        f, x = ctx.saved_tensors
        gb = _chol_solve(f, g, upper)
        gf = None
        if ctx.needs_input_grad[1]:
            c = gb @ mH(x)
            c = c + mH(c)
            gf = fit_grad(-(f @ c) if upper else -(c @ f), fshape, fdtype)
        gb = fit_grad(gb, bshape, bdtype) if ctx.needs_input_grad[0] else None
        return gb, gf, None


def _chol_solve(f: Any, b: Any, upper: bool) -> Any:
    """``(L L^H)^-1 b`` by two triangular solves (``(U^H U)^-1 b`` where ``upper``)."""
    low = mH(f) if upper else f
    y = tri_solve(low, b, upper=False)
    return tri_solve(mH(low), y, upper=True)


class CholeskyInverse(Function):
    """``R = (L L^H)^-1``: gA = -R g R, and for the factor as a full matrix
    gL = (gA + gA^H) L (L (gA + gA^H) for U)."""

    @staticmethod
    def forward(ctx: Any, f: Any, upper: bool) -> Any:
        m = xp(f)
        eye = m.broadcast_to(m.eye(f.shape[-1], dtype=f.dtype), f.shape)
        r = _chol_solve(f, eye, upper)
        r = 0.5 * (r + mH(r))   # Hermitian to the last bit, as the true inverse is
        ctx.meta = upper
        ctx.save_for_backward(f, r)
        return r

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        upper = ctx.meta
        f, r = ctx.saved_tensors
        ga = -(r @ g @ r)
        sym = ga + mH(ga)
        return (f @ sym if upper else sym @ f), None


class Pinv(Function):
    """``P = pinv(A)`` through the SVD, singular values at most ``rcond`` times the largest
    dropped. dP = -P dA P + P P^H dA^H (I - A P) + (I - P A) dA^H P^H P (Golub and Pereyra),
    so gA = -P^H g P^H + (I - A P) g^H P P^H + P^H P g^H (I - P A)."""

    @staticmethod
    def forward(ctx: Any, a: Any, rcond: float) -> Any:
        m = xp(a)
        u, s, vh = m.linalg.svd(a, full_matrices=False)
        if s.shape[-1] == 0:   # an empty matrix: its pseudo-inverse is empty too
            ctx.save_for_backward(a, mH(a))
            return mH(a).copy()
        cut = rcond * s.max(axis=-1, keepdims=True)
        keep = s > cut
        inv = m.where(keep, 1 / m.where(keep, s, 1), 0).astype(s.dtype)
        p = (mH(vh) * inv[..., None, :]) @ mH(u)
        ctx.save_for_backward(a, p)
        return p.astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        a, p = ctx.saved_tensors
        ph, gh = mH(p), mH(g)
        ga = -(ph @ g @ ph)
        ga = ga + (gh - a @ (p @ gh)) @ (p @ ph)
        ga = ga + (ph @ p) @ (gh - (gh @ p) @ a)
        return ga, None
