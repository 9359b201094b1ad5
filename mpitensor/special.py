"""``mpitensor.special``: the special functions of ``torch.special``, differentiable where
torch's are.

``import mpitensor as torch`` then ``torch.special.erfcx(x)``, ``torch.special.ndtri(p)``,
``torch.special.i0e(x)``... Same names, arguments and dtypes as torch (integer inputs give
the default float dtype; float16/bfloat16 are computed in float32 and rounded once). The
values come from ``mpitensor._ops.special`` (array operations only: no SciPy), accurate to a
few units in the last place of float64 except where noted there.

The Bessel functions ``bessel_j0/j1/y0/y1``, ``modified_bessel_k0/k1`` (and their
``scaled_`` forms), ``airy_ai`` (kernels in ``mpitensor._ops.bessel_airy``) and the
``*_polynomial_*`` families (``mpitensor._ops.orthogonal_polynomials``) have no derivative in
torch (their results do not require grad there); here their backward raises a clear
``RuntimeError`` instead of dropping the gradient silently.

Example:
    >>> import mpitensor as mt
    >>> mt.special.expit(mt.tensor([0.0]))
    tensor([0.5000])
    >>> mt.special.ndtri(mt.tensor([0.5, 0.975], dtype=mt.float64))
    tensor([0.0000, 1.9600], dtype=mpitensor.float64)
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from mpitensor._core.devices import xp
from mpitensor._core.half import computes_in_float32
from mpitensor._core.opkit import Tensor, run
from mpitensor._ops import bessel_airy as _ba
from mpitensor._ops import orthogonal_polynomials as _poly
from mpitensor._ops import special as _k
from mpitensor._ops.functions import write_out
from mpitensor._ops.math import UnaryOp, xlogy_op
from mpitensor._ops.operators import FUNCTION_OF, TRUEDIV, BinaryOp, binary

__all__ = [
    "erf", "erfc", "erfcx", "erfinv", "expit", "logit", "exp2", "expm1", "log1p", "gammaln",
    "digamma", "psi", "polygamma", "multigammaln", "i0", "i0e", "i1", "i1e",
    "modified_bessel_i0", "modified_bessel_i1", "ndtr", "ndtri", "log_ndtr", "sinc", "round",
    "xlogy", "xlog1py", "zeta", "entr", "logsumexp", "softmax", "log_softmax",
    "spherical_bessel_j0", "gammainc", "gammaincc",
    # Bessel functions of the second kind, Airy's Ai and the orthogonal polynomials
    "airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_k0",
    "modified_bessel_k1", "scaled_modified_bessel_k0", "scaled_modified_bessel_k1",
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
    "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
    "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p",
]

_SQRT_2PI = math.sqrt(2 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)
_SQRT_HALF = math.sqrt(0.5)


def _tensor(x: Any, fname: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"special.{fname}(): input must be a Tensor, got {type(x).__name__}")
    return x


# --------------------------------------------------------------------------------------------
# Functions the Tensor already has


def _method(name: str, method: str, doc: str) -> Any:
    def fn(input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return getattr(_tensor(input, name), method)()
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Return {doc}, element-wise (differentiable)."
    return fn


erf = _method("erf", "erf", "the error function")
erfc = _method("erfc", "erfc", "the complementary error function ``1 - erf(x)``")
erfinv = _method("erfinv", "erfinv", "the inverse error function")
expit = _method("expit", "sigmoid", "the logistic sigmoid ``1 / (1 + exp(-x))``")
exp2 = _method("exp2", "exp2", "``2 ** x``")
expm1 = _method("expm1", "expm1", "``exp(x) - 1`` (accurate near 0)")
log1p = _method("log1p", "log1p", "``log(1 + x)`` (accurate near 0)")
gammaln = _method("gammaln", "lgamma", "``log|Gamma(x)|``")
digamma = _method("digamma", "digamma", "the digamma function ``d/dx log Gamma(x)``")
psi = _method("psi", "digamma", "the digamma function (``digamma``'s other name)")
sinc = _method("sinc", "sinc", "the normalised sinc ``sin(pi x) / (pi x)`` (1 at 0)")


def round(input: Tensor, *, decimals: int = 0) -> Tensor:  # noqa: A001, A002 - torch's names
    """Return ``input`` rounded half to even, to ``decimals`` decimal places."""
    return _tensor(input, "round").round(decimals=decimals)


def logit(input: Tensor, eps: Optional[float] = None) -> Tensor:  # noqa: A002
    """Return ``log(p / (1 - p))``, ``p`` clamped to ``[eps, 1 - eps]`` when ``eps`` is
    given."""
    return _tensor(input, "logit").logit(eps)


def logsumexp(input: Tensor, dim: Any, keepdim: bool = False) -> Tensor:  # noqa: A002
    """Return ``log(sum(exp(input)))`` over ``dim``, without overflow."""
    return _tensor(input, "logsumexp").logsumexp(dim, keepdim)


def softmax(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:  # noqa: A002
    """Return the softmax of ``input`` along ``dim`` (computed in ``dtype`` when given)."""
    return _tensor(input, "softmax").softmax(dim, dtype=dtype)


def log_softmax(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:  # noqa: A002
    """Return the log of the softmax of ``input`` along ``dim``."""
    return _tensor(input, "log_softmax").log_softmax(dim, dtype=dtype)


# --------------------------------------------------------------------------------------------
# Unary functions of their own: one UnaryOp each (forward and gradient side by side)


def _i1_grad(m: Any, g: Any, x: Any, o: Any) -> Any:
    # i1' = i0 - i1 / x, 1/2 at 0
    return g * m.where(x == 0, 0.5, _k.i0(x) - o / m.where(x == 0, 1, x))


def _i1e_grad(m: Any, g: Any, x: Any, o: Any) -> Any:
    # (exp(-|x|) i1)' = i0e - i1e (sign(x) + 1/x), 1/2 at 0
    return g * m.where(x == 0, 0.5, _k.i0e(x) - o * (m.sign(x) + 1 / m.where(x == 0, 1, x)))


def _entr(m: Any, x: Any) -> Any:
    out = m.where(x > 0, -x * m.log(m.where(x > 0, x, 1)), 0)
    return m.where(x < 0, -m.inf, m.where(m.isnan(x), x, out)).astype(x.dtype, copy=False)


def _spherical_j0(m: Any, x: Any) -> Any:
    # sin(x)/x; its series 1 - x^2/6 + x^4/120 where |x| < 1e-2 (no 0/0, no cancellation)
    x2 = x * x
    small = m.abs(x) < 1e-2
    series = 1 - x2 / 6 * (1 - x2 / 20 * (1 - x2 / 42))
    return m.where(small, series, m.sin(x) / m.where(small, 1, x)).astype(x.dtype, copy=False)


def _spherical_j0_grad(m: Any, g: Any, x: Any, o: Any) -> Any:
    # (sin x / x)' = (cos x - sin x / x) / x; -x/3 (1 - x^2/10) near 0
    small = m.abs(x) < 1e-2
    return g * m.where(small, -x / 3 * (1 - x * x / 10),
                       (m.cos(x) - o) / m.where(small, 1, x))


# name, what the gradient reads ("x" input, "o" output), forward, gradient
_UNARY = [
    ("erfcx", "xo", lambda m, x: _k.erfcx(x),
     lambda m, g, x, o: g * (2 * x * o - _TWO_OVER_SQRT_PI)),
    ("ndtr", "x", lambda m, x: (0.5 * _k.erfc(-x * _SQRT_HALF)).astype(x.dtype),
     lambda m, g, x, o: g * (m.exp(-0.5 * x * x) / _SQRT_2PI)),
    ("ndtri", "o", lambda m, x: _k.ndtri(x),
     lambda m, g, x, o: g * (_SQRT_2PI * m.exp(0.5 * o * o))),
    ("log_ndtr", "x", lambda m, x: _k.log_ndtr(x),
     lambda m, g, x, o: g * (_SQRT_2_OVER_PI / _k.erfcx(-x * _SQRT_HALF))),
    ("i0", "x", lambda m, x: _k.i0(x), lambda m, g, x, o: g * _k.i1(x)),
    ("i0e", "xo", lambda m, x: _k.i0e(x), lambda m, g, x, o: g * (_k.i1e(x) - m.sign(x) * o)),
    ("i1", "xo", lambda m, x: _k.i1(x), _i1_grad),
    ("i1e", "xo", lambda m, x: _k.i1e(x), _i1e_grad),
    ("entr", "x", _entr, lambda m, g, x, o: g * -(m.log(x) + 1)),
    ("spherical_bessel_j0", "xo", _spherical_j0, _spherical_j0_grad),
]


def _unary(name: str, keeps: str, compute: Any, grad: Any) -> Any:
    cls = computes_in_float32(type(f"Special_{name}", (UnaryOp,), {
        "__doc__": f"``special.{name}(x)`` element-wise, with its gradient.",
        "__module__": __name__, "ints": "float", "keeps": keeps, "name_": name,
        "compute": staticmethod(compute), "grad": staticmethod(grad)}))

    def fn(input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return run(cls, _tensor(input, name))

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Return ``{name}`` of every element (differentiable)."
    return fn


(erfcx, ndtr, ndtri, log_ndtr, i0, i0e, i1, i1e, entr,
 spherical_bessel_j0) = (_unary(*row) for row in _UNARY)
erfcx.__doc__ = "Return the scaled complementary error function ``exp(x^2) erfc(x)``."
ndtr.__doc__ = "Return the standard normal distribution function ``P(N(0, 1) <= x)``."
ndtri.__doc__ = "Return the inverse of :func:`ndtr` (the standard normal quantile)."
log_ndtr.__doc__ = "Return ``log(ndtr(x))``, accurate in both tails."
i0.__doc__ = "Return the modified Bessel function of the first kind of order 0."
i0e.__doc__ = "Return ``exp(-|x|) i0(x)`` (no overflow)."
i1.__doc__ = "Return the modified Bessel function of the first kind of order 1."
i1e.__doc__ = "Return ``exp(-|x|) i1(x)`` (no overflow)."
entr.__doc__ = "Return the entropy term ``-x log(x)`` (0 at 0, -inf for x < 0)."
spherical_bessel_j0.__doc__ = "Return the spherical Bessel function ``j0(x) = sin(x) / x``."
modified_bessel_i0, modified_bessel_i1 = i0, i1  # torch's names for the same functions


class _Polygamma(UnaryOp):
    """``polygamma(n, x)``: its gradient is ``polygamma(n + 1, x)``."""

    ints = "float"
    keeps = "x"
    name_ = "polygamma"

    @staticmethod
    def compute(m: Any, x: Any, n: int) -> Any:
        return _k.polygamma(n, x)

    @staticmethod
    def grad(m: Any, g: Any, x: Any, out: Any, n: int) -> Any:
        return g * _k.polygamma(n + 1, x)


_Polygamma = computes_in_float32(_Polygamma)


def polygamma(n: int, input: Tensor) -> Tensor:  # noqa: A002
    """Return the ``n``-th derivative of the digamma function at each element.

    Raises:
        ValueError: a negative ``n``.
    """
    if int(n) != n or n < 0:
        raise ValueError(f"special.polygamma(): n must be a non-negative integer, got {n!r}")
    return run(_Polygamma, _tensor(input, "polygamma"), int(n))


def multigammaln(input: Tensor, p: int) -> Tensor:  # noqa: A002
    """Return the log of the multivariate gamma function of dimension ``p``:
    ``p (p - 1) / 4 log(pi) + sum_{j < p} gammaln(x - j / 2)``.

    Raises:
        ValueError: ``p < 1``, or an element not above ``(p - 1) / 2``.
    """
    x = _tensor(input, "multigammaln")
    if p < 1:
        raise ValueError(f"special.multigammaln(): p must be at least 1, got {p}")
    if bool((x <= (p - 1) / 2).any()):
        raise ValueError(f"special.multigammaln(): all elements must be greater than "
                         f"(p - 1) / 2 = {(p - 1) / 2}")
    total = x.lgamma()
    for j in range(1, p):
        total = total + (x - j / 2).lgamma()
    return total + p * (p - 1) / 4 * math.log(math.pi)


# --------------------------------------------------------------------------------------------
# Binary functions: BinaryOps run through the operators' promotion and broadcasting


def _module(x: Any, y: Any) -> Any:
    return xp(x) if hasattr(x, "dtype") and np.ndim(x) else (
        xp(y) if hasattr(y, "dtype") else np)


def xlog1py_op(x: Any, y: Any) -> Any:
    """``x * log1p(y)`` on arrays, 0 where x == 0 (unless y is NaN)."""
    m = _module(x, y)
    with np.errstate(all="ignore"):
        return m.where((x == 0) & ~m.isnan(y), 0, x * m.log1p(y))


class Xlog1py(BinaryOp):
    """``x * log1p(y)``: d/dx = log1p(y) (0 where x == 0 and y <= -1), d/dy = x / (1 + y)."""

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        m = xp(g)
        ga = gb = None
        with np.errstate(all="ignore"):
            if need_a:
                ga = g * m.where((a == 0) & (b <= -1), 0, m.log1p(b))
            if need_b:
                gb = g * (a / (b + 1))
        return ga, gb


def zeta_op(x: Any, q: Any) -> Any:
    """The Hurwitz zeta function on arrays."""
    return _k.zeta(x, q)


class Zeta(BinaryOp):
    """``zeta(x, q)``: d/dq = -x zeta(x + 1, q); no gradient for ``x``, as in torch."""

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        if need_a:
            raise RuntimeError("special.zeta(): the derivative with respect to x (the first "
                               "argument) is not implemented; detach it (x.detach())")
        return None, (g * (-a * _k.zeta(a + 1, b)) if need_b else None)


def gammainc_op(a: Any, x: Any) -> Any:
    """The regularized lower incomplete gamma function on arrays."""
    return _k.gammainc(a, x)


def gammaincc_op(a: Any, x: Any) -> Any:
    """The regularized upper incomplete gamma function on arrays."""
    return _k.gammainc(a, x, upper=True)


class GammaInc(BinaryOp):
    """``gammainc(a, x)``: d/dx = x^(a-1) e^-x / Gamma(a); no gradient for ``a``, as in
    torch. :class:`GammaIncc`, its complement, has the opposite one."""

    sign = 1.0

    @classmethod
    def _grads(cls, ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool,
               need_b: bool) -> tuple:
        if need_a:
            raise RuntimeError(f"special.{cls.__name__.lower()}(): the derivative with respect "
                               f"to the first argument is not implemented; detach it")
        if not need_b:
            return None, None
        m = xp(g)
        with np.errstate(all="ignore"):
            d = m.exp((a - 1) * m.log(b) - b - _k.lgamma(m.asarray(a, dtype=b.dtype)))
        return None, g * (cls.sign * d)


class GammaIncc(GammaInc):
    """``gammaincc(a, x) = 1 - gammainc(a, x)``: d/dx = -x^(a-1) e^-x / Gamma(a)."""

    sign = -1.0


FUNCTION_OF.update({xlog1py_op: Xlog1py, zeta_op: Zeta, gammainc_op: GammaInc,
                    gammaincc_op: GammaIncc})


def _binary(op: Any, input: Any, other: Any, fname: str) -> Tensor:  # noqa: A002
    if isinstance(input, Tensor):
        r = binary(input, other, op, TRUEDIV)
    elif isinstance(other, Tensor):
        r = binary(other, input, op, TRUEDIV, rev=True)
    else:
        r = NotImplemented
    if r is NotImplemented:
        raise TypeError(f"special.{fname}(): takes tensors and numbers (one of them a tensor), "
                        f"got {type(input).__name__} and {type(other).__name__}")
    return r


def xlogy(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Return ``input * log(other)``, 0 where ``input`` is 0 (unless ``other`` is NaN)."""
    return _binary(xlogy_op, input, other, "xlogy")


