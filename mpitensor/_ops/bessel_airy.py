"""Bessel functions of the first and second kind (``j0``, ``j1``, ``y0``, ``y1``), the modified
Bessel functions of the second kind (``k0``, ``k1`` and their ``exp(x)``-scaled forms) and
Airy's ``Ai``, on float arrays (NumPy or CuPy), with array operations only.

Each function is split by the size of its argument into three methods, all of them
vectorised (the same fixed number of steps for every element):

* small arguments: the power series (Abramowitz & Stegun 9.1.10-11, 9.6.10-11, 10.4.2), whose
  terms are at most a small multiple of the sum there;
* ``j``/``y`` and ``Ai`` of a negative argument up to ``25``: Miller's backward recurrence for
  ``J_{nu+k}``, normalised by ``sum_k (nu + 2k) Gamma(nu + k) / k! J_{nu+2k} = (x/2)^nu``
  (A&S 9.1.87); ``y0``/``y1`` from the Neumann series ``Y0 = 2/pi ((log(x/2) + gamma) J0 -
  2 sum_k (-1)^k J_2k / k)`` and its derivative; ``Ai(-x) = sqrt(x)/3 (J_1/3 + J_-1/3)(2/3
  x^1.5)``;
* ``k``: the integral ``K_nu(x) e^x = int_0^inf exp(-2 x sinh^2(t/2)) cosh(nu t) dt`` by the
  trapezoidal rule, exponentially accurate for this analytic, doubly decaying integrand (64
  nodes, the step scaled with ``x``); ``Ai(x) = sqrt(x/3)/pi K_1/3(2/3 x^1.5)`` for x > 1;
* large arguments: Hankel's asymptotic expansions (A&S 9.2.5-10, 10.4.60), truncated where
  their terms are far below the double precision unit.

Float64 inside, so float32 results are rounded once. Accuracy: a few units in the last place
of float64 relative, except near the zeros of the oscillating functions, where the error is a
few units of ``1e-16`` absolute. Array-level only: nothing here knows tensors or autograd.

Example:
    >>> import numpy as np
    >>> round(float(j0(np.array(1.0))), 12)
    0.765197686558
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpitensor import backend as _backend
from mpitensor._core.devices import xp

__all__: list = []  # private module

_EULER = 0.57721566490153286061
_F64 = np.dtype(np.float64)
_SERIES_TERMS = 24
_MILLER_ORDER = 80       # J_{nu+80}(25) / J_nu(25) < 1e-20: the recurrence's start is exact
_MILLER_START = 1e-200   # grows by at most 1e145 over the recurrence for x >= 1
_ASYMPTOTIC_FROM = 25.0  # the expansions' smallest term there is about exp(-50)
_ASYMPTOTIC_TERMS = 32
_NODES = 64
_AI0 = 0.35502805388781723926   # Ai(0)
_DAI0 = 0.25881940379280679840  # -Ai'(0)


def _widen(x: Any) -> tuple:
    if x.dtype.kind == "c":
        raise TypeError("this special function is not implemented for complex tensors")
    return (x if x.dtype == _F64 else x.astype(_F64)), x.dtype


def _pieces(a: Any, parts: list) -> Any:
    """An array like ``a``: ``fn(a[mask])`` where ``mask`` holds, for each ``(mask, fn)``;
    NaN elsewhere."""
    m = xp(a)
    if _backend.is_meta_array(a):
        return parts[0][1](a)
    out = m.full(a.shape, m.nan, dtype=a.dtype)
    for mask, fn in parts:
        if bool(mask.any()):
            out[mask] = fn(a[mask])
    return out


# --------------------------------------------------------------------------------------------
# J0, J1, Y0, Y1


def _jy_series(a: Any) -> tuple:
    """``(J0, J1, Y0, Y1)`` at ``0 < a <= 1`` from the power series."""
    m = xp(a)
    q = -0.25 * a * a
    t0 = m.ones_like(a)
    t1 = m.ones_like(a)
    j0, s1 = t0.copy(), t1.copy()
    y0 = m.zeros_like(a)
    y1 = (1 - 2 * _EULER) * t1   # (psi(k+1) + psi(k+2)) terms, k = 0
    harmonic = 0.0
    for k in range(1, _SERIES_TERMS):
        harmonic += 1.0 / k
        t0 = t0 * q / (k * k)
        t1 = t1 * q / (k * (k + 1))
        j0 = j0 + t0
        s1 = s1 + t1
        y0 = y0 - harmonic * t0
        y1 = y1 + (2 * harmonic + 1.0 / (k + 1) - 2 * _EULER) * t1
    j1 = 0.5 * a * s1
    log_half = m.log(0.5 * a)
    y0 = (2 / math.pi) * ((log_half + _EULER) * j0 + y0)
    y1 = -2 / (math.pi * a) + (2 / math.pi) * log_half * j1 - (0.5 / math.pi) * a * y1
    return j0, j1, y0, y1


def _jy_miller(a: Any) -> tuple:
    """``(J0, J1, Y0, Y1)`` at ``1 < a <= 25`` by Miller's backward recurrence."""
    m = xp(a)
    upper = m.zeros_like(a)                 # f_{n+1}
    f = m.full(a.shape, _MILLER_START)      # f_n, n = _MILLER_ORDER (even)
    norm = m.zeros_like(a)                  # f_0 + 2 sum f_2k
    alt = m.zeros_like(a)                   # sum (-1)^k f_2k / k
    diff = m.zeros_like(a)                  # sum (-1)^k (f_2k-1 - f_2k+1) / k
    inv = 2.0 / a
    for n in range(_MILLER_ORDER, 0, -1):
        lower = n * inv * f - upper         # f_{n-1}
        if n % 2 == 0:
            k = n // 2
            sign = -1.0 if k % 2 else 1.0
            norm = norm + 2 * f
            alt = alt + (sign / k) * f
            diff = diff + (sign / k) * (lower - upper)
        upper, f = f, lower
    norm = norm + f
    j0, j1 = f / norm, upper / norm
    log_term = m.log(0.5 * a) + _EULER
    y0 = (2 / math.pi) * (log_term * j0 - 2 * alt / norm)
    y1 = (2 / math.pi) * (log_term * j1 - j0 / a + diff / norm)
    return j0, j1, y0, y1


