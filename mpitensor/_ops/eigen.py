"""Eigen-decompositions on arrays and their gradients, for ``torch.linalg.eigh``,
``eigvalsh``, ``eig``, ``eigvals`` (and the singular values alone, ``svdvals``).

As in :mod:`mpitensor._ops.factorizations`, a decomposition runs once and each output is
recorded as its own op of the input (:class:`~mpitensor._ops.factorizations.Part`), whose
backward is the vector-Jacobian product with the other outputs' gradients taken as zero.

With ``A V = V diag(L)``, ``dL = diag(V^-1 dA V)`` and ``V^-1 dV = F * (V^-1 dA V)`` off the
diagonal, ``F_ij = 1 / (L_j - L_i)``, so gA = V^-H (diag(gL) + conj(F) * P(V^H gV)) V^H
with P the projection onto the gauge the outputs are normalised in: the skew-Hermitian part
for a Hermitian A (V unitary, so V^-H = V), and ``X - V^H V diag(Re diag X)`` for a general A
(unit-norm columns). On a real input the gradient is the real part.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor._core.devices import xp
from mpitensor._ops.factorizations import mH

__all__ = ["eigh", "eigh_vjp", "eig", "eig_vjp", "svdvals_vjp"]


def eigh(a: Any, uplo: str) -> tuple:
    """``(L, V)`` of each Hermitian matrix of ``a`` (only the ``uplo`` triangle is read):
    real eigenvalues in ascending order and orthonormal eigenvectors."""
    w, v = xp(a).linalg.eigh(a, UPLO=uplo)
    return w, v


def _diag_embed(m: Any, d: Any, like: Any) -> Any:
    n = d.shape[-1]
    return m.eye(n, dtype=like.dtype) * d[..., None, :]


def _inner(m: Any, w: Any, vhgv: Any, gl: Any) -> Any:
    """``diag(gL) + conj(F) * X`` off the diagonal, ``F_ij = 1 / (L_j - L_i)``."""
    n = w.shape[-1]
    eye = m.eye(n, dtype=bool)
    e = w[..., None, :] - w[..., :, None]
    e = e.conj() if e.dtype.kind == "c" else e
    off = m.where(eye, 0, vhgv / m.where(eye, 1, e))
    if gl is None:
        return off
    return off + _diag_embed(m, gl.astype(off.dtype, copy=False), off)


def _check_phase(m: Any, x: Any, what: str) -> None:
    """Raise where the loss depends on the eigenvectors' phases: ``Im diag(V^H gV)`` is the
    derivative of the loss along ``V -> V e^{i phi}``, which must vanish (torch's bound,
    1e-2, absolute and relative)."""
    if x.dtype.kind != "c":
        return
    im = m.diagonal(x, 0, -2, -1).imag
    if bool((m.abs(im) > 1e-2).any()):
        raise RuntimeError(f"{what}: the loss depends on the phases of the eigenvectors, "
                           f"which are arbitrary (each column can be multiplied by any "
                           f"e^(i phi)), so its gradient is not defined; build the loss from "
                           f"phase-independent quantities such as |V|^2 or V V^H")


def eigh_vjp(a: Any, state: Any, i: int, g: Any) -> Any:
    """The gradient of ``(L, V) = eigh(A)`` for output ``i``'s gradient ``g``:
    V (diag(gL) + F * skew(V^H gV)) V^H (F real, as L is)."""
    w, v = state
    m = xp(g)
    if i == 0:
        return (v * g.astype(v.dtype, copy=False)[..., None, :]) @ mH(v)
    x = mH(v) @ g
    _check_phase(m, x, "linalg.eigh backward")
    x = 0.5 * (x - mH(x))
    return v @ _inner(m, w, x, None) @ mH(v)


def eig(a: Any) -> tuple:
    """``(L, V)`` of each square matrix of ``a``, complex always (eigenvectors of unit
    norm, as LAPACK's geev).

    Raises:
        NotImplementedError: a CuPy array (cupy.linalg has no general eigen-solver).
    """
    m = xp(a)
    if m is not np:
        raise NotImplementedError("linalg.eig/eigvals: CuPy has no general (non-Hermitian) "
                                  "eigen-solver; move the tensor to the CPU (.cpu()) or use "
                                  "eigh for a Hermitian matrix")
    cdt = np.complex64 if a.dtype in (np.float32, np.complex64) else np.complex128
    w, v = np.linalg.eig(a)
    return w.astype(cdt, copy=False), v.astype(cdt, copy=False)


def eig_vjp(a: Any, state: Any, i: int, g: Any) -> Any:
    """The gradient of ``(L, V) = eig(A)``: V^-H (diag(gL) + conj(F) * P(V^H gV)) V^H with
    P(X) = X - V^H V diag(Re diag X) (the columns of V keep unit norm)."""
    w, v = state
    m = xp(g)
    vh = mH(v)
    if i == 0:
        inner = _diag_embed(m, g.astype(v.dtype, copy=False), v)
    else:
        x = vh @ g
        _check_phase(m, x, "linalg.eig backward")
        x = x - vh @ (v * m.diagonal(x, 0, -2, -1).real[..., None, :])
        inner = _inner(m, w, x, None)
    return m.linalg.solve(vh, inner @ vh)


def svdvals_vjp(a: Any, state: Any, i: int, g: Any) -> Any:
    """The gradient of the singular values ``S`` of ``A = U S V^H``: U diag(gS) V^H."""
    u, s, vh = state
    k = s.shape[-1]
    return (u[..., :k] * g.astype(u.dtype, copy=False)[..., None, :]) @ vh[..., :k, :]
