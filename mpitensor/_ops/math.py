"""Element-wise math beyond Python's operators: trigonometric, hyperbolic, exponential and
logarithmic functions, rounding, special functions (``erf``, ``lgamma``, ...), predicates
(``isnan``, ...), binary functions (``atan2``, ``hypot``, ``logaddexp``, ``fmod``, ``xlogy``,
``maximum``, ...), the named comparisons and logical/bitwise functions, with their in-place
``_`` forms and gradients.

A unary op is one row of :data:`_UNARY`: its name, what it does to integer and bool inputs,
which arrays its gradient reads, and the forward and the gradient side by side; the rows become
:class:`~mpitensor.autograd.Function` classes, Tensor methods and their in-place forms. Half
inputs are computed in float32 and rounded once, as torch's CPU kernels do. A binary op is one
:class:`~mpitensor._ops.operators.BinaryOp` subclass, run through ``_operators.binary`` so that
promotion, devices and recording work as for the operators. In-place forms go through
``mpitensor.autograd.apply_inplace`` when autograd must record them (version counters, views).

Example:
    >>> import mpitensor as mt
    >>> x = mt.tensor([0.0, 1.0], requires_grad=True)
    >>> x.sin().sum().backward()
    >>> x.grad
    tensor([1.0000, 0.5403])
"""

from __future__ import annotations

import math
import operator
from collections import namedtuple
from typing import Any, Optional

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import dtypes as _dt
from mpitensor._core import autocast as _autocast
from mpitensor._core.devices import same_device, xp
from mpitensor._core.half import computes_in_float32
from mpitensor._core.opkit import (
    assign_result,
    run,
    run_inplace,
    run_view,
    tensor_methods,
    wrap,
)
from mpitensor._core.promotion import is_scalar, result_type
from mpitensor._ops import special as _special
from mpitensor._ops.elementwise import Abs, Exp, Log, Neg, Sigmoid, Sqrt, Tanh
from mpitensor._ops.operators import (
    ARITH,
    COMPARE,
    DIVLIKE,
    FUNCTION_OF,
    NOT_OPERAND,
    TRUEDIV,
    BinaryOp,
    Remainder,
    binary,
    binary_inplace,
    max_min_pair,
    operand,
)
from mpitensor._ops.views import Alias
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

