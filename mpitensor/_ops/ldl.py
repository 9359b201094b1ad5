"""The LDL^T (LDL^H) factorization of symmetric (Hermitian) matrices with Bunch-Kaufman
pivoting, and the solve with it, on arrays: ``torch.linalg.ldl_factor`` / ``ldl_solve``.

The factorization follows LAPACK's unblocked ``sytf2`` (``hetf2`` where ``herm``) for the
lower triangle (the one torch's CPU path takes for matrices up to LAPACK's block size, 64),
so the compact ``LD`` and the pivots are torch's: ``A = P_1 L_1 ... D ... L_1^T P_1^T`` with
1 x 1 and 2 x 2 diagonal blocks; a 2 x 2 block at ``k`` has ``pivots[k] = pivots[k+1] = -p``
(1-based). Neither has a gradient, as in torch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpitensor._core.devices import xp

__all__ = ["ldl_factor", "ldl_solve"]

_ALPHA = (1.0 + math.sqrt(17.0)) / 8.0


def _mag(v: Any) -> Any:
    # LAPACK's cabs1: |re| + |im|
    return abs(v.real) + abs(v.imag) if np.iscomplexobj(v) else abs(v)


def _cj(v: Any, herm: bool) -> Any:
    return np.conj(v) if herm else v


def _choose(a: np.ndarray, k: int, herm: bool) -> tuple:
    """Bunch-Kaufman's choice at column ``k``: ``(kp, kstep)``, or ``(k, 0)`` for a zero
    column (a singular matrix)."""
    n = a.shape[0]
    absakk = float(abs(a[k, k].real) if herm else _mag(a[k, k]))
    imax, colmax = k, 0.0
    if k + 1 < n:
        col = _mag(a[k + 1:, k])
        imax = k + 1 + int(np.argmax(col))
        colmax = float(col[imax - k - 1])
    if max(absakk, colmax) == 0.0 or math.isnan(absakk) or math.isnan(colmax):
        return k, 0
    if absakk >= _ALPHA * colmax:
        return k, 1
    rowmax = float(_mag(a[imax, k:imax]).max())
    if imax + 1 < n:
        rowmax = max(rowmax, float(_mag(a[imax + 1:, imax]).max()))
    if absakk >= _ALPHA * colmax * (colmax / rowmax):
        return k, 1
    if float(abs(a[imax, imax].real) if herm else _mag(a[imax, imax])) >= _ALPHA * rowmax:
        return imax, 1
    return imax, 2


def _swap(a: np.ndarray, k: int, kk: int, kp: int, kstep: int, herm: bool) -> None:
    """Interchange rows and columns ``kk`` and ``kp`` of the trailing lower triangle (the
    entries that cross the diagonal conjugated where ``herm``)."""
    a[kp + 1:, [kk, kp]] = a[kp + 1:, [kp, kk]]
    mid = a[kk + 1:kp, kk].copy()
    a[kk + 1:kp, kk] = _cj(a[kp, kk + 1:kp], herm)
    a[kp, kk + 1:kp] = _cj(mid, herm)
    a[kp, kk] = _cj(a[kp, kk], herm)
    a[[kk, kp], [kk, kp]] = a[[kp, kk], [kp, kk]]
    if kstep == 2:
        a[[k + 1, kp], k] = a[[kp, k + 1], k]


def _eliminate(a: np.ndarray, k: int, kstep: int, herm: bool) -> None:
    n = a.shape[0]
    if kstep == 1:
        if k + 1 < n:
            x = a[k + 1:, k] / a[k, k]
            a[k + 1:, k + 1:] -= np.tril(np.outer(x, _cj(a[k + 1:, k], herm)))
            a[k + 1:, k] = x
        return
    if k + 2 >= n:
        return
    if herm:
        # hetf2: the 2 x 2 block [[d22, conj(d21)], [d21, d11]] scaled by |d21|
        d = abs(a[k + 1, k])
        d11, d22 = a[k + 1, k + 1].real / d, a[k, k].real / d
        d21 = a[k + 1, k] / d
        d = (1.0 / (d11 * d22 - 1.0)) / d
        c0, c1 = a[k + 2:, k].copy(), a[k + 2:, k + 1].copy()
        wk = d * (d11 * c0 - d21 * c1)
        wkp1 = d * (d22 * c1 - np.conj(d21) * c0)
    else:
        d21 = a[k + 1, k]
        d11 = a[k + 1, k + 1] / d21
        d22 = a[k, k] / d21
        d21 = (1.0 / (d11 * d22 - 1.0)) / d21
        c0, c1 = a[k + 2:, k].copy(), a[k + 2:, k + 1].copy()
        wk = d21 * (d11 * c0 - c1)
        wkp1 = d21 * (d22 * c1 - c0)
    a[k + 2:, k + 2:] -= np.tril(np.outer(c0, _cj(wk, herm)) + np.outer(c1, _cj(wkp1, herm)))
    a[k + 2:, k], a[k + 2:, k + 1] = wk, wkp1


def _real_diagonal(a: np.ndarray, herm: bool) -> None:
    if herm:
        np.fill_diagonal(a, a.diagonal().real)


def _sytf2(a: np.ndarray, herm: bool) -> tuple:
    """``(LD, pivots, info)`` of one square matrix (lower triangle read)."""
    a = np.tril(a).copy()
    herm = herm and a.dtype.kind == "c"
    _real_diagonal(a, herm)
    n = a.shape[0]
    piv = np.zeros(n, dtype=np.int32)
    info, k = 0, 0
    while k < n:
        kp, kstep = _choose(a, k, herm)
        if kstep == 0:
            info = info or k + 1
            piv[k] = k + 1
            k += 1
            continue
        kk = k + kstep - 1
        if kp != kk:
            _swap(a, k, kk, kp, kstep, herm)
        _eliminate(a, k, kstep, herm)
        _real_diagonal(a, herm)
        if kstep == 1:
            piv[k] = kp + 1
        else:
            piv[k] = piv[k + 1] = -(kp + 1)
        k += kstep
    return np.tril(a), piv, info


def ldl_factor(x: Any, herm: bool = False) -> tuple:
    """``(LD, pivots, info)`` of each matrix of ``x`` (NumPy or CuPy; computed on the host);
    ``herm``: LDL^H of Hermitian matrices."""
    m = xp(x)
    host = x.get() if m is not np else x
    batch, n = host.shape[:-2], host.shape[-1]
    flat = host.reshape((-1, n, n))
    out = [_sytf2(flat[i], herm) for i in range(flat.shape[0])]
    ld = np.stack([o[0] for o in out]) if out else np.zeros_like(flat)
    piv = np.stack([o[1] for o in out]) if out else np.zeros((0, n), np.int32)
    info = np.array([o[2] for o in out], dtype=np.int32)
    return (m.asarray(ld.reshape(host.shape)), m.asarray(piv.reshape(batch + (n,))),
            m.asarray(info.reshape(batch)))


def _solve_one(ld: np.ndarray, piv: np.ndarray, b: np.ndarray, herm: bool) -> np.ndarray:
    """LAPACK's sytrs (hetrs) for the lower factorization: ``A^-1 b``."""
    n = ld.shape[0]
    b = b.copy()
    k = 0
    while k < n:   # b <- D^-1 L^-1 P^T b
        if piv[k] > 0:
            kp = piv[k] - 1
            b[[k, kp]] = b[[kp, k]]
            b[k + 1:] -= np.outer(ld[k + 1:, k], b[k])
            b[k] /= ld[k, k]
            k += 1
            continue
        kp = -piv[k] - 1
        b[[k + 1, kp]] = b[[kp, k + 1]]
        b[k + 2:] -= np.outer(ld[k + 2:, k], b[k]) + np.outer(ld[k + 2:, k + 1], b[k + 1])
        blk = np.array([[ld[k, k], _cj(ld[k + 1, k], herm)], [ld[k + 1, k], ld[k + 1, k + 1]]])
        b[k:k + 2] = np.linalg.solve(blk, b[k:k + 2])
        k += 2
    k = n - 1
    while k >= 0:  # b <- P L^-T b
        if piv[k] > 0:
            b[k] -= _cj(ld[k + 1:, k], herm) @ b[k + 1:]
            kp = piv[k] - 1
            b[[k, kp]] = b[[kp, k]]
            k -= 1
            continue
        b[k] -= _cj(ld[k + 1:, k], herm) @ b[k + 1:]
        b[k - 1] -= _cj(ld[k + 1:, k - 1], herm) @ b[k + 1:]
        kp = -piv[k] - 1
        b[[k, kp]] = b[[kp, k]]
        k -= 2
    return b


def ldl_solve(ld: Any, piv: Any, b: Any, herm: bool = False) -> Any:
    """``A^-1 b`` for each ``A`` given by :func:`ldl_factor` (batches broadcast)."""
    m = xp(ld)
    host = [v.get() if m is not np else v for v in (ld, piv, b)]
    ld_h, piv_h, b_h = host
    batch = np.broadcast_shapes(ld_h.shape[:-2], piv_h.shape[:-1], b_h.shape[:-2])
    n = ld_h.shape[-1]
    ldb = np.broadcast_to(ld_h, batch + (n, n)).reshape((-1, n, n))
    pb = np.broadcast_to(piv_h, batch + (n,)).reshape((-1, n))
    dt = np.result_type(ld_h.dtype, b_h.dtype)
    bb = np.broadcast_to(b_h, batch + b_h.shape[-2:]).reshape((-1,) + b_h.shape[-2:])
    herm = herm and ld_h.dtype.kind == "c"
    out = np.stack([_solve_one(ldb[i], pb[i], bb[i].astype(dt), herm)
                    for i in range(ldb.shape[0])]) \
        if ldb.shape[0] else np.zeros(bb.shape, dtype=dt)
    return m.asarray(out.reshape(batch + b_h.shape[-2:]))
