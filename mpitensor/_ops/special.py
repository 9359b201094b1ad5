"""Special functions on float arrays (NumPy or CuPy): ``erf``, ``erfc``, ``erfcx``,
``erfinv``, ``lgamma``, ``digamma``, ``trigamma``, ``polygamma``, the Hurwitz ``zeta``, the
normal distribution's ``ndtri`` and ``log_ndtr``, the modified Bessel functions ``i0``, ``i1``
and their scaled forms ``i0e``, ``i1e``, the regularized incomplete gamma functions
``gammainc`` (and its upper form), written with array operations only.

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
    return m.exp(-x * x) * _erfcx_fraction(x, m)  # x >= 1.5: converged to double precision


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


# --------------------------------------------------------------------------------------------
# torch.special's further functions: erfcx, the normal distribution's ndtri and log_ndtr,
# the modified Bessel functions i0/i1 (and their scaled forms), the Hurwitz zeta function and
# polygamma.


def _erfcx_fraction(x: Any, m: Any) -> Any:
    """erfcx(x) = exp(x^2) erfc(x) for x >= 1.5: the continued fraction of ``_erfc_fraction``
    without its factor exp(-x^2) (no underflow), and ``1 / (x sqrt(pi))`` where x^2
    overflows."""
    s = x * x
    f = s + (0.5 + 2 * _CF_TERMS)
    for i in range(_CF_TERMS, 0, -1):
        f = (s + (0.5 + 2 * (i - 1))) - (i * (i - 0.5)) / f
    return m.where(x > 1e150, 1.0 / (x * _SQRT_PI), x / (_SQRT_PI * f))


def _erfcx_high(v: Any, m: Any) -> Any:
    tail = _erfcx_fraction(m.abs(v), m)
    # erfcx(-y) = 2 exp(y^2) - erfcx(y): inf once exp(y^2) overflows, as torch
    return m.where(v > 0, m.where(m.isinf(v), 0.0, tail), 2.0 * m.exp(v * v) - tail)


def erfcx(x: Any) -> Any:
    """The scaled complementary error function ``exp(x^2) erfc(x)``, element-wise, without
    the underflow of erfc nor the overflow of exp for large ``x``."""
    x, dt = _wide(x)
    m = xp(x)
    with np.errstate(all="ignore"):
        out = _by_parts(x, m.abs(x) <= _SPLIT,
                        lambda v: m.exp(v * v) * (1.0 - _erf_series(v, m)),
                        lambda v: _erfcx_high(v, m))
        out = m.where(m.isnan(x), x, out)
        return out.astype(dt, copy=False)


_SQRT_HALF = math.sqrt(0.5)
_SQRT_HALF_PI = math.sqrt(0.5 * math.pi)
_LOG_2PI = math.log(2 * math.pi)


def log_ndtr(x: Any) -> Any:
    """The log of the standard normal distribution function, element-wise: through erfcx in
    the lower tail (no underflow), through log1p of the upper tail above -1."""
    x, dt = _wide(x)
    m = xp(x)
    with np.errstate(all="ignore"):
        low = m.log(0.5 * erfcx(-x * _SQRT_HALF)) - 0.5 * x * x
        high = m.log1p(-0.5 * erfc(x * _SQRT_HALF))
        out = m.where(x < -1.0, low, high)
        out = m.where(m.isnan(x), x, out)
        return out.astype(dt, copy=False)


def ndtri(p: Any) -> Any:
    """The inverse of the standard normal distribution function on [0, 1] (-inf at 0, inf at
    1, nan outside), element-wise.

    The lower half ``q = min(p, 1 - p)`` (``1 - p`` is exact for p >= 1/2) starts from erfinv
    (or, below 1e-3, from the tail's leading terms ``x^2 = t^2 - log(2 pi t^2)``, ``t^2 =
    -2 log q``), then Newton steps on ``log_ndtr(x) = log q``, whose slope
    ``1 / (sqrt(pi/2) erfcx(-x/sqrt(2)))`` needs no exponentials.
    """
    p, dt = _wide(p)
    m = xp(p)
    with np.errstate(all="ignore"):
        upper = p > 0.5
        q = m.where(upper, 1.0 - p, p)
        inside = (q > 0) & (q <= 0.5)
        qi = m.where(inside, q, 0.25)
        t2 = -2.0 * m.log(qi)
        x = m.where(qi > 1e-3, erfinv(2.0 * qi - 1.0) / _SQRT_HALF,
                    -m.sqrt(t2 - m.log(t2) - _LOG_2PI))
        log_q = m.log(qi)
        for _ in range(4):  # quadratic from a start good to a few digits
            x = x - (log_ndtr(x) - log_q) * (_SQRT_HALF_PI * erfcx(-x * _SQRT_HALF))
        out = m.where(inside, x, m.nan)
        out = m.where(q == 0, -m.inf, out)
        out = m.where(upper, -out, out)
        out = m.where((p < 0) | (p > 1) | m.isnan(p), m.nan, out)
        return out.astype(dt, copy=False)


_BESSEL_SPLIT = 20.0  # i0/i1: the power series below, the asymptotic series above


def _bessel_series(x: Any, nu: int, m: Any) -> Any:
    """I_nu(x) for |x| < 20, nu in {0, 1}: ``(x/2)^nu sum (x^2/4)^k / (k! (k+nu)!)``, a sum of
    positive terms (60 bring it to double precision)."""
    q = 0.25 * x * x
    term = m.ones_like(x)
    total = m.ones_like(x)
    for k in range(1, 60):
        term = term * (q / (k * (k + nu)))
        total = total + term
    return total if nu == 0 else 0.5 * x * total


def _bessel_scaled_asymptotic(a: Any, nu: int, m: Any) -> Any:
    """exp(-a) I_nu(a) for a >= 20 (Hankel's expansion ``sum_k c_k / a^k`` with
    ``c_k = c_{k-1} ((2k-1)^2 - 4 nu^2) / (8k)``, cut before its terms grow)."""
    term = m.ones_like(a)
    total = m.ones_like(a)
    for k in range(1, 28):
        term = term * (((2 * k - 1) ** 2 - 4 * nu * nu) / (8.0 * k * a))
        total = total + term
    return total / m.sqrt(2 * math.pi * a)


def _bessel(x: Any, nu: int, scaled: bool) -> Any:
    x, dt = _wide(x)
    m = xp(x)
    with np.errstate(all="ignore"):
        a = m.abs(x)
        small = a < _BESSEL_SPLIT
        s = _bessel_series(m.where(small, a, 0.0), nu, m)
        big = _bessel_scaled_asymptotic(m.where(small, _BESSEL_SPLIT, a), nu, m)
        out = m.where(small, s * m.exp(-a), big) if scaled else m.where(small, s, big * m.exp(a))
        out = m.where(a == m.inf, 0.0 if scaled else m.inf, out)
        if nu == 1:
            out = m.copysign(out, x)  # I_1 is odd, I_0 even
        out = m.where(m.isnan(x), x, out)
        return out.astype(dt, copy=False)


def i0(x: Any) -> Any:
    """The modified Bessel function of the first kind of order 0, element-wise."""
    return _bessel(x, 0, False)


def i0e(x: Any) -> Any:
    """``exp(-|x|) i0(x)``, element-wise (no overflow)."""
    return _bessel(x, 0, True)


def i1(x: Any) -> Any:
    """The modified Bessel function of the first kind of order 1, element-wise."""
    return _bessel(x, 1, False)


def i1e(x: Any) -> Any:
    """``exp(-|x|) i1(x)``, element-wise (no overflow)."""
    return _bessel(x, 1, True)


def _bernoulli_ratios(n: int) -> tuple:
    """``B_2j / (2j)!`` for j = 1..n, from the Bernoulli numbers' recurrence
    ``sum_{k<m} C(m+1, k) B_k = -(m+1) B_m``, in exact fractions."""
    from fractions import Fraction

    b = [Fraction(1)]
    for k in range(1, 2 * n + 1):
        b.append(-sum(math.comb(k + 1, j) * b[j] for j in range(k)) / (k + 1))
    return tuple(float(b[2 * j] / math.factorial(2 * j)) for j in range(1, n + 1))


_ZETA_TAIL = _bernoulli_ratios(12)
_ZETA_SHIFT = 9.0


def zeta(x: Any, q: Any) -> Any:
    """The Hurwitz zeta function ``sum_k (k + q)^-x``, element-wise (``x`` and ``q``
    broadcast): inf at x = 1 and at integer q <= 0, nan for x < 1 and for a non-integer x
    with q < 0.

    The sum's first terms are added until ``w = q + N >= 9``; the rest is Euler-Maclaurin's
    ``w^(1-x)/(x-1) - w^-x/2 + sum_j B_2j/(2j)! x(x+1)...(x+2j-2) w^(-x-2j+1)``, twelve
    terms of which reach double precision at w >= 9.
    """
    m = xp(x) if getattr(x, "ndim", 0) else xp(q)  # the array's module, for a scalar x
    dt = np.result_type(*(v.dtype for v in (x, q) if hasattr(v, "dtype")))  # (not a number's)
    x, q = m.asarray(x), m.asarray(q)
    x, q = m.broadcast_arrays(_wide(x)[0], _wide(q)[0])
    with np.errstate(all="ignore"):
        finite_q = q[m.isfinite(q)]
        low = float(finite_q.min()) if finite_q.size else _ZETA_SHIFT
        w = q.copy()
        total = m.zeros_like(x)
        for _ in range(max(int(_ZETA_SHIFT), int(math.ceil(_ZETA_SHIFT - low)))):
            total = total + w ** -x
            w = w + 1.0
        b = w ** -x
        total = total + b * w / (x - 1.0) + 0.5 * b
        rising = x.copy()
        b = b / w
        for j, c in enumerate(_ZETA_TAIL):
            total = total + c * rising * b
            rising = rising * (x + (2 * j + 1)) * (x + (2 * j + 2))
            b = b / (w * w)
        out = m.where(x == 1.0, m.inf, total)
        out = m.where(x < 1.0, m.nan, out)
        pole = (q <= 0) & (q == m.floor(q))
        out = m.where((q < 0) & ~pole & (x != m.floor(x)), m.nan, out)
        out = m.where(pole & (x >= 1.0), m.inf, out)
        out = m.where(m.isnan(x) | m.isnan(q), m.nan, out)
        return out.astype(dt if np.dtype(dt).kind == "f" else _F64, copy=False)


def polygamma(n: int, x: Any) -> Any:
    """The n-th derivative of digamma, element-wise: ``(-1)^(n+1) n! zeta(n+1, x)`` for
    n >= 2."""
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    x, dt = _wide(x)
    sign = 1.0 if n % 2 else -1.0
    with np.errstate(all="ignore"):
        out = (sign * math.factorial(n)) * zeta(np.float64(n + 1), x)
        return out.astype(dt, copy=False)


_GAMMA_MAX_TERMS = 20000  # series and fraction of the incomplete gamma: a hard bound (a ~ 1e7)


def _gammainc_series(a: Any, x: Any, m: Any) -> Any:
    """P(a, x) for x < a + 1: ``x^a e^-x / Gamma(a + 1) sum_n x^n / ((a+1)...(a+n))``, positive
    terms summed until each is below eps of the sum."""
    term = m.ones_like(x)
    total = m.ones_like(x)
    ap = a.copy()
    for i in range(_GAMMA_MAX_TERMS):
        ap = ap + 1.0
        term = term * (x / ap)
        total = total + term
        if i % 16 == 15 and not bool((term > 1e-17 * total).any()):
            break
    return total * m.exp(a * m.log(x) - x - lgamma(a + 1.0))


def _gammaincc_fraction(a: Any, x: Any, m: Any) -> Any:
    """Q(a, x) for x >= a + 1: Legendre's continued fraction
    ``1 / (x + 1 - a - 1 (1 - a) / (x + 3 - a - 2 (2 - a) / ...))`` by Lentz's method, times
    ``x^a e^-x / Gamma(a)``."""
    tiny = 1e-300
    b = x + 1.0 - a
    c = m.full_like(x, 1.0 / tiny)
    d = 1.0 / b
    h = d
    for i in range(1, _GAMMA_MAX_TERMS):
        an = -i * (i - a)
        b = b + 2.0
        d = an * d + b
        d = m.where(m.abs(d) < tiny, tiny, d)
        c = b + an / c
        c = m.where(m.abs(c) < tiny, tiny, c)
        d = 1.0 / d
        delta = d * c
        h = h * delta
        if i % 8 == 0 and not bool((m.abs(delta - 1.0) > 1e-16).any()):
            break
    return h * m.exp(a * m.log(x) - x - lgamma(a))


def gammainc(a: Any, x: Any, upper: bool = False) -> Any:
    """The regularized lower incomplete gamma function ``P(a, x)`` (``Q(a, x) = 1 - P`` when
    ``upper``), element-wise (``a`` and ``x`` broadcast): the series below ``x = a + 1``, the
    continued fraction above, each computing the smaller of P and Q there; nan for a < 0 or
    x < 0, as torch."""
    m = xp(a) if getattr(a, "ndim", 0) else xp(x)
    dt = np.result_type(*(v.dtype for v in (a, x) if hasattr(v, "dtype")))
    a, x = m.broadcast_arrays(_wide(m.asarray(a))[0], _wide(m.asarray(x))[0])
    with np.errstate(all="ignore"):
        inside = (a > 0) & (x > 0) & m.isfinite(a) & m.isfinite(x)
        low = inside & (x < a + 1.0)
        high = inside & ~low
        p = m.zeros_like(x)
        if bool(low.any()):
            p[low] = _gammainc_series(a[low], x[low], m)
        q = m.zeros_like(x)
        if bool(high.any()):
            q[high] = _gammaincc_fraction(a[high], x[high], m)
        out = m.where(low, 1.0 - p if upper else p, m.where(high, q if upper else 1.0 - q, 0))
        edge = float(upper)  # x = 0 (a > 0): P = 0; x = inf: P = 1; a = 0 (x > 0): P = 1
        out = m.where((x == 0) & (a > 0), edge, out)
        out = m.where(((x == m.inf) & (a > 0) & (a < m.inf)) | ((a == 0) & (x > 0)),
                      1.0 - edge, out)
        out = m.where((a == m.inf) & (x < m.inf), edge, out)  # P = 0 (as torch)
        out = m.where((a < 0) | (x < 0) | m.isnan(a) | m.isnan(x) | ((a == 0) & (x == 0))
                      | ((a == m.inf) & (x == m.inf)), m.nan, out)
        return out.astype(dt if np.dtype(dt).kind == "f" else _F64, copy=False)