_grad_mode = _autograd._mode
_LN2 = math.log(2.0)
_LN10 = math.log(10.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_SQRT_PI_OVER_TWO = math.sqrt(math.pi) / 2.0


# --------------------------------------------------------------------------------------------
# Unary functions


class UnaryOp(Function):
    """Base of the unary ops: ``compute(m, x, *args)`` on the array (``m`` its module) and
    ``grad(m, g, x, out, *args)``; ``keeps`` names what the gradient reads (``x``, ``o``)."""

    ints = "float"  # integer and bool inputs: "float" promoted, "keep", "refuse", "keep_int"
    keeps = ""
    name_ = ""

    @classmethod
    def prepare(cls, x: Any) -> Any:
        k = _dt.kind_of(x.dtype)
        if k in "biu":
            rule = cls.ints
            if rule == "float":
                return x.astype(_dt.get_default_dtype())
            if rule == "refuse" or (rule == "keep_int" and k == "b"):
                raise TypeError(
                    f"{cls.name_}() is not implemented for {_dt.dt_repr(x.dtype)} tensors; "
                    f"convert first, e.g. t.float()"
                )
        return x

    @classmethod
    def forward(cls, ctx: Any, x: Any, *args: Any) -> Any:
        x = cls.prepare(x)
        m = xp(x)
        with np.errstate(all="ignore"):
            out = cls.compute(m, x, *args)
        if ctx.needs_input_grad:  # recorded
            keeps = cls.keeps
            ctx.args = args
            ctx.meta = (x.shape, x.dtype)
            ctx.save_for_backward(x if "x" in keeps else None, out if "o" in keeps else None)
        return out

    @classmethod
    def backward(cls, ctx: Any, g: Any) -> tuple:
        x, out = ctx.saved_tensors
        m = xp(g)
        with np.errstate(all="ignore"):
            if ctx.meta[1].kind == "c":  # holomorphic: g * conj(f'), torch's convention
                gx = m.conj(cls.grad(m, m.conj(g), x, out, *ctx.args))
            else:
                gx = cls.grad(m, g, x, out, *ctx.args)
        if gx.dtype != g.dtype:
            gx = gx.astype(g.dtype)
        return (gx, *(None for _ in ctx.args))

    @staticmethod
    def compute(m: Any, x: Any, *args: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def grad(m: Any, g: Any, x: Any, out: Any, *args: Any) -> Any:
        raise NotImplementedError


def zero_gradient(m: Any, g: Any, x: Any, out: Any, *args: Any) -> Any:
    return m.zeros_like(g)


def _same_grad(m: Any, g: Any, x: Any, out: Any, *args: Any) -> Any:
    return g


def _int_kept(fn: Any) -> Any:
    """``fn`` for floats; a copy of integer arrays (rounding an integer changes nothing)."""
    def compute(m: Any, x: Any, *args: Any) -> Any:
        return x.copy() if _dt.kind_of(x.dtype) in "biu" else fn(m, x, *args)
    return compute


def _round(m: Any, x: Any, decimals: int = 0) -> Any:
    if _dt.kind_of(x.dtype) in "biu":
        return x.copy()
    if decimals == 0:
        return m.rint(x)
    # as torch: scale by a power of ten held in the tensor's dtype, round half to even, unscale
    p = x.dtype.type(10.0 ** abs(decimals))
    return m.rint(x / p) * p if decimals < 0 else m.rint(x * p) / p


def _sign(m: Any, x: Any) -> Any:
    if x.dtype.kind == "b":
        return x.copy()
    if x.dtype.kind == "c":
        a = m.abs(x)
        return m.where(a == 0, 0, x / m.where(a == 0, 1, a)).astype(x.dtype)
    if x.dtype.kind == "u":
        return (x > 0).astype(x.dtype)
    # (x > 0) - (x < 0), as torch: NaN gives 0 where NumPy's sign gives NaN
    return ((x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)).astype(x.dtype, copy=False)


def _sgn_grad(m: Any, h: Any, x: Any, out: Any) -> Any:
    """sign's gradient: 0 for real x; for complex x (``sgn``), with s = x/|x|, the adjoint of
    ds = (dx - s Re(conj(s) dx)) / |x|, that is (g - s Re(g conj(s))) / |x| (0 at 0), returned
    conjugated and of ``h = conj(g)`` as UnaryOp's backward asks of complex inputs."""
    if x.dtype.kind != "c":
        return m.zeros_like(h)
    a = m.abs(x)
    s = x / m.where(a == 0, 1, a)
    return m.where(a == 0, 0, (h - m.conj(s) * (h * s).real) / m.where(a == 0, 1, a))


def _square(m: Any, x: Any) -> Any:
    if x.dtype.kind == "b":
        x = x.astype(_dt.int64)
    return x * x


def _sinc(m: Any, x: Any) -> Any:
    px = math.pi * x
    return m.where(x == 0, x.dtype.type(1), m.sin(px) / px)


def _sinc_grad(m: Any, g: Any, x: Any, out: Any) -> Any:
    px = math.pi * x
    d = (m.cos(px) * px - m.sin(px)) / (px * x)
    return g * m.where(x == 0, 0, d)


def _logit(m: Any, x: Any, eps: Optional[float] = None) -> Any:
    one = x.dtype.type(1)
    if eps is not None:
        x = m.clip(x, x.dtype.type(eps), x.dtype.type(1.0 - eps))
    return m.log(x / (one - x))


def _logit_grad(m: Any, g: Any, x: Any, out: Any, eps: Optional[float] = None) -> Any:
    d = g / (x * (x.dtype.type(1) - x))
    if eps is None:
        return d
    return m.where((x < eps) | (x > 1.0 - eps), 0, d)


def _erf_grad(m: Any, g: Any, x: Any, out: Any) -> Any:
    return g * (_TWO_OVER_SQRT_PI * m.exp(-x * x))


def _trig(name: str) -> Any:
    def compute(m: Any, x: Any) -> Any:
        return getattr(m, name)(x)
    return compute


# name, integer/bool rule, what the gradient reads ("x" input, "o" output), forward, gradient
_UNARY = [
    ("sin", "float", "x", _trig("sin"), lambda m, g, x, o: g * m.cos(x)),
    ("cos", "float", "x", _trig("cos"), lambda m, g, x, o: -(g * m.sin(x))),
    ("tan", "float", "o", _trig("tan"), lambda m, g, x, o: g * (1 + o * o)),
    ("asin", "float", "x", _trig("arcsin"), lambda m, g, x, o: g / m.sqrt(1 - x * x)),
    ("acos", "float", "x", _trig("arccos"), lambda m, g, x, o: -(g / m.sqrt(1 - x * x))),
    ("atan", "float", "x", _trig("arctan"), lambda m, g, x, o: g / (1 + x * x)),
    ("sinh", "float", "x", _trig("sinh"), lambda m, g, x, o: g * m.cosh(x)),
    ("cosh", "float", "x", _trig("cosh"), lambda m, g, x, o: g * m.sinh(x)),
    ("asinh", "float", "x", _trig("arcsinh"), lambda m, g, x, o: g / m.sqrt(x * x + 1)),
    ("acosh", "float", "x", _trig("arccosh"), lambda m, g, x, o: g / (  # (torch's branches)
        m.sqrt(x - 1) * m.sqrt(x + 1) if x.dtype.kind == "c" else m.sqrt(x * x - 1))),
    ("atanh", "float", "x", _trig("arctanh"), lambda m, g, x, o: g / (1 - x * x)),
    ("exp2", "float", "o", _trig("exp2"), lambda m, g, x, o: g * (o * _LN2)),
    ("expm1", "float", "o", _trig("expm1"), lambda m, g, x, o: g * (o + 1)),
    ("log2", "float", "x", _trig("log2"), lambda m, g, x, o: g / (x * _LN2)),
    ("log10", "float", "x", _trig("log10"), lambda m, g, x, o: g / (x * _LN10)),
    ("log1p", "float", "x", _trig("log1p"), lambda m, g, x, o: g / (x + 1)),
    ("reciprocal", "float", "o", lambda m, x: 1 / x, lambda m, g, x, o: -(g * (o * o))),
    ("rsqrt", "float", "o", lambda m, x: 1 / m.sqrt(x),
     lambda m, g, x, o: g * (-0.5 * o * o * o)),
    ("square", "keep", "x", _square, lambda m, g, x, o: g * (2 * x)),
    ("sign", "keep", "x", _sign, _sgn_grad),
    ("floor", "keep_int", "", _int_kept(_trig("floor")), zero_gradient),
    ("ceil", "keep_int", "", _int_kept(_trig("ceil")), zero_gradient),
    ("trunc", "keep_int", "", _int_kept(_trig("trunc")), zero_gradient),
    ("round", "keep_int", "", _round, zero_gradient),
    ("frac", "refuse", "", lambda m, x: x - m.trunc(x), _same_grad),
    ("erf", "float", "x", lambda m, x: _special.erf(x), _erf_grad),
    ("erfc", "float", "x", lambda m, x: _special.erfc(x),
     lambda m, g, x, o: -_erf_grad(m, g, x, o)),
    ("erfinv", "float", "o", lambda m, x: _special.erfinv(x),
     lambda m, g, x, o: g * (_SQRT_PI_OVER_TWO * m.exp(o * o))),
    ("lgamma", "float", "x", lambda m, x: _special.lgamma(x),
     lambda m, g, x, o: g * _special.digamma(x)),
    ("digamma", "float", "x", lambda m, x: _special.digamma(x),
     lambda m, g, x, o: g * _special.trigamma(x)),
    ("sinc", "float", "x", _sinc, _sinc_grad),
    ("deg2rad", "float", "", lambda m, x: x * x.dtype.type(math.pi / 180),
     lambda m, g, x, o: g * (math.pi / 180)),
    ("rad2deg", "float", "", lambda m, x: x * x.dtype.type(180 / math.pi),
     lambda m, g, x, o: g * (180 / math.pi)),
    ("logit", "float", "x", _logit, _logit_grad),
]

_UNARY_FN: dict = {}


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.split("_"))


# torch computes these on half tensors one rounded step at a time, not in float32 at once
_HALF_STEPWISE = frozenset({"logit"})

for _name, _ints, _keeps, _compute, _grad in _UNARY:
    _cls = type(_camel(_name), (UnaryOp,), {
        "__doc__": f"``{_name}(x)`` element-wise, with its gradient.",
        "__module__": __name__,
        "ints": _ints, "keeps": _keeps, "name_": _name,
        "compute": staticmethod(_compute), "grad": staticmethod(_grad),
    })
    _UNARY_FN[_name] = _cls if _name in _HALF_STEPWISE else computes_in_float32(_cls)


class NanToNum(UnaryOp):
    """``nan_to_num(x, nan, posinf, neginf)``: NaN and infinities replaced (by the dtype's
    largest finite numbers by default); the gradient passes where ``x`` is finite. Computed
    in ``x``'s own dtype, so that the defaults are that dtype's limits."""

    ints = "keep"
    keeps = "x"
    name_ = "nan_to_num"

    @staticmethod
    def compute(m: Any, x: Any, nan: float, posinf: Optional[float],
                neginf: Optional[float]) -> Any:
        if _dt.kind_of(x.dtype) in "biu":
            return x.copy()
        fi = _dt.finfo(x.dtype)
        dt = x.dtype

        def val(v: Any, default: float) -> Any:
            return m.asarray(default if v is None else v).astype(dt)

        out = m.where(m.isnan(x), val(nan, 0.0), x)
        out = m.where(out == m.inf, val(posinf, fi.max), out)
        out = m.where(out == -m.inf, val(neginf, -fi.max), out)
        return out.astype(dt, copy=False)

    @staticmethod
    def grad(m: Any, g: Any, x: Any, out: Any, *args: Any) -> Any:
        return g * m.isfinite(x)


_UNARY_FN["nan_to_num"] = NanToNum
_UNARY_FN.update({"abs": Abs, "neg": Neg, "exp": Exp, "log": Log, "sqrt": Sqrt,
                  "sigmoid": Sigmoid, "tanh": Tanh})

# torch's other names for the same ops
_UNARY_ALIASES = {
    "arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh",
    "arccosh": "acosh", "arctanh": "atanh", "fix": "trunc", "absolute": "abs",
    "negative": "neg",
}


def _unary_method(name: str) -> Any:
    fn = _UNARY_FN[name]

    def method(self: Tensor) -> Tensor:
        if _autocast.ON and _autocast.active():
            return _autocast.run(name, method, self)
        return run(fn, self)

    method.__name__ = name
    method.__doc__ = f"Return ``{name}`` of every element (differentiable)."
    return method


def _unary_inplace_method(name: str, alias: Optional[str] = None) -> Any:
    fn = _UNARY_FN[name]
    what = f"{alias or name}_()"

    def method(self: Tensor) -> Tensor:
        return run_inplace(self, fn, what)

    method.__name__ = f"{alias or name}_"
    method.__doc__ = (f"Replace every element by its ``{name}``, in place; returns self.\n\n"
                      f"Raises:\n    TypeError: the result's dtype does not fit self's.\n"
                      f"    RuntimeError: self is a leaf that requires grad.")
    return method


_methods: dict = {}
for _name in _UNARY_FN:
    if _name in ("round", "logit", "nan_to_num"):
        continue  # arguments: written out below
    if _name not in ("abs", "neg", "exp", "log", "sqrt", "sigmoid", "tanh"):
        _methods[_name] = _unary_method(_name)
    _methods[f"{_name}_"] = _unary_inplace_method(_name)
for _alias, _name in _UNARY_ALIASES.items():
    _methods[_alias] = _unary_method(_name)
    _methods[_alias].__name__ = _alias
    _methods[f"{_alias}_"] = _unary_inplace_method(_name, _alias)
_methods["sgn"] = _unary_method("sign")
_methods["sgn"].__name__ = "sgn"
_methods["sgn_"] = _unary_inplace_method("sign", "sgn")
tensor_methods(type("_UnaryMethods", (), _methods))


def _predicate(fn: Any, ints: Any) -> Any:
    """A predicate as a bool tensor: ``fn(m, x)`` for floats, ``ints(m, x)`` otherwise."""
    def method(self: Tensor) -> Tensor:
        x = self._data
        m = xp(x)
        if _dt.kind_of(x.dtype) in "biu":
            return wrap(ints(m, x))
        return wrap(fn(m, x))
    return method


def _all(value: bool) -> Any:
    def f(m: Any, x: Any) -> Any:
        return m.full(x.shape, value, dtype=bool)
    return f


_PREDICATES = {
    "isnan": (lambda m, x: m.isnan(x), _all(False)),
    "isinf": (lambda m, x: m.isinf(x), _all(False)),
    "isfinite": (lambda m, x: m.isfinite(x), _all(True)),
    "isposinf": (lambda m, x: m.isposinf(x) if x.dtype.kind == "f" else x == m.inf,
                 _all(False)),
    "isneginf": (lambda m, x: m.isneginf(x) if x.dtype.kind == "f" else x == -m.inf,
                 _all(False)),
    "signbit": (lambda m, x: m.signbit(x),
                lambda m, x: x < 0 if x.dtype.kind == "i" else m.zeros(x.shape, bool)),
    "isreal": (lambda m, x: x.imag == 0 if x.dtype.kind == "c" else m.ones(x.shape, bool),
               _all(True)),
}
_pred_methods = {}
for _name, (_f, _i) in _PREDICATES.items():
    _pred_methods[_name] = _predicate(_f, _i)
    _pred_methods[_name].__name__ = _name
    _pred_methods[_name].__doc__ = f"Return a bool tensor: ``{_name}`` of every element."
tensor_methods(type("_PredicateMethods", (), _pred_methods))


# --------------------------------------------------------------------------------------------
# Binary functions: ``op(x, y)`` on arrays or Python numbers, and their gradients


def _m2(x: Any, y: Any) -> Any:
    return xp(x) if hasattr(x, "dtype") and not is_scalar(x) else (
        xp(y) if hasattr(y, "dtype") and not is_scalar(y) else np)


def _ufunc(name: str) -> Any:
    def op(x: Any, y: Any) -> Any:
        return getattr(_m2(x, y), name)(x, y)
    op.__name__ = name
    op.__qualname__ = name
    return op


(atan2_op, hypot_op, logaddexp_op, logaddexp2_op, fmod_op, copysign_op, fmax_op, fmin_op, gcd_op,
 lcm_op, nextafter_op) = map(_ufunc, ("arctan2", "hypot", "logaddexp", "logaddexp2", "fmod",
                                      "copysign", "fmax", "fmin", "gcd", "lcm", "nextafter"))


def heaviside_op(x: Any, y: Any) -> Any:
    m = _m2(x, y)
    return m.where(x == 0, y, (x > 0)).astype(result_type(x, y))


def xlogy_op(x: Any, y: Any) -> Any:
    m = _m2(x, y)
    return m.where((x == 0) & ~m.isnan(y), 0, x * m.log(y))


class Atan2(BinaryOp):
    """``atan2(a, b)``: d/da = b / (a^2 + b^2), d/db = -a / (a^2 + b^2)."""

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        r = a * a + b * b
        return (g * (b / r) if need_a else None), (g * (-a / r) if need_b else None)


class Hypot(BinaryOp):
    """``hypot(a, b)``: d/da = a / out, d/db = b / out."""

    read_by = ("a", "b", "ab")

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        return (g * (a / out) if need_a else None), (g * (b / out) if need_b else None)


class LogAddExp(BinaryOp):
    """``log(exp(a) + exp(b))``: d/da = 1 / (1 + exp(b - a)), and symmetrically."""

    base = math.e

    @classmethod
    def _grads(cls, ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool,
               need_b: bool) -> tuple:
        m = xp(g)
        p = m.power if cls.base != math.e else None

        def share(u: Any, v: Any) -> Any:
            d = v - u
            return g / (1 + (m.exp(d) if p is None else p(2.0, d)))

        return (share(a, b) if need_a else None), (share(b, a) if need_b else None)


class LogAddExp2(LogAddExp):
    """``log2(2**a + 2**b)``: d/da = 1 / (1 + 2**(b - a)), and symmetrically."""

    base = 2.0


class Fmod(Remainder):
    """``fmod(a, b)`` (C's remainder, the sign of ``a``): d/da = 1, d/db = -trunc(a / b)."""

    @staticmethod
    def _quotient(m: Any, a: Any, b: Any) -> Any:
        return m.trunc(a / b)


class Copysign(BinaryOp):
    """``copysign(a, b)``: d/da = out / a (0 where a == 0); ``b`` gets zeros."""

    read_by = ("a", "", "a")

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        m = xp(g)
        ga = gb = None
        if need_a:
            ga = g * m.where(a == 0, 0, out / m.where(a == 0, 1, a))
        if need_b:
            gb = m.zeros_like(g)
        return ga, gb


class Xlogy(BinaryOp):
    """``x * log(y)``, 0 where x == 0 (unless y is NaN): d/dx = log(y) (0 where x == 0 and
    y <= 0, as torch), d/dy = x / y."""

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        m = xp(g)
        ga = gb = None
        if need_a:
            ga = g * m.where((a == 0) & (b <= 0), 0, m.log(b))
        if need_b:
            gb = g * (a / b)
        return ga, gb


class _FMaxMin(BinaryOp):
    """``fmax``/``fmin``: the NaN-ignoring maximum/minimum; ``a`` gets the gradient where it
    wins, ties included, or ``b`` is NaN; ``b`` elsewhere."""

    is_max = True

    @classmethod
    def _grads(cls, ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool,
               need_b: bool) -> tuple:
        m = xp(g)
        wins = ((a >= b) if cls.is_max else (a <= b)) | m.isnan(b)
        zero = g.dtype.type(0)
        return (m.where(wins, g, zero) if need_a else None), (
            m.where(wins, zero, g) if need_b else None)


Fmax, Fmin = max_min_pair(_FMaxMin, ("Fmax", "Fmin"), ("``fmax(a, b)``.", "``fmin(a, b)``."))


class _ZeroGrad(BinaryOp):
    """A comparison written in place: what it replaced gets zero gradient, as in torch."""

    read_by = ("", "", "")

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        m = xp(g)
        return (m.zeros_like(g) if need_a else None), (m.zeros_like(g) if need_b else None)


FUNCTION_OF.update({
    atan2_op: Atan2, hypot_op: Hypot, logaddexp_op: LogAddExp, logaddexp2_op: LogAddExp2,
    fmod_op: Fmod, copysign_op: Copysign, xlogy_op: Xlogy, fmax_op: Fmax, fmin_op: Fmin,
    operator.eq: _ZeroGrad, operator.ne: _ZeroGrad, operator.lt: _ZeroGrad,
    operator.le: _ZeroGrad, operator.gt: _ZeroGrad, operator.ge: _ZeroGrad,
})

_FLOAT_ONLY = {hypot_op: "hypot", logaddexp_op: "logaddexp", logaddexp2_op: "logaddexp2"}


def _check_float(name: str, *values: Any) -> None:
    for v in values:
        d = getattr(v, "dtype", None)
        if d is not None and not isinstance(v, np.generic) and _dt.kind_of(d) not in "fc":
            raise TypeError(f"{name}() is not implemented for {_dt.dt_repr(d)} tensors; "
                            f"convert first, e.g. t.float()")


def _binary_fn(op: Any, mode: int, name: str) -> Any:
    """The method form ``self.name(other)`` of binary function ``op``."""
    float_only = op in _FLOAT_ONLY

    def method(self: Tensor, other: Any) -> Tensor:
        if float_only:
            _check_float(name, self._data, operand(other))
        r = binary(self, other, op, mode)
        if r is NotImplemented:
            raise TypeError(f"{name}(): other must be a tensor or a number, got "
                            f"{type(other).__name__}")
        return r

    def method_(self: Tensor, other: Any) -> Tensor:
        if float_only:
            _check_float(name, self._data, operand(other))
        return binary_inplace(self, other, op, mode, f"{name}_()")

    method.__name__, method_.__name__ = name, f"{name}_"
    method.__doc__ = f"Return ``{name}(self, other)`` element-wise (broadcasting)."
    method_.__doc__ = f"In place: ``self = {name}(self, other)``; returns self."
    return method, method_


_BINARY = {
    "atan2": (atan2_op, TRUEDIV), "arctan2": (atan2_op, TRUEDIV),
    "hypot": (hypot_op, ARITH), "logaddexp": (logaddexp_op, ARITH),
    "logaddexp2": (logaddexp2_op, ARITH), "fmod": (fmod_op, DIVLIKE),
    "copysign": (copysign_op, TRUEDIV), "xlogy": (xlogy_op, TRUEDIV),
    "fmax": (fmax_op, ARITH), "fmin": (fmin_op, ARITH), "gcd": (gcd_op, ARITH),
    "lcm": (lcm_op, ARITH), "nextafter": (nextafter_op, ARITH),
    "heaviside": (heaviside_op, ARITH),
}
_bin_methods: dict = {}
for _name, (_op, _mode) in _BINARY.items():
    _m, _m_ = _binary_fn(_op, _mode, _name)
    _bin_methods[_name] = _m
    if _name not in ("fmax", "fmin", "logaddexp", "logaddexp2"):  # torch has no in-place
        _bin_methods[f"{_name}_"] = _m_

_COMPARISONS = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
    "gt": operator.gt, "ge": operator.ge, "greater": operator.gt,
    "greater_equal": operator.ge, "less": operator.lt, "less_equal": operator.le,
    "not_equal": operator.ne,
}


