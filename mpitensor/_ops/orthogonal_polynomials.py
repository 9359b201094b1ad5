"""The classical orthogonal polynomials of ``torch.special`` on float arrays (NumPy or CuPy):
Chebyshev ``T``, ``U``, ``V``, ``W`` (and their shifted forms on ``[0, 1]``), Hermite ``H``
(physicists') and ``He`` (probabilists'), Laguerre ``L`` and Legendre ``P``.

``polynomial(kind, x, n)`` evaluates ``p_n(x)`` element-wise, ``x`` and ``n`` broadcast
together. ``n`` is truncated toward zero, as torch converts it to an integer; a negative or
NaN ``n`` gives 0 and ``n = 0`` gives 1 (even at a NaN ``x``), as torch's. The values come
from each family's three-term recurrence in float64 (one pass up to the largest ``n`` for the
whole array), except Chebyshev's four kinds inside ``(-1, 1)`` for ``n > 6``, which use their
trigonometric forms ``T_n(cos t) = cos(n t)``, ``U_n = sin((n+1) t) / sin t``,
``V_n = cos((n+1/2) t) / cos(t/2)``, ``W_n = sin((n+1/2) t) / sin(t/2)`` (accurate where the
recurrence's rounding errors would add up over many steps), and at x = +-1 their closed
forms. The recurrence costs one array step per degree, up to the largest ``n`` that needs it
(once every such element has overflowed to inf or NaN the rest is known without stepping).
Array-level only.

Example:
    >>> import numpy as np
    >>> float(polynomial("legendre_p", np.array(0.5), np.array(2.0)))
    -0.125
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor import backend as _backend
from mpitensor._core.devices import xp

__all__: list = []  # private module

_F64 = np.dtype(np.float64)
_TRIG_FROM = 6  # Chebyshev inside (-1, 1): the trigonometric form for n above this
_CHECK_EVERY = 256  # steps between looks for an array that has overflowed everywhere

# kind: (p_1(x), the step p_{k+1} from (k, x, p_k, p_{k-1}))
_FAMILIES = {
    "t": (lambda x: x, lambda k, x, p, q: 2 * x * p - q),
    "u": (lambda x: 2 * x, lambda k, x, p, q: 2 * x * p - q),
    "v": (lambda x: 2 * x - 1, lambda k, x, p, q: 2 * x * p - q),
    "w": (lambda x: 2 * x + 1, lambda k, x, p, q: 2 * x * p - q),
    "hermite_h": (lambda x: 2 * x, lambda k, x, p, q: 2 * x * p - (2 * k) * q),
    "hermite_he": (lambda x: x, lambda k, x, p, q: x * p - k * q),
    "laguerre_l": (lambda x: 1 - x, lambda k, x, p, q: ((2 * k + 1 - x) * p - k * q) / (k + 1)),
    "legendre_p": (lambda x: x, lambda k, x, p, q: ((2 * k + 1) * x * p - k * q) / (k + 1)),
}

KINDS = ("chebyshev_t", "chebyshev_u", "chebyshev_v", "chebyshev_w",
         "shifted_chebyshev_t", "shifted_chebyshev_u", "shifted_chebyshev_v",
         "shifted_chebyshev_w", "hermite_h", "hermite_he", "laguerre_l", "legendre_p")


def _chebyshev_trig(family: str, x: Any, n: Any) -> Any:
    m = xp(x)
    t = m.arccos(x)
    if family == "t":
        return m.cos(n * t)
    if family == "u":
        return m.sin((n + 1) * t) / m.sin(t)
    if family == "v":
        return m.cos((n + 0.5) * t) / m.cos(0.5 * t)
    return m.sin((n + 0.5) * t) / m.sin(0.5 * t)


def _chebyshev_ends(family: str, x: Any, n: Any) -> Any:
    """The four kinds at x = 1 and x = -1 (the limits of their trigonometric forms):
    ``T: 1, (-1)^n``; ``U: n+1, (-1)^n (n+1)``; ``V: 1, (-1)^n (2n+1)``;
    ``W: 2n+1, (-1)^n``."""
    m = xp(x)
    at_one = {"t": 1.0, "u": n + 1.0, "v": 1.0, "w": 2.0 * n + 1}[family]
    at_minus_one = {"t": 1.0, "u": n + 1.0, "v": 2.0 * n + 1, "w": 1.0}[family]
    sign = m.where(n % 2 == 0, 1.0, -1.0)
    return m.where(x > 0, at_one, sign * at_minus_one)


def _recurrence(family: str, x: Any, order: Any) -> Any:
    m = xp(x)
    first, step = _FAMILIES[family]
    out = m.where(order == 0, 1.0, 0.0)
    top = int(order.max()) if order.size else 0
    if top < 1:
        return out
    q, p = m.ones_like(x), first(x)
    out = m.where(order == 1, p, out)
    for k in range(1, top):
        q, p = p, step(k, x, p, q)
        out = m.where(order == k + 1, p, out)
        if (k + 1) % _CHECK_EVERY == 0 and top - k > _CHECK_EVERY:
            tail = _overflowed_tail(family, x, order, k + 1, p, q)
            if tail is not None:
                return m.where(order > k + 1, tail, out)
    return out


def _overflowed_tail(family: str, x: Any, order: Any, k: int, p: Any, q: Any) -> Any:
    """The values of every degree above ``k`` when all the elements that still need them have
    overflowed (``p_k``, ``p_k-1`` infinite or NaN): from there the recurrence only moves
    between NaN, inf and -inf, with period 1 or 2 once its coefficients keep their signs;
    None while that is not so (a degree of 10^9 would otherwise take 10^9 array steps)."""
    m = xp(x)
    left = order > k
    if bool((m.isfinite(p) | m.isfinite(q))[left].any()):
        return None
    if family == "laguerre_l" and 2 * k + 1 <= float(m.abs(m.where(left, x, 0)).max()):
        return None   # (2k + 1 - x) has yet to change sign
    step = _FAMILIES[family][1]
    p1 = step(k, x, p, q)
    p2 = step(k + 1, x, p1, p)
    p3 = step(k + 2, x, p2, p1)

    def same(a: Any, b: Any) -> bool:
        return bool(((a == b) | (m.isnan(a) & m.isnan(b)))[left].all())

    if not (same(p2, p) and same(p3, p1)):
        return None
    return m.where((order - k) % 2 == 0, p, p1)


def polynomial(kind: str, x: Any, n: Any) -> Any:
    """``p_n(x)`` of the named family (one of :data:`KINDS`), element-wise; the result has
    ``x``'s float dtype and the broadcast shape of ``x`` and ``n``."""
    if kind not in KINDS:
        raise ValueError(f"unknown polynomial family {kind!r}; one of {KINDS}")
    m = xp(x) if hasattr(x, "dtype") and np.ndim(x) else (xp(n) if hasattr(n, "dtype") else np)
    x_dt, n_dt = getattr(x, "dtype", None), getattr(n, "dtype", None)
    # the operators hand a Python number over as it is: the dtype is the array's
    dt = x_dt if x_dt is not None and x_dt.kind == "f" else (
        n_dt if n_dt is not None and n_dt.kind == "f" else _F64)
    x, n = m.asarray(x), m.asarray(n)
    if x.dtype.kind == "c" or n.dtype.kind == "c":
        raise TypeError(f"special.{kind}_polynomial: complex tensors are not supported")
    if _backend.is_meta_array(x) or _backend.is_meta_array(n):
        return (x + n).astype(dt)
    xw, nw = m.broadcast_arrays(x.astype(_F64), n.astype(_F64))
    shifted = kind.startswith("shifted_")
    family = kind.split("_")[-1] if "chebyshev" in kind else kind
    with np.errstate(all="ignore"):
        if shifted:
            xw = 2 * xw - 1
        order = m.where(m.isfinite(nw), m.trunc(nw), -1).astype(np.int64)
        if family not in ("t", "u", "v", "w"):
            return _recurrence(family, xw, order).astype(dt, copy=False)
        inside = (m.abs(xw) < 1) & (order > _TRIG_FROM)
        ends = (m.abs(xw) == 1) & (order > _TRIG_FROM)
        out = _recurrence(family, xw, m.where(inside | ends, 0, order))
        if bool(inside.any()):
            out = m.where(inside, _chebyshev_trig(family, xw, order.astype(_F64)), out)
        if bool(ends.any()):
            out = m.where(ends, _chebyshev_ends(family, xw, order), out)
    return out.astype(dt, copy=False)
