"""The matrix exponential on arrays and its gradient.

Forward: scaling and squaring with the degree-13 Padé approximant (Higham, "The scaling and
squaring method for the matrix exponential revisited", SIAM J. Matrix Anal. Appl. 26, 2005):
each matrix is divided by 2^s so that its 1-norm is at most theta_13 = 5.37, the approximant
r13 = (V - U)^-1 (V + U) is formed, and squared s times (s per matrix of the batch). float32
and complex64 inputs are computed in double precision and rounded once.

Backward: the gradient is the adjoint of the Fréchet derivative, L(A^H, G), which is the
upper-right block of exp([[A^H, G], [0, A^H]]) (Mathias, 1996), computed by the same forward.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor._core.devices import xp
from mpitensor._ops.factorizations import mH
from mpitensor.autograd import ArrayFunction as Function

__all__ = ["MatrixExp", "expm"]

_THETA13 = 5.371920351148152
_B = (64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0,
      129060195264000.0, 10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0,
      40840800.0, 960960.0, 16380.0, 182.0, 1.0)


def expm(a: Any) -> Any:
    """``exp(A)`` of each square matrix of ``a`` (float32/complex64 via double precision)."""
    m = xp(a)
    wide = np.dtype(np.complex128 if a.dtype.kind == "c" else np.float64)
    x = a.astype(wide)
    n = a.shape[-1]
    if n == 0 or x.size == 0:
        return x.astype(a.dtype)
    norm = m.abs(x).sum(axis=-2).max(axis=-1)
    with np.errstate(divide="ignore"):
        s = m.ceil(m.log2(m.where(norm > 0, norm, 1) / _THETA13))
    s = m.where(m.isfinite(s), m.maximum(s, 0), 0).astype(np.int64)
    x = x / (2.0 ** s)[..., None, None]
    eye = m.eye(n, dtype=wide)
    b = _B
    x2 = x @ x
    x4 = x2 @ x2
    x6 = x4 @ x2
    u = x @ (x6 @ (b[13] * x6 + b[11] * x4 + b[9] * x2)
             + b[7] * x6 + b[5] * x4 + b[3] * x2 + b[1] * eye)
    v = (x6 @ (b[12] * x6 + b[10] * x4 + b[8] * x2)
         + b[6] * x6 + b[4] * x4 + b[2] * x2 + b[0] * eye)
    r = m.linalg.solve(v - u, v + u)
    top = int(s.max()) if s.size else 0
    for j in range(top):
        r = m.where((s > j)[..., None, None], r @ r, r)
    return r.astype(a.dtype, copy=False)


class MatrixExp(Function):
    """``matrix_exp(A)``: gA = the upper-right block of exp([[A^H, G], [0, A^H]])."""

    @staticmethod
    def forward(ctx: Any, a: Any) -> Any:
        ctx.save_for_backward(a)
        return expm(a)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (a,) = ctx.saved_tensors
        m = xp(g)
        n = a.shape[-1]
        ah = mH(a)
        g = g.astype(np.result_type(a.dtype, g.dtype), copy=False)
        zero = m.zeros_like(ah)
        big = m.concatenate([m.concatenate([ah, g.astype(ah.dtype, copy=False)], axis=-1),
                             m.concatenate([zero, ah], axis=-1)], axis=-2)
        return (expm(big)[..., :n, n:],)