def _comparison(op: Any, name: str) -> tuple:
    def method(self: Tensor, other: Any) -> Tensor:
        return binary(self, other, op, COMPARE)

    def method_(self: Tensor, other: Any) -> Tensor:
        return binary_inplace(self, other, op, COMPARE, f"{name}_()")

    method.__name__, method_.__name__ = name, f"{name}_"
    method.__doc__ = f"Return the bool tensor ``{name}(self, other)`` (broadcasting)."
    method_.__doc__ = (f"In place: ``self = {name}(self, other)`` as 1 and 0 in self's dtype; "
                       f"returns self.")
    return method, method_


for _name, _op in _COMPARISONS.items():
    _m, _m_ = _comparison(_op, _name)
    if _name in ("greater", "greater_equal", "less", "less_equal", "not_equal"):
        _bin_methods[_name] = _m
    _bin_methods[f"{_name}_"] = _m_


def _logical(name: str) -> tuple:
    def compute(self: Tensor, other: Any) -> Any:
        y = operand(other)
        if y is NOT_OPERAND:
            raise TypeError(f"{name}(): other must be a tensor or a number, got "
                            f"{type(other).__name__}")
        x, y = same_device(self._data, y)
        return getattr(xp(x), name)(x, y)

    def method(self: Tensor, other: Any) -> Tensor:
        return wrap(compute(self, other))

    def method_(self: Tensor, other: Any) -> Tensor:
        return assign_result(self, wrap(compute(self, other)), f"{name}_()")

    method.__name__, method_.__name__ = name, f"{name}_"
    method.__doc__ = f"Return the bool tensor ``{name}(self, other)`` (non-zero is true)."
    method_.__doc__ = f"In place: ``self = {name}(self, other)`` in self's dtype; returns self."
    return method, method_