def _hankel_pq(a: Any, nu: float) -> tuple:
    """Hankel's ``P`` and ``Q`` of order ``nu`` at ``a >= 25``."""
    m = xp(a)
    mu = 4.0 * nu * nu
    term = m.ones_like(a)
    p, q = term.copy(), m.zeros_like(a)
    inv8 = 1.0 / (8.0 * a)
    for k in range(1, _ASYMPTOTIC_TERMS):
        term = term * ((mu - (2 * k - 1) ** 2) / k) * inv8
        sign = -1.0 if (k // 2) % 2 else 1.0   # k = 1, 2: +Q, -P; k = 3, 4: -Q, +P
        if k % 2:
            q = q + sign * term
        else:
            p = p + sign * term
    return p, q


def _jy_asymptotic(a: Any, nu: int) -> tuple:
    """``(J_nu, Y_nu)`` at ``a >= 25``: ``sqrt(2/(pi a)) (P cos chi - Q sin chi)`` and
    ``(P sin chi + Q cos chi)``, ``chi = a - (2 nu + 1) pi / 4``."""
    m = xp(a)
    p, q = _hankel_pq(a, float(nu))
    c, s = m.cos(a), m.sin(a)
    r = math.sqrt(0.5)
    cos_chi, sin_chi = ((c + s) * r, (s - c) * r) if nu == 0 else ((s - c) * r, -(s + c) * r)
    scale = m.sqrt(2.0 / (math.pi * a))
    return scale * (p * cos_chi - q * sin_chi), scale * (p * sin_chi + q * cos_chi)


def _bessel_jy(x: Any, which: int) -> Any:
    """``which``: 0 J0, 1 J1, 2 Y0, 3 Y1 (float64 in and out)."""
    m = xp(x)
    a = m.abs(x)
    nu = which % 2

    def asym(v: Any) -> Any:
        return _jy_asymptotic(v, nu)[which // 2]

    with np.errstate(all="ignore"):
        out = _pieces(a, [(a <= 1, lambda v: _jy_series(v)[which]),
                          ((a > 1) & (a <= _ASYMPTOTIC_FROM), lambda v: _jy_miller(v)[which]),
                          ((a > _ASYMPTOTIC_FROM) & (a < m.inf), asym)])
        if which < 2:
            out = m.where(a == 0, 1.0 - nu, out)
            return out * m.sign(x) if nu else out   # J1 is odd, J0 even
        return m.where(x == 0, -m.inf, m.where(x < 0, m.nan, out))


def _jy_entry(which: int) -> Any:
    def fn(x: Any) -> Any:
        x, dt = _widen(x)
        return _bessel_jy(x, which).astype(dt, copy=False)
    fn.__name__ = ("j0", "j1", "y0", "y1")[which]
    fn.__doc__ = f"The Bessel function ``{fn.__name__}`` element-wise (NaN at +-inf, as torch)."
    return fn


j0, j1, y0, y1 = (_jy_entry(w) for w in range(4))


# --------------------------------------------------------------------------------------------
# K0, K1 (scaled and not) and Ai


def _k_series(a: Any, nu: int) -> Any:
    """``K_nu(a)`` at ``0 < a <= 1`` from the power series (A&S 9.6.13, 9.6.11)."""
    m = xp(a)
    q = 0.25 * a * a
    t = m.ones_like(a)
    i_sum, s = t.copy(), (m.zeros_like(a) if nu == 0 else (1 - 2 * _EULER) * t)
    harmonic = 0.0
    for k in range(1, _SERIES_TERMS):
        harmonic += 1.0 / k
        t = t * q / (k * (k + nu))
        i_sum = i_sum + t
        s = s + (harmonic * t if nu == 0 else (2 * harmonic + 1.0 / (k + 1) - 2 * _EULER) * t)
    log_half = m.log(0.5 * a)
    if nu == 0:
        return -(log_half + _EULER) * i_sum + s
    return 1.0 / a + log_half * (0.5 * a * i_sum) - 0.25 * a * s


def _k_scaled_integral(a: Any, nu: float) -> Any:
    """``K_nu(a) e^a`` at ``a`` not too small (>= 0.5), by the trapezoidal rule on
    ``int_0^inf exp(-2 a sinh^2(t/2)) cosh(nu t) dt``, cut where the integrand is below
    ``e^-46``."""
    m = xp(a)
    h = 2.0 * m.arcsinh(m.sqrt(23.0 / a)) / _NODES
    total = 0.5 * m.ones_like(a)
    for j in range(1, _NODES + 1):
        t = j * h
        sh = m.sinh(0.5 * t)
        w = m.exp(-2.0 * a * sh * sh)
        total = total + (w if nu == 0 else w * m.cosh(nu * t))
    return h * total


def _bessel_k(x: Any, nu: int, scaled: bool) -> Any:
    m = xp(x)
    with np.errstate(all="ignore"):
        def small(v: Any) -> Any:
            k = _k_series(v, nu)
            return k * m.exp(v) if scaled else k

        def large(v: Any) -> Any:
            k = _k_scaled_integral(v, float(nu))
            return k if scaled else k * m.exp(-v)

        out = _pieces(x, [((x > 0) & (x <= 1), small), ((x > 1) & (x < m.inf), large)])
        out = m.where(x == 0, m.inf, m.where(x == m.inf, 0.0, out))
        return m.where(x < 0, m.nan, out)


def _k_entry(nu: int, scaled: bool) -> Any:
    def fn(x: Any) -> Any:
        x, dt = _widen(x)
        return _bessel_k(x, nu, scaled).astype(dt, copy=False)
    fn.__name__ = f"k{nu}{'e' if scaled else ''}"
    fn.__doc__ = (f"The modified Bessel function of the second kind of order {nu}"
                  f"{' times exp(x)' if scaled else ''}, element-wise.")
    return fn


k0, k1, k0e, k1e = _k_entry(0, False), _k_entry(1, False), _k_entry(0, True), _k_entry(1, True)


def _airy_series(x: Any) -> Any:
    """Ai from its Maclaurin series ``Ai(0) f(x) + Ai'(0) g(x)`` (-2.5 <= x <= 1)."""
    m = xp(x)
    x3 = x * x * x
    tf, tg = m.ones_like(x), x.copy()
    f, g = tf.copy(), tg.copy()
    for k in range(1, _SERIES_TERMS):
        tf = tf * x3 / ((3 * k - 1) * (3 * k))
        tg = tg * x3 / ((3 * k) * (3 * k + 1))
        f = f + tf
        g = g + tg
    return _AI0 * f - _DAI0 * g


def _j_fraction_miller(z: Any, nu: float) -> Any:
    """``J_nu(z)`` for ``nu = +-1/3`` and ``1.8 <= z <= 25`` by Miller's recurrence, normalised
    by A&S 9.1.87."""
    m = xp(z)
    g = [math.gamma(nu)]   # Gamma(nu + k) / k!
    for k in range(1, _MILLER_ORDER // 2 + 1):
        g.append(g[-1] * (nu + k - 1) / k)
    upper = m.zeros_like(z)
    f = m.full(z.shape, _MILLER_START)
    norm = m.zeros_like(z)
    inv = 2.0 / z
    for n in range(_MILLER_ORDER, 0, -1):
        if n % 2 == 0:
            norm = norm + ((nu + n) * g[n // 2]) * f
        upper, f = f, (nu + n) * inv * f - upper
    norm = norm + (nu * g[0]) * f
    return f * m.power(0.5 * z, nu) / norm


def _airy_negative_asymptotic(x: Any) -> Any:
    """Ai(x) for ``(2/3)|x|^1.5 >= 25`` (A&S 10.4.60)."""
    m = xp(x)
    a = -x
    zeta = (2.0 / 3.0) * a * m.sqrt(a)
    term, p, q = m.ones_like(a), m.ones_like(a), m.zeros_like(a)
    inv = 1.0 / zeta
    for k in range(1, _ASYMPTOTIC_TERMS):
        ratio = (6 * k - 5) * (6 * k - 3) * (6 * k - 1) / (216.0 * k * (2 * k - 1))
        term = term * ratio * inv
        sign = -1.0 if (k // 2) % 2 else 1.0
        if k % 2:
            q = q + sign * term
        else:
            p = p + sign * term
    c, s = m.cos(zeta), m.sin(zeta)
    r = math.sqrt(0.5)
    return (p * (c + s) * r + q * (s - c) * r) / (math.sqrt(math.pi) * m.sqrt(m.sqrt(a)))


def airy_ai(x: Any) -> Any:
    """Airy's ``Ai`` element-wise (NaN at +-inf, as torch)."""
    x, dt = _widen(x)
    m = xp(x)

    def middle(v: Any) -> Any:
        z = (2.0 / 3.0) * (-v) * m.sqrt(-v)
        return m.sqrt(-v) / 3 * (_j_fraction_miller(z, 1 / 3) + _j_fraction_miller(z, -1 / 3))

    def positive(v: Any) -> Any:
        z = (2.0 / 3.0) * v * m.sqrt(v)
        ai = m.sqrt(v / 3) / math.pi * _k_scaled_integral(z, 1 / 3) * m.exp(-z)
        return m.where(z == m.inf, 0.0, ai)   # z overflows for x > 1e205: Ai is 0 long before

    edge = -(37.5 ** (2.0 / 3.0))   # zeta = 25
    with np.errstate(all="ignore"):
        out = _pieces(x, [((x >= -2.5) & (x <= 1), _airy_series),
                          ((x > edge) & (x < -2.5), middle),
                          ((x <= edge) & (x > -m.inf), _airy_negative_asymptotic),
                          ((x > 1) & (x < m.inf), positive)])
    return out.astype(dt, copy=False)
