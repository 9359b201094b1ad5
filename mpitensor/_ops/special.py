"""Special functions on float arrays (NumPy or CuPy): ``erf``, ``erfc``, ``erfinv``,
``lgamma``, ``digamma`` and ``trigamma``, written with array operations only.

NumPy has none of them, and SciPy is not a dependency. Each is accurate to a few units in the
last place of float64 over the whole real line (checked against torch in the tests), and is
computed in float64 for float16/bfloat16/float32 inputs and rounded once, as torch's CPU
kernels round once. Array-level only: nothing here knows tensors or autograd.

Example:
    >>> import numpy as np
    >>> round(float(erf(np.array(0.5))), 12)
    0.520499877813
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpitensor import backend as _backend
from mpitensor._core.devices import xp

__all__: list = []  # private module

_SQRT_PI = math.sqrt(math.pi)
_TWO_OVER_SQRT_PI = 2.0 / _SQRT_PI
_F64 = np.dtype(np.float64)


def _wide(x: Any) -> tuple:
    """``(x as float64, the dtype to round the result back to)``."""
    return (x if x.dtype == _F64 else x.astype(_F64)), x.dtype


def _erf_series(x: Any, m: Any) -> Any:
    """erf(x) for |x| <= 1.5: ``2/sqrt(pi) x exp(-x^2) sum (2x^2)^n / (2n+1)!!``, a series of
    positive terms (no cancellation)."""
    x2 = x * x
    two_x2 = 2.0 * x2
    term = m.ones_like(x)
    total = m.ones_like(x)
    for n in range(1, 40):  # 2x^2 <= 4.5: the terms fall below 1e-17 of the sum by then
        term = term * (two_x2 / (2 * n + 1))
        total = total + term
    return _TWO_OVER_SQRT_PI * x * m.exp(-x2) * total


def _erfc_fraction(x: Any, m: Any) -> Any:
    """erfc(x) for x >= 1.5: the continued fraction of the upper incomplete gamma function
    ``Q(1/2, x^2)`` (the even contraction of Laplace's), evaluated from its tail."""
    s = x * x
    f = s + (0.5 + 2 * _CF_TERMS)
    for i in range(_CF_TERMS, 0, -1):  # x >= 1.5: converged to double precision
        f = (s + (0.5 + 2 * (i - 1))) - (i * (i - 0.5)) / f
    return m.exp(-s) * x / (_SQRT_PI * f)


_CF_TERMS = 40
_SPLIT = 1.5


def _by_parts(x: Any, low: Any, f_low: Any, f_high: Any) -> Any:
    """``f_low`` on the elements of ``x`` where ``low`` holds, ``f_high`` on the others, each
    computed on its own elements only."""
    if _backend.is_meta_array(low):  # no values to split by: the shape and dtype of one part
        return f_low(x)
    out = xp(x).empty_like(x)
    out[low] = f_low(x[low])
    high = ~low
    out[high] = f_high(x[high])
    return out


def erf(x: Any) -> Any:
    """The error function, element-wise."""
    x, dt = _wide(x)
    m = xp(x)
    with np.errstate(all="ignore"):
        out = _by_parts(x, m.abs(x) <= _SPLIT, lambda v: _erf_series(v, m),
                        lambda v: m.sign(v) * (1.0 - _erfc_fraction(m.abs(v), m)))
        out = m.where(m.isinf(x), m.sign(x), out)
        out = m.where(m.isnan(x), x, out)
    return out.astype(dt, copy=False)


def _erfc_high(v: Any, m: Any) -> Any:
    tail = _erfc_fraction(m.abs(v), m)
    tail = m.where(m.isinf(v), 0.0, tail)
    return m.where(v > 0, tail, 2.0 - tail)


def erfc(x: Any) -> Any:
    """The complementary error function ``1 - erf(x)``, element-wise, without the
    cancellation of that difference for large ``x``."""
    x, dt = _wide(x)
    m = xp(x)
    with np.errstate(all="ignore"):
        out = _by_parts(x, m.abs(x) <= _SPLIT, lambda v: 1.0 - _erf_series(v, m),
                        lambda v: _erfc_high(v, m))
        out = m.where(m.isnan(x), x, out)
    return out.astype(dt, copy=False)


# Giles' single-precision approximation of erfinv ("Approximating the erfinv function", GPU
# Computing Gems, 2011), refined below by Halley steps.
_GILES_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                  0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_GILES_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
               0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _horner(coeffs: tuple, w: Any) -> Any:
    p = coeffs[0]
    for c in coeffs[1:]:
        p = p * w + c
    return p


def _erfinv_mid(a: Any, m: Any) -> Any:
    """erfinv(a) for 0 <= a < 0.5: Giles' start, then Newton steps on erf(x) = a."""
    x = _horner(_GILES_CENTRAL, -m.log((1.0 - a) * (1.0 + a)) - 2.5) * a
    for _ in range(3):  # the start has about 7 correct digits; each step doubles them
        x = x - (erf(x) - a) / (_TWO_OVER_SQRT_PI * m.exp(-x * x))
    return x


def _erfinv_tail(a: Any, m: Any) -> Any:
    """erfinv(a) for 0.5 <= a < 1: Giles' start, then Newton steps on
    log(erfc(x)) = log(1 - a), which is close to linear in x there."""
    w = -m.log((1.0 - a) * (1.0 + a))
    x = m.where(w < 5.0, _horner(_GILES_CENTRAL, w - 2.5),
                _horner(_GILES_TAIL, m.sqrt(w) - 3.0)) * a
    log_rest = m.log1p(-a)
    for _ in range(4):
        e = erfc(x)
        step = (log_rest - m.log(e)) * e / (_TWO_OVER_SQRT_PI * m.exp(-x * x))
        x = x - m.where(m.isfinite(step), step, 0.0)
    return x


def erfinv(y: Any) -> Any:
    """The inverse error function on [-1, 1] (inf at +-1, nan outside), element-wise."""
    y, dt = _wide(y)
    m = xp(y)
    with np.errstate(all="ignore"):
        a = m.abs(y)
        inside = a < 1.0
        x = m.where(a == 1.0, m.inf, m.nan)
        x[inside] = _by_parts(a[inside], a[inside] < 0.5, lambda v: _erfinv_mid(v, m),
                              lambda v: _erfinv_tail(v, m))
        out = m.copysign(x, y)
        out = m.where(m.isnan(y), y, out)
    return out.astype(dt, copy=False)


# Lanczos' approximation of the gamma function, g = 7, n = 9.
_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028,
            771.32342877765313, -176.61502916214059, 12.507343278686905,
            -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _lgamma_pos(x: Any, m: Any) -> Any:
    """log|Gamma(x)| for x >= 0.5 (Lanczos)."""
    z = x - 1.0
    s = m.full_like(z, _LANCZOS[0])
    for i, c in enumerate(_LANCZOS[1:], start=1):
        s = s + c / (z + i)
    t = z + _LANCZOS_G + 0.5
    return _HALF_LOG_2PI + (z + 0.5) * m.log(t) - t + m.log(s)


def lgamma(x: Any) -> Any:
    """``log|Gamma(x)|``, element-wise (+inf at 0 and the negative integers)."""
    x, dt = _wide(x)
    m = xp(x)
    with np.errstate(all="ignore"):
        pos = x >= 0.5
        xp_ = m.where(pos, x, 1.0 - x)  # reflection: Gamma(x) Gamma(1-x) = pi / sin(pi x)
        lg = _lgamma_pos(xp_, m)
        # sin(pi x) of the argument reduced to [-1/2, 1/2]: exact zeros at the integers, and
        # full precision next to them
        r = x - m.round(x)
        refl = math.log(math.pi) - m.log(m.abs(m.sin(math.pi * r))) - lg
        out = m.where(pos, lg, refl)
        out = m.where((x <= 0) & (r == 0), m.inf, out)
        out = m.where(m.isinf(x), m.inf, out)
        out = m.where(m.isnan(x), x, out)
    return out.astype(dt, copy=False)


_SHIFT = 10  # digamma/trigamma: recur up to x >= 10, where the asymptotic series is exact


def _digamma_big(y: Any, m: Any) -> Any:
    """psi(y) for y >= 10 (asymptotic series in 1/y^2, Bernoulli numbers)."""
    r = 1.0 / (y * y)
    series = r * (1 / 12 - r * (1 / 120 - r * (1 / 252 - r * (1 / 240 - r * (1 / 132
                  - r * (691 / 32760 - r * (1 / 12)))))))
    return m.log(y) - 0.5 / y - series


def digamma(x: Any) -> Any:
    """The digamma function ``psi(x) = d/dx log Gamma(x)``, element-wise: -inf at 0 and nan
    at the negative integers, as torch."""
    x, dt = _wide(x)
    m = xp(x)
    with np.errstate(all="ignore"):
        neg = x < 0.5
        z = m.where(neg, 1.0 - x, x)  # reflection: psi(1-x) - psi(x) = pi / tan(pi x)
        small = z < _SHIFT
        acc = m.zeros_like(z)
        zz = z
        for _ in range(_SHIFT):
            acc = acc + m.where(zz < _SHIFT, 1.0 / zz, 0.0)
            zz = m.where(zz < _SHIFT, zz + 1.0, zz)
        val = _digamma_big(zz, m) - m.where(small, acc, 0.0)
        r = x - m.round(x)  # tan(pi x), the argument reduced to [-1/2, 1/2] (see lgamma)
        out = m.where(neg, val - math.pi / m.tan(math.pi * r), val)
        out = m.where((x < 0) & (r == 0), m.nan, out)
        out = m.where(x == 0, m.copysign(m.inf, -x), out)
        out = m.where(x == m.inf, m.inf, out)
        out = m.where(x == -m.inf, m.nan, out)
    return out.astype(dt, copy=False)


def trigamma(x: Any) -> Any:
    """The trigamma function ``psi'(x)`` (``polygamma(1, x)``), element-wise: the
    gradient of digamma."""
    x, dt = _wide(x)
    m = xp(x)
    with np.errstate(all="ignore"):
        neg = x < 0.5
        z = m.where(neg, 1.0 - x, x)  # reflection: psi'(1-x) + psi'(x) = pi^2 / sin^2(pi x)
        acc = m.zeros_like(z)
        zz = z
        for _ in range(_SHIFT):
            acc = acc + m.where(zz < _SHIFT, 1.0 / (zz * zz), 0.0)
            zz = m.where(zz < _SHIFT, zz + 1.0, zz)
        r = 1.0 / (zz * zz)
        tail = (r / zz) * (1 / 6 - r * (1 / 30 - r * (1 / 42 - r * (1 / 30 - r * (5 / 66
                - r * (691 / 2730 - r * (7 / 6)))))))
        val = acc + 1.0 / zz + 0.5 * r + tail
        s = m.sin(math.pi * (x - m.round(x)))
        out = m.where(neg, (math.pi * math.pi) / (s * s) - val, val)
        out = m.where((x <= 0) & (x == m.floor(x)), m.inf, out)
    return out.astype(dt, copy=False)