for _name in ("logical_and", "logical_or", "logical_xor"):
    _bin_methods[_name], _bin_methods[f"{_name}_"] = _logical(_name)

_BITWISE = {
    "bitwise_and": (operator.and_, operator.iand), "bitwise_or": (operator.or_, operator.ior),
    "bitwise_xor": (operator.xor, operator.ixor),
    "bitwise_left_shift": (operator.lshift, operator.ilshift),
    "bitwise_right_shift": (operator.rshift, operator.irshift),
}


def _bitwise(name: str, op: Any, iop: Any) -> tuple:
    def method(self: Tensor, other: Any) -> Tensor:
        x = self._data
        if _dt.kind_of(x.dtype) not in "biu":
            raise TypeError(f"{name}() needs integer or bool tensors, got "
                            f"{_dt.dt_repr(x.dtype)}")
        r = op(self, other)
        if r is NotImplemented:
            raise TypeError(f"{name}(): other must be a tensor or a number")
        return r

    def method_(self: Tensor, other: Any) -> Tensor:
        r = iop(self, other)
        if r is NotImplemented:
            raise TypeError(f"{name}_(): other must be a tensor or a number")
        return r

    method.__name__, method_.__name__ = name, f"{name}_"
    method.__doc__ = f"Return ``{name}(self, other)`` element-wise (integer and bool tensors)."
    method_.__doc__ = f"In place: ``self = {name}(self, other)``; returns self."
    return method, method_