def xlog1py(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Return ``input * log1p(other)``, 0 where ``input`` is 0 (unless ``other`` is NaN)."""
    return _binary(xlog1py_op, input, other, "xlog1py")


def zeta(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Return the Hurwitz zeta function ``sum_k (k + other) ** -input``, element-wise
    (differentiable in ``other`` only, as torch)."""
    return _binary(zeta_op, input, other, "zeta")


def gammainc(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Return the regularized lower incomplete gamma function ``P(input, other)``
    (differentiable in ``other`` only, as torch)."""
    return _binary(gammainc_op, input, other, "gammainc")


def gammaincc(input: Any, other: Any) -> Tensor:  # noqa: A002
    """Return the regularized upper incomplete gamma function ``Q = 1 - P``
    (differentiable in ``other`` only, as torch)."""
    return _binary(gammaincc_op, input, other, "gammaincc")


# --------------------------------------------------------------------------------------------
# Functions torch does not differentiate: Bessel functions of the second kind, Airy's Ai and
# the orthogonal polynomials. A backward through them raises.


def _no_derivative(name: str) -> RuntimeError:
    return RuntimeError(f"special.{name}(): the derivative is not implemented (torch defines "
                        f"none either); detach the input (x.detach()) if the gradient through "
                        f"it is meant to be zero")


def _no_grad_unary(name: str, kernel: Any, doc: str) -> Any:
    def grad(m: Any, g: Any, x: Any, o: Any) -> Any:
        raise _no_derivative(name)

    cls = computes_in_float32(type(f"Special_{name}", (UnaryOp,), {
        "__doc__": f"``special.{name}(x)`` element-wise; no derivative.",
        "__module__": __name__, "ints": "float", "keeps": "", "name_": name,
        "compute": staticmethod(lambda m, x: kernel(x)), "grad": staticmethod(grad)}))

    def fn(input: Tensor, *, out: Optional[Tensor] = None) -> Tensor:  # noqa: A002
        r = run(cls, _tensor(input, name))
        return r if out is None else write_out(out, r, f"special.{name}")

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Return {doc}, element-wise (no derivative, as in torch)."
    return fn


airy_ai = _no_grad_unary("airy_ai", _ba.airy_ai, "Airy's function ``Ai(x)``")
bessel_j0 = _no_grad_unary("bessel_j0", _ba.j0, "the Bessel function of the first kind ``J0``")
bessel_j1 = _no_grad_unary("bessel_j1", _ba.j1, "the Bessel function of the first kind ``J1``")
bessel_y0 = _no_grad_unary("bessel_y0", _ba.y0, "the Bessel function of the second kind ``Y0``")
bessel_y1 = _no_grad_unary("bessel_y1", _ba.y1, "the Bessel function of the second kind ``Y1``")
modified_bessel_k0 = _no_grad_unary("modified_bessel_k0", _ba.k0,
                                    "the modified Bessel function of the second kind ``K0``")
modified_bessel_k1 = _no_grad_unary("modified_bessel_k1", _ba.k1,
                                    "the modified Bessel function of the second kind ``K1``")
scaled_modified_bessel_k0 = _no_grad_unary("scaled_modified_bessel_k0", _ba.k0e,
                                           "``exp(x) K0(x)`` (no underflow)")
scaled_modified_bessel_k1 = _no_grad_unary("scaled_modified_bessel_k1", _ba.k1e,
                                           "``exp(x) K1(x)`` (no underflow)")


class _Polynomial(BinaryOp):
    """An orthogonal polynomial ``p_n(x)``: no derivative in either argument, as torch."""

    read_by = ("", "", "")
    name_ = ""

    @classmethod
    def _grads(cls, ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool,
               need_b: bool) -> tuple:
        raise _no_derivative(cls.name_)


def _polynomial(kind: str, what: str) -> Any:
    name = kind.replace("chebyshev_", "chebyshev_polynomial_").replace(
        "hermite_", "hermite_polynomial_").replace("laguerre_", "laguerre_polynomial_").replace(
        "legendre_", "legendre_polynomial_")

    def op(x: Any, n: Any) -> Any:
        return _poly.polynomial(kind, x, n)

    op.__name__ = op.__qualname__ = f"{name}_op"
    FUNCTION_OF[op] = type(f"Polynomial_{name}", (_Polynomial,), {"name_": name})

    def fn(x: Any, n: Any, *, out: Optional[Tensor] = None) -> Tensor:
        r = _binary(op, x, n, name)
        return r if out is None else write_out(out, r, f"special.{name}")

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"Return {what} of degree ``n`` at ``x``, element-wise (``x`` and ``n`` "
                  f"broadcast; one of them a tensor). ``n`` is truncated to an integer; a "
                  f"negative ``n`` gives 0. No derivative, as in torch.")
    return fn


(chebyshev_polynomial_t, chebyshev_polynomial_u, chebyshev_polynomial_v, chebyshev_polynomial_w,
 shifted_chebyshev_polynomial_t, shifted_chebyshev_polynomial_u, shifted_chebyshev_polynomial_v,
 shifted_chebyshev_polynomial_w, hermite_polynomial_h, hermite_polynomial_he,
 laguerre_polynomial_l, legendre_polynomial_p) = (
    _polynomial(kind, what) for kind, what in zip(_poly.KINDS, (
        "the Chebyshev polynomial of the first kind ``T_n``",
        "the Chebyshev polynomial of the second kind ``U_n``",
        "the Chebyshev polynomial of the third kind ``V_n``",
        "the Chebyshev polynomial of the fourth kind ``W_n``",
        "the shifted Chebyshev polynomial ``T_n(2x - 1)``",
        "the shifted Chebyshev polynomial ``U_n(2x - 1)``",
        "the shifted Chebyshev polynomial ``V_n(2x - 1)``",
        "the shifted Chebyshev polynomial ``W_n(2x - 1)``",
        "the (physicists') Hermite polynomial ``H_n``",
        "the (probabilists') Hermite polynomial ``He_n``",
        "the Laguerre polynomial ``L_n``",
        "the Legendre polynomial ``P_n``")))