for _name, (_op, _iop) in _BITWISE.items():
    _bin_methods[_name], _bin_methods[f"{_name}_"] = _bitwise(_name, _op, _iop)
tensor_methods(type("_BinaryMethods", (), _bin_methods))


def _float64_of(v: Any) -> Any:
    if isinstance(v, Tensor):
        return v.to(_dt.complex128 if v.is_complex() else _dt.float64)
    if isinstance(v, complex):
        return v
    return float(v)


_FrexpResult = namedtuple("frexp", ["mantissa", "exponent"])


@tensor_methods
class _MathMethods:
    def frexp(self) -> tuple:
        """Return ``(mantissa, exponent)`` with ``self = mantissa * 2**exponent`` and
        ``|mantissa|`` in [0.5, 1) (exponent int32).

        Raises:
            TypeError: not a floating point tensor.
        """
        x = self._data
        if _dt.kind_of(x.dtype) != "f":
            raise TypeError(f"frexp() needs a floating point tensor, got {_dt.dt_repr(x.dtype)}")
        m = xp(x)
        w = x.astype(_dt.float32) if x.dtype.itemsize == 2 else x
        _, ex = m.frexp(w)
        # the mantissa as self * 2**-exponent (exact), so that it is differentiable
        scale = m.ldexp(m.ones_like(w), -ex).astype(x.dtype)
        mant = self * wrap(m.where(m.isfinite(w), scale, x.dtype.type(1)))
        return _FrexpResult(mant, wrap(ex.astype(_dt.int32)))

    def round(self, *, decimals: int = 0) -> Tensor:
        """Return the elements rounded half to even, to ``decimals`` decimal places."""
        return run(_UNARY_FN["round"], self, int(decimals))

    def round_(self, *, decimals: int = 0) -> Tensor:
        """Round in place (see :meth:`round`); returns self."""
        return run_inplace(self, _UNARY_FN["round"], "round_()", int(decimals))

    def logit(self, eps: Optional[float] = None) -> Tensor:
        """Return ``log(p / (1 - p))``, ``p`` first clamped to ``[eps, 1 - eps]`` if given."""
        return run(_UNARY_FN["logit"], self, eps)

    def logit_(self, eps: Optional[float] = None) -> Tensor:
        """:meth:`logit` in place; returns self."""
        return run_inplace(self, _UNARY_FN["logit"], "logit_()", eps)

    def nan_to_num(self, nan: float = 0.0, posinf: Optional[float] = None,
                   neginf: Optional[float] = None) -> Tensor:
        """Return a copy with NaN, +inf and -inf replaced (by 0 and the dtype's largest
        finite numbers by default)."""
        return run(NanToNum, self, nan, posinf, neginf)

    def nan_to_num_(self, nan: float = 0.0, posinf: Optional[float] = None,
                    neginf: Optional[float] = None) -> Tensor:
        """:meth:`nan_to_num` in place; returns self."""
        return run_inplace(self, NanToNum, "nan_to_num_()", nan, posinf, neginf)

    def positive(self) -> Tensor:
        """Return self (as a view), refusing bool tensors as torch does."""
        if self._data.dtype.kind == "b":
            raise TypeError("positive() does not support bool tensors")
        return run_view(Alias, self)

    def maximum(self, other: Any) -> Tensor:
        """Return the element-wise maximum (NaN wins; ties share the gradient)."""
        return binary(self, other, xp(self._data).maximum)

    def minimum(self, other: Any) -> Tensor:
        """Return the element-wise minimum (NaN wins; ties share the gradient)."""
        return binary(self, other, xp(self._data).minimum)

    def float_power(self, exponent: Any) -> Tensor:
        """Return ``self ** exponent`` computed in float64 (complex128 for complex inputs)."""
        return _float64_of(self) ** _float64_of(exponent)

    def float_power_(self, exponent: Any) -> Tensor:
        """:meth:`float_power` in place; self must be float64 (or complex128).

        Raises:
            TypeError: self has another dtype.
        """
        if self._data.dtype not in (_dt.float64, _dt.complex128):
            raise TypeError(
                f"float_power_() computes in float64 and cannot write into a "
                f"{_dt.dt_repr(self._data.dtype)} tensor; use float_power() or .double() first"
            )
        return self.pow_(_float64_of(exponent))

    def lerp(self, end: Any, weight: Any) -> Tensor:
        """Return ``self + weight * (end - self)`` (computed from ``end`` for weights >= 0.5,
        so that weight 1 gives ``end`` exactly, as in torch)."""
        _check_float("lerp", self._data, operand(end), operand(weight))
        if isinstance(weight, Tensor):
            from mpitensor._ops.combine import where  # noqa: PLC0415 - _combining imports us

            diff = end - self
            return where(weight.abs() < 0.5, self + weight * diff, end - diff * (1 - weight))
        w = float(weight)
        if abs(w) < 0.5:
            return self + w * (end - self)
        return end - (end - self) * (1 - w)

    def lerp_(self, end: Any, weight: Any) -> Tensor:
        """:meth:`lerp` in place; returns self."""
        return assign_result(self, self.lerp(end, weight), "lerp_()")

    def addcmul(self, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
        """Return ``self + value * tensor1 * tensor2``."""
        prod = tensor1 * tensor2
        return self + (prod if value == 1 else prod * value)

    def addcmul_(self, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
        """:meth:`addcmul` in place; returns self."""
        return assign_result(self, self.addcmul(tensor1, tensor2, value=value), "addcmul_()")

    def addcdiv(self, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
        """Return ``self + value * tensor1 / tensor2``.

        Raises:
            TypeError: both ``tensor1`` and ``tensor2`` are integer tensors (torch refuses
                that integer division).
        """
        k1 = _dt.kind_of(operand(tensor1).dtype) if hasattr(operand(tensor1), "dtype") else "f"
        k2 = _dt.kind_of(operand(tensor2).dtype) if hasattr(operand(tensor2), "dtype") else "f"
        if k1 in "biu" and k2 in "biu":
            raise TypeError("addcdiv() does not divide integer tensors; convert tensor1 or "
                            "tensor2 to a float dtype first")
        q = tensor1 / tensor2
        return self + (q if value == 1 else q * value)

    def addcdiv_(self, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
        """:meth:`addcdiv` in place; returns self."""
        return assign_result(self, self.addcdiv(tensor1, tensor2, value=value), "addcdiv_()")

    def ldexp(self, other: Any) -> Tensor:
        """Return ``self * 2 ** other``."""
        r = self * (2.0 ** other)
        return r if r.is_floating_point() or r.is_complex() else r.float()

    def ldexp_(self, other: Any) -> Tensor:
        """:meth:`ldexp` in place; returns self."""
        return assign_result(self, self.ldexp(other), "ldexp_()")

    def isclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08,
                equal_nan: bool = False) -> Tensor:
        """Return where ``|self - other| <= atol + rtol * |other|`` (or equal), as bools.

        Raises:
            TypeError: ``other`` is a tensor of another dtype.
        """
        x = self._data
        y = operand(other)
        if y is NOT_OPERAND:
            raise TypeError(f"isclose(): other must be a tensor, got {type(other).__name__}")
        if hasattr(y, "dtype") and y.dtype != x.dtype:
            raise TypeError(
                f"isclose(): other has dtype {_dt.dt_repr(y.dtype)}, input "
                f"{_dt.dt_repr(x.dtype)}; convert one of them first"
            )
        x, y = same_device(x, y)
        m = xp(x)
        with np.errstate(all="ignore"):
            if x.dtype.kind == "b":
                return wrap(m.broadcast_to(x == y, m.broadcast_shapes(
                    x.shape, getattr(y, "shape", ()))).copy())
            return wrap(m.isclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan))

    def logical_not(self) -> Tensor:
        """Return the bool tensor of the zero elements."""
        x = self._data
        return wrap(xp(x).logical_not(x))

    def logical_not_(self) -> Tensor:
        """In place: zero elements become 1 (True), the others 0; returns self."""
        return assign_result(self, self.logical_not(), "logical_not_()")

    def bitwise_not(self) -> Tensor:
        """Return ``~self`` (integer and bool tensors)."""
        return ~self

    def bitwise_not_(self) -> Tensor:
        """In place: ``self = ~self``; returns self."""
        return assign_result(self, ~self, "bitwise_not_()")

    def clamp_min(self, min: Any) -> Tensor:  # noqa: A002 - torch's name
        """Return ``self.clamp(min=min)``."""
        return self.clamp(min=min)

    def clamp_max(self, max: Any) -> Tensor:  # noqa: A002 - torch's name
        """Return ``self.clamp(max=max)``."""
        return self.clamp(max=max)

    def clamp_min_(self, min: Any) -> Tensor:  # noqa: A002
        """``self.clamp_(min=min)``."""
        return self.clamp_(min=min)

    def clamp_max_(self, max: Any) -> Tensor:  # noqa: A002
        """``self.clamp_(max=max)``."""
        return self.clamp_(max=max)
