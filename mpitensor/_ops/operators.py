"""Python's operators on tensors (``+ - * / // % ** @``, comparisons, bitwise) and their gradients.

``a op b`` goes through :func:`binary` and ``a op= b`` through :func:`inplace` (recorded by
autograd, when an operand requires grad, as the operator's op written into ``a``). Both apply
torch's rules: type promotion (``mpitensor._core.promotion``), bools refused by ``-``, ``//``, ``%``
and ``**``, integers wrapped on overflow, silent division by zero, a CPU zero-dim operand
acting as a number next to a GPU tensor. :func:`_result` is that forward on arrays and numbers,
shared by the unrecorded path and by the differentiable ops below, whose backward sits next to
it (one :class:`~mpitensor.autograd.Function` subclass per operator).

``binary`` itself keeps the common cases (two tensors of one dtype; a float tensor and a Python
number) in its own body: they are most of the operator calls of a training step.

Example:
    >>> import mpitensor as mt
    >>> x = mt.tensor([1.0, 2.0], requires_grad=True)
    >>> (x * x + 1).grad_fn.name()
    'AddBackward'
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any, Optional

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import dtypes as _dt
from mpitensor._core import autocast as _autocast
from mpitensor._core import half as _half
from mpitensor._core.devices import device_str, is_cupy, same_device, xp
from mpitensor._core.opkit import sum_to, tensor_methods, wrap
from mpitensor._core.promotion import can_cast, is_scalar, result_type, true_divide_dtype
from mpitensor.autograd import ArrayFunction as Function, apply_inplace, bump_version, inplace_recorded
from mpitensor.tensor import Tensor, _new

_ndarray = np.ndarray
_grad_mode = _autograd._mode

NOT_OPERAND = object()  # what operand() returns for a value the operator must refuse

# Operation kinds: how the result dtype is found and whether division warnings are silenced.
ARITH, TRUEDIV, COMPARE, DIVLIKE = 0, 1, 2, 3


# --------------------------------------------------------------------------------------------
# Operands


def operand(other: Any) -> Any:
    """The array or Python number on an operator's other side, or ``NOT_OPERAND``."""
    if isinstance(other, Tensor):
        return other._data
    t = type(other)
    if t is float or t is int or t is bool or t is complex:
        return other
    if isinstance(other, np.generic):
        v = other.item()
        return v if is_scalar(v) else NOT_OPERAND
    if isinstance(other, _ndarray) or is_cupy(other):
        return other
    if isinstance(other, (bool, int, float, complex)):  # subclasses such as IntEnum
        for base in (bool, int, float, complex):
            if isinstance(other, base):
                return base(other)
    return NOT_OPERAND


def _cast(v: Any, rt: np.dtype) -> Any:
    if is_scalar(v) or v.dtype == rt:
        return v
    return v.astype(rt)


def fit_grad(g: Any, shape: tuple, dtype: Any) -> Any:
    """A gradient reduced to its input's ``shape`` (undoing broadcasting) and ``dtype``, so a
    float32 leaf used with a float64 operand still gets a float32 ``.grad``."""
    if g.shape != shape:
        g = sum_to(g, shape)
    if g.dtype != dtype:
        if g.dtype.kind == "c" and np.dtype(dtype).kind != "c":
            g = g.real  # a real input of a complex result: the real part, as torch
        g = g.astype(dtype)
    return g


# --------------------------------------------------------------------------------------------
# The forward: torch's rules on arrays and numbers


def _apply(op: Any, x: Any, y: Any, mode: int) -> Any:
    if mode == TRUEDIV or mode == DIVLIKE:
        if isinstance(x, _ndarray) or isinstance(y, _ndarray):
            # torch divides by zero silently (inf / nan) where NumPy warns. np.errstate costs
            # microseconds, so skip it for the common, warning-free "float tensor / number".
            ty = type(y)
            if (ty is float or ty is int) and y != 0 and x.dtype.kind == "f":
                return op(x, y)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return op(x, y)
    return op(x, y)


_SUB_OPS = (operator.sub, operator.isub)
_NO_BOOL_OPS = (operator.floordiv, operator.mod, operator.pow,
                operator.ifloordiv, operator.imod, operator.ipow)


def _check_bool(op: Any, x: Any, y: Any, rt: Optional[np.dtype]) -> None:
    """Refuse what torch refuses for bools: ``-`` with any bool, ``// % **`` on bools."""
    if op in _SUB_OPS and (
        (not is_scalar(x) and x.dtype.kind == "b")
        or (not is_scalar(y) and y.dtype.kind == "b")
        or type(x) is bool
        or type(y) is bool
    ):
        raise TypeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are "
            "trying to invert a mask, use the `~` or `logical_not()` operator instead."
        )
    if rt is not None and rt.kind == "b" and op in _NO_BOOL_OPS:
        raise TypeError(
            f"{_OP_NAMES[op]} is not implemented for bool tensors; convert them first, "
            f"e.g. t.int()"
        )


def _wrap_int(v: Any, x: Any) -> Any:
    """An int scalar outside ``x``'s integer range, wrapped modulo 2**bits as torch does."""
    if type(v) is int and not is_scalar(x) and x.dtype.kind in "iu":
        bits = 8 * x.dtype.itemsize
        return np.array(v % (1 << bits), dtype=np.uint64).astype(x.dtype)
    return v


def _plain(x: Any, y: Any, mode: int) -> bool:
    """True when ``x op y`` needs no promotion, cast or device check: NumPy's own result is
    torch's (one dtype, or a Python number that cannot change the tensor's dtype)."""
    if x.dtype in _half.REDUCED:  # torch's rules for half operands live in _half
        return False
    ty = type(y)
    k = x.dtype.kind
    if ty is float or ty is int or ty is bool or ty is complex:
        return (
            mode == COMPARE
            or k in "fc"
            or (mode != TRUEDIV and (ty is int or ty is bool) and k in "iu")
        )
    if ty is type(x):
        return mode == COMPARE or (
            y.dtype == x.dtype and k != "b" and (mode != TRUEDIV or k in "fc")
        )
    return False


def _result(x: Any, y: Any, op: Any, mode: int, rev: bool) -> Any:
    """The array of ``x op y`` (``y op x`` when ``rev``), or NotImplemented.

    ``x`` is the tensor's array; ``y`` an array or a Python number (see :func:`operand`).

    Raises:
        TypeError: a bool operand of ``-``, ``//``, ``%`` or ``**``, or dtypes the operator
            does not take.
        RuntimeError: operands on two devices.
    """
    if op is operator.sub:
        _check_bool(op, x, y, None)
    x0, y0 = x, y
    if not _plain(x, y, mode):
        x, y = same_device(x, y)
        if mode != COMPARE:
            rt = result_type(x, y)
            if mode == TRUEDIV:
                rt = true_divide_dtype(rt)
            _check_bool(op, x, y, rt)
            if rt in _half.REDUCED:
                return _half.binary(op, x, y, rt, rev)
            x, y = _cast(x, rt), _cast(y, rt)
        elif x.dtype in _half.REDUCED or getattr(y, "dtype", None) in _half.REDUCED:
            return _half.binary(op, x, y, result_type(x, y), rev)
    try:
        try:
            r = _apply(op, y, x, mode) if rev else _apply(op, x, y, mode)
        except OverflowError:  # a Python int outside the tensor's integer range
            if mode == COMPARE:
                raise
            y = _wrap_int(y, x)
            r = _apply(op, y, x, mode) if rev else _apply(op, x, y, mode)
    except TypeError as exc:
        xd = getattr(x, "dtype", type(x).__name__)
        yd = getattr(y, "dtype", type(y).__name__)
        raise TypeError(
            f"unsupported operand dtypes for {_OP_NAMES.get(op, op)}: {xd} and {yd} ({exc})"
        ) from exc
    if mode != COMPARE and r is not NotImplemented and is_cupy(r):
        # CuPy may apply value-based casting to Python numbers (uint8 + 300 -> uint16)
        rt = result_type(x0, y0)
        if mode == TRUEDIV:
            rt = true_divide_dtype(rt)
        if r.dtype != rt and op is not operator.matmul:
            r = r.astype(rt)
    return r


def binary(a: Tensor, other: Any, op: Any, mode: int = ARITH, rev: bool = False) -> Any:
    """``a op other`` (``other op a`` when ``rev``) as a new tensor, recorded for autograd when
    an operand requires grad; NotImplemented for an operand it does not take."""
    # Two tensors of one dtype, the commonest call in a training step, is finished here with
    # one further call (the tensor's wrapper): each costs a measurable share of a small op.
    x = a._data
    if isinstance(other, Tensor):
        if (a._requires_grad or other._requires_grad) and _grad_mode.enabled and mode != COMPARE:
            return _record(a, other, op, mode, rev)
        y = other._data
        if (
            type(y) is type(x)
            and y.dtype == x.dtype
            and (mode == ARITH or mode == COMPARE)
            and x.dtype.kind != "b"
            and (op is not operator.matmul or x.dtype not in _half.REDUCED)
        ):
            return _new(op(y, x) if rev else op(x, y))
    else:
        if a._requires_grad and _grad_mode.enabled and mode != COMPARE:
            return _record(a, other, op, mode, rev)
        y = operand(other)
        if y is NOT_OPERAND:
            return NotImplemented
    r = _result(x, y, op, mode, rev)
    return NotImplemented if r is NotImplemented else wrap(r)


def inplace(a: Tensor, other: Any, iop: Any, mode: int = ARITH) -> Any:
    """``a iop= other``, written into ``a``'s array; returns ``a`` (or NotImplemented).

    Raises:
        TypeError: the result's dtype cannot be written into ``a`` (e.g. a float into an int).
        RuntimeError: ``a`` is a leaf that requires grad (outside ``no_grad()``), or operands
            on two devices.
    """
    if _grad_mode.enabled and inplace_recorded(a, _OP_NAMES.get(iop, "in-place operator"), other):
        return _record_inplace(a, other, iop, mode)
    x = a._data
    y = operand(other)
    if y is NOT_OPERAND:
        return NotImplemented
    ty = type(y)
    if ty is type(x):
        k = x.dtype.kind
        if y.dtype == x.dtype and k != "b" and (mode != TRUEDIV or k in "fc"):
            _apply(iop, x, y, mode)  # same dtype: NumPy's in-place operator casts nothing
            bump_version(a)
            return a
    elif (ty is float or ty is int) and x.dtype.kind in "fc":
        _apply(iop, x, y, mode)
        bump_version(a)
        return a
    if not is_scalar(y) and is_cupy(x) != is_cupy(y):
        if y.ndim != 0:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two "
                f"devices, {device_str(x)} and {device_str(y)}! Move one with .to(device) first."
            )
        y = y.item()
    rt = result_type(x, y)
    if mode == TRUEDIV:
        rt = true_divide_dtype(rt)
    _check_bool(iop, x, y, rt)
    if not can_cast(rt, x.dtype):
        raise TypeError(
            f"result type {_dt.dt_repr(rt)} can't be cast to the desired output type "
            f"{_dt.dt_repr(x.dtype)} of this in-place {_OP_NAMES.get(iop, iop)}; use the "
            f"out-of-place operator or convert the tensor first, e.g. t = t.float()"
        )
    # Cast the result unsafely (uint8 += int64 wraps, as in torch); can_cast vetted the kinds.
    ufunc = getattr(xp(x), _UFUNC_OF[iop])
    try:
        _apply(functools.partial(ufunc, out=x, casting="unsafe"), x, y, mode)
    except OverflowError:
        _apply(functools.partial(ufunc, out=x, casting="unsafe"), x, _wrap_int(y, x), mode)
    bump_version(a)
    return a


def binary_inplace(a: Tensor, other: Any, op: Any, mode: int, what: str) -> Tensor:
    """``a = op(a, other)`` written into ``a``'s array (cast to its dtype), for the named
    in-place forms of binary functions (``atan2_``, ``eq_``, ...); recorded by autograd as
    ``op``'s Function when an operand requires grad. Returns ``a``.

    Raises:
        TypeError: ``other`` is not a tensor or a number, or the result's dtype cannot be
            written into ``a`` (a float into an integer tensor...).
        ValueError: the result does not broadcast to ``a``'s shape.
    """
    if _grad_mode.enabled and inplace_recorded(a, what, other):
        if not isinstance(other, Tensor):
            other = operand(other)
            if other is NOT_OPERAND:
                raise TypeError(f"{what}: other must be a tensor or a number, got "
                                f"{type(other).__name__}")
        return apply_inplace(_function_of(op), what, a, other, (op, mode, False))
    y = operand(other)
    if y is NOT_OPERAND:
        raise TypeError(f"{what}: other must be a tensor or a number, got "
                        f"{type(other).__name__}")
    x = a._data
    _autograd.write_into(x, _result(x, y, op, mode, False), what)
    bump_version(a)
    return a


def _record_inplace(a: Tensor, other: Any, iop: Any, mode: int) -> Any:
    """The recorded form of :func:`inplace`: the operator's op, its result written into ``a``."""
    if not isinstance(other, Tensor):
        other = operand(other)
        if other is NOT_OPERAND:
            return NotImplemented
    op = _OP_OF_IOP[iop]
    fn = FUNCTION_OF.get(op, NotImplementedOp)
    return apply_inplace(fn, _OP_NAMES[iop], a, other, (op, mode, False))


def _trunc_divide(x: Any, y: Any) -> Any:
    """``x / y`` rounded toward zero (``div(rounding_mode="trunc")``)."""
    m = xp(y) if is_scalar(x) else xp(x)
    if result_type(x, y).kind in "fc":
        return m.trunc(m.true_divide(x, y))
    # x - fmod(x, y) is an exact multiple of y, so floor division gives the truncated quotient
    return (x - m.fmod(x, y)) // y


_UFUNC_OF = {
    operator.iadd: "add",
    operator.isub: "subtract",
    operator.imul: "multiply",
    operator.itruediv: "true_divide",
    operator.ifloordiv: "floor_divide",
    operator.imod: "remainder",
    operator.ipow: "power",
    operator.iand: "bitwise_and",
    operator.ior: "bitwise_or",
    operator.ixor: "bitwise_xor",
    operator.ilshift: "left_shift",
    operator.irshift: "right_shift",
}

_OP_OF_IOP = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod,
    operator.ipow: operator.pow,
    operator.iand: operator.and_,
    operator.ior: operator.or_,
    operator.ixor: operator.xor,
    operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift,
}

_OP_NAMES = {
    operator.add: "+",
    operator.sub: "-",
    operator.mul: "*",
    operator.truediv: "/",
    operator.floordiv: "//",
    operator.mod: "%",
    operator.pow: "**",
    operator.matmul: "@",
    operator.and_: "&",
    operator.or_: "|",
    operator.xor: "^",
    operator.lshift: "<<",
    operator.rshift: ">>",
    operator.eq: "==",
    operator.ne: "!=",
    operator.lt: "<",
    operator.le: "<=",
    operator.gt: ">",
    operator.ge: ">=",
    operator.iadd: "+=",
    operator.isub: "-=",
    operator.imul: "*=",
    operator.itruediv: "/=",
    operator.ifloordiv: "//=",
    operator.imod: "%=",
    operator.ipow: "**=",
    operator.iand: "&=",
    operator.ior: "|=",
    operator.ixor: "^=",
    operator.ilshift: "<<=",
    operator.irshift: ">>=",
}


# --------------------------------------------------------------------------------------------
# The differentiable operators
#
# forward(ctx, x, y, (op, mode, rev)): x is the left tensor's array, y the other operand (an
# array or a Python number, which gets no gradient). Each backward works in math order,
# ``a op b``, with ``(a, b) = (y, x)`` when ``rev``. An op saves only what the gradients it
# must compute read (``read_by``), as torch does: a saved array pins its tensor's version, so an
# array saved for nothing would refuse in-place writes that torch allows.


class BinaryOp(Function):
    #: For ``a``, ``b`` and the result, in that order: the operands whose gradient reads it
    #: (``"a"``, ``"b"``, both or neither). Only what a wanted gradient reads is saved.
    read_by = ("ab", "ab", "")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # forward's table, once per op: (a's gradient wanted, b's) -> keep a, b, the result
        cls._keeps = {(na, nb): tuple(bool((na and "a" in r) or (nb and "b" in r))
                                      for r in cls.read_by)
                      for na in (False, True) for nb in (False, True)}

    @classmethod
    def forward(cls, ctx: Any, x: Any, y: Any, spec: tuple) -> Any:
        op, mode, rev = spec
        out = _result(x, y, op, mode, rev)
        if out is NotImplemented:
            raise TypeError(
                f"{_OP_NAMES.get(op, op)} does not take operands of types "
                f"{type(x).__name__} and {type(y).__name__}"
            )
        ctx.meta = (rev, (x.shape, x.dtype), (y.shape, y.dtype) if hasattr(y, "shape") else None)
        need = ctx.needs_input_grad
        if need:  # recorded
            if rev:
                kb, ka, ko = cls._keeps[need[1], need[0]]
            else:
                ka, kb, ko = cls._keeps[need[0], need[1]]
            ctx.save_for_backward(x if ka else None, y if kb else None, out if ko else None)
        return out

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, y, out = ctx.saved_tensors
        need = ctx.needs_input_grad
        grads = ctx.fn._grads
        rev, mx, my = ctx.meta
        if rev:  # math order: y op x
            gy, gx = grads(ctx, g, y, x, out, need[1], need[0])
        else:
            gx, gy = grads(ctx, g, x, y, out, need[0], need[1])
        gx = fit_grad(gx, *mx) if need[0] and gx is not None else None
        gy = fit_grad(gy, *my) if need[1] and gy is not None and my is not None else None
        return gx, gy, None


class Add(BinaryOp):
    """``a + b``."""

    read_by = ("", "", "")

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        return g, g


class Sub(BinaryOp):
    """``a - b``."""

    read_by = ("", "", "")

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        return g, (-g if need_b else None)


def _cj(v: Any) -> Any:
    """The conjugate of a complex operand (the gradient of a complex product carries the
    other factor's conjugate, as torch defines it); a real one as it is."""
    if isinstance(v, complex) or getattr(getattr(v, "dtype", None), "kind", "") == "c":
        return v.conjugate()
    return v


class Mul(BinaryOp):
    """``a * b``."""

    read_by = ("b", "a", "")  # each operand's gradient reads the other operand

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        return (g * _cj(b) if need_a else None), (g * _cj(a) if need_b else None)


class Div(BinaryOp):
    """``a / b``: d/da = 1/b, d/db = -a/b**2 (from the operands, not the result, which an
    in-place write may change, as torch does)."""

    read_by = ("b", "ab", "")

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        return ((g / _cj(b) if need_a else None),
                (-(g * _cj(a / b)) / _cj(b) if need_b else None))


def _log(v: Any) -> Any:
    if isinstance(v, (int, float)):
        return math.log(v) if v > 0 else (-math.inf if v == 0 else math.nan)
    return xp(v).log(v)


class Pow(BinaryOp):
    """``a ** b``: d/da = b * a**(b-1) (0 where b == 0), d/db = out * log(a) (0 where a == 0 and
    b >= 0), as torch defines them."""

    read_by = ("ab", "ab", "b")

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        if g.dtype.kind == "c":  # holomorphic: g * conj(d/da), torch's (conjugate Wirtinger)
            m = xp(g)
            ga, gb = Pow._real_grads(ctx, m.conj(g), a, b, out, need_a, need_b)
            return (None if ga is None else m.conj(ga)), (None if gb is None else m.conj(gb))
        return Pow._real_grads(ctx, g, a, b, out, need_a, need_b)

    @staticmethod
    def _real_grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool,
                    need_b: bool) -> tuple:
        ga = gb = None
        if need_a:
            if isinstance(b, (int, float)):
                if b == 0:
                    ga = g * 0
                elif b == 2:
                    ga = g * (2 * a)
                else:
                    ga = g * (b * a ** (b - 1))
            else:
                ga = g * xp(b).where(b == 0, 0, b * a ** (b - 1))
        if need_b:
            d = out * _log(a)
            if not isinstance(a, (int, float)):
                d = xp(a).where((a == 0) & (b >= 0), 0, d)
            gb = g * d
        return ga, gb


class Remainder(BinaryOp):
    """``a % b`` (Python/floor remainder): d/da = 1, d/db = -floor(a / b). A remainder that
    rounds its quotient otherwise (``fmod``: toward zero) gives its own ``_quotient``."""

    read_by = ("b", "b", "")

    @staticmethod
    def _quotient(m: Any, a: Any, b: Any) -> Any:
        return m.floor_divide(a, b)

    @classmethod
    def _grads(cls, ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool,
               need_b: bool) -> tuple:
        return g, (-g * cls._quotient(xp(b), a, b) if need_b else None)


class _MaxMin(BinaryOp):
    is_max = True

    @classmethod
    def _grads(cls, ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool,
               need_b: bool) -> tuple:
        # torch: ties share the gradient half and half; where a NaN is involved, both
        # operands get all of it
        m = xp(g)
        a_loses = (a < b) if cls.is_max else (a > b)
        b_loses = (a > b) if cls.is_max else (a < b)
        tie = a == b
        ga = gb = None
        if need_a:
            ga = g * m.where(a_loses, 0.0, m.where(tie, 0.5, 1.0))
        if need_b:
            gb = g * m.where(b_loses, 0.0, m.where(tie, 0.5, 1.0))
        return ga, gb


def max_min_pair(family: type, names: tuple, docs: tuple) -> tuple:
    """The max op and the min op of ``family`` (a BinaryOp whose gradient reads ``is_max``),
    named and documented by the pairs ``names`` and ``docs``."""
    return tuple(type(n, (family,), {"__doc__": d, "__module__": family.__module__, "is_max": up})
                 for n, d, up in zip(names, docs, (True, False)))


Maximum, Minimum = max_min_pair(_MaxMin, ("Maximum", "Minimum"),
                                ("``maximum(a, b)`` (``t.max(other)``).",
                                 "``minimum(a, b)`` (``t.min(other)``)."))


class MatMul(BinaryOp):
    """``a @ b`` for 1-D and n-D operands with batch broadcasting, as ``torch.matmul``."""

    read_by = ("b", "a", "")  # each operand's gradient reads the other operand

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        # an operand is saved only where the other's gradient reads it: shapes from the meta
        rev, mx, my = ctx.meta
        sa, sb = (my[0], mx[0]) if rev else (mx[0], my[0])
        # complex operands: the conjugates (gradients are conjugate Wirtinger derivatives)
        a = a.conj() if a is not None and a.dtype.kind == "c" else a
        b = b.conj() if b is not None and b.dtype.kind == "c" else b
        if len(sa) == 1 and len(sb) == 1:  # dot product: g is 0-d
            return (g * b if need_a else None), (g * a if need_b else None)
        sa1 = (1, *sa) if len(sa) == 1 else sa
        sb1 = (*sb, 1) if len(sb) == 1 else sb
        g1 = g
        if len(sa) == 1:
            g1 = g1[..., None, :]
        if len(sb) == 1:
            g1 = g1[..., None]
        m = xp(g1)
        ga = gb = None
        if need_a:
            ga = m.matmul(g1, (b[:, None] if len(sb) == 1 else b).swapaxes(-1, -2))
            if ga.shape != sa1:
                ga = sum_to(ga, sa1)
            if len(sa) == 1:
                ga = ga.reshape(sa)
        if need_b:
            gb = m.matmul((a[None, :] if len(sa) == 1 else a).swapaxes(-1, -2), g1)
            if gb.shape != sb1:
                gb = sum_to(gb, sb1)
            if len(sb) == 1:
                gb = gb.reshape(sb)
        return ga, gb


class _NotDifferentiable(BinaryOp):
    name_ = "operation"
    read_by = ("", "", "")

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        raise RuntimeError(
            f"derivative for {ctx.fn.name_} is not implemented; compute it under "
            f"mpitensor.no_grad() or on detached tensors (t.detach())"
        )


class FloorDivide(_NotDifferentiable):
    """``a // b`` (recorded so that backward through it fails as in torch)."""

    name_ = "floor_divide"


class TruncDivide(_NotDifferentiable):
    """``div(a, b, rounding_mode='trunc')``."""

    name_ = "div with rounding_mode='trunc'"


class NotImplementedOp(_NotDifferentiable):
    """A binary operator that has no derivative (bitwise operators and the like)."""

    name_ = "this operator"


FUNCTION_OF = {
    operator.add: Add,
    operator.sub: Sub,
    operator.mul: Mul,
    operator.truediv: Div,
    operator.pow: Pow,
    operator.mod: Remainder,
    operator.floordiv: FloorDivide,
    operator.matmul: MatMul,
    _trunc_divide: TruncDivide,
}
# maximum/minimum come as NumPy's or CuPy's ufuncs, known by name ("cupy_maximum" on CuPy)
_FUNCTION_OF_UFUNC = {"maximum": Maximum, "minimum": Minimum}


def _record(a: Tensor, other: Any, op: Any, mode: int, rev: bool) -> Any:
    """The recorded form of :func:`binary`."""
    if not isinstance(other, Tensor):
        other = operand(other)
        if other is NOT_OPERAND:
            return NotImplemented
    fn = FUNCTION_OF.get(op)  # (_function_of written out: this runs for every recorded op)
    if fn is None:
        fn = _function_of(op)
    return fn.apply(a, other, (op, mode, rev))


def _function_of(op: Any) -> Any:
    """The differentiable Function of binary op ``op`` (``NotImplementedOp`` if none)."""
    fn = FUNCTION_OF.get(op)
    if fn is None:
        name = str(getattr(op, "__name__", None) or getattr(op, "name", ""))
        fn = _FUNCTION_OF_UFUNC.get(name.removeprefix("cupy_"), NotImplementedOp)
    return fn


# --------------------------------------------------------------------------------------------
# The Tensor methods


def _trio(op: Any, iop: Any, mode: int = ARITH) -> tuple:
    """The three Tensor methods of one Python operator: ``x op y``, the reflected ``y op x``
    and the in-place ``x op= y``, named as Python looks them up (``__add__``, ``__radd__``,
    ``__iadd__``)."""
    def forward(self: Tensor, other: Any) -> Any:
        return binary(self, other, op, mode)

    def reflected(self: Tensor, other: Any) -> Any:
        return binary(self, other, op, mode, rev=True)

    def in_place(self: Tensor, other: Any) -> Any:
        return inplace(self, other, iop, mode)

    name = op.__name__.strip("_")
    for fn, dunder in ((forward, name), (reflected, "r" + name), (in_place, "i" + name)):
        fn.__name__ = f"__{dunder}__"
        fn.__qualname__ = f"Tensor.__{dunder}__"
    return forward, reflected, in_place


def _compare(op: Any) -> Any:
    """The Tensor method of an order comparison (``__lt__`` for ``operator.lt``, ...)."""
    def compare(self: Tensor, other: Any) -> Any:
        return binary(self, other, op, COMPARE)

    compare.__name__ = f"__{op.__name__}__"
    compare.__qualname__ = f"Tensor.__{op.__name__}__"
    return compare


@tensor_methods
class _OperatorMethods:
    # the operators without an autocast rule: one line each, from _trio
    __add__, __radd__, __iadd__ = _trio(operator.add, operator.iadd)
    __sub__, __rsub__, __isub__ = _trio(operator.sub, operator.isub)
    __mul__, __rmul__, __imul__ = _trio(operator.mul, operator.imul)
    __truediv__, __rtruediv__, __itruediv__ = _trio(operator.truediv, operator.itruediv, TRUEDIV)
    __floordiv__, __rfloordiv__, __ifloordiv__ = _trio(operator.floordiv, operator.ifloordiv,
                                                       DIVLIKE)
    __mod__, __rmod__, __imod__ = _trio(operator.mod, operator.imod, DIVLIKE)

    def __pow__(self, other: Any) -> Tensor:
        if _autocast.ON and _autocast.active():
            return _autocast.run("pow", Tensor.__pow__, self, other)
        return binary(self, other, operator.pow, DIVLIKE)

    def __rpow__(self, other: Any) -> Tensor:
        if _autocast.ON and _autocast.active():
            return _autocast.run("pow", Tensor.__rpow__, self, other)
        return binary(self, other, operator.pow, DIVLIKE, rev=True)

    def __ipow__(self, other: Any) -> Tensor:
        return inplace(self, other, operator.ipow, DIVLIKE)

    def __matmul__(self, other: Any) -> Tensor:
        if _autocast.ON and _autocast.active():
            return _autocast.run("matmul", Tensor.__matmul__, self, other)
        return binary(self, other, operator.matmul)

    def __rmatmul__(self, other: Any) -> Tensor:
        if _autocast.ON and _autocast.active():
            return _autocast.run("matmul", Tensor.__rmatmul__, self, other)
        return binary(self, other, operator.matmul, rev=True)

    __and__, __rand__, __iand__ = _trio(operator.and_, operator.iand)
    __or__, __ror__, __ior__ = _trio(operator.or_, operator.ior)
    __xor__, __rxor__, __ixor__ = _trio(operator.xor, operator.ixor)
    __lshift__, __rlshift__, __ilshift__ = _trio(operator.lshift, operator.ilshift)
    __rshift__, __rrshift__, __irshift__ = _trio(operator.rshift, operator.irshift)

    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        if other is None:
            return False
        return binary(self, other, operator.eq, COMPARE)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        if other is None:
            return True
        return binary(self, other, operator.ne, COMPARE)

    __lt__ = _compare(operator.lt)
    __le__ = _compare(operator.le)
    __gt__ = _compare(operator.gt)
    __ge__ = _compare(operator.ge)

    # Named forms of the operators, as in torch.
    def add(self, other: Any, *, alpha: Any = 1) -> Tensor:
        """Return ``self + alpha * other``."""
        return self + (other if alpha == 1 else other * alpha)

    def sub(self, other: Any, *, alpha: Any = 1) -> Tensor:
        """Return ``self - alpha * other``."""
        return self - (other if alpha == 1 else other * alpha)

    def mul(self, other: Any) -> Tensor:
        """Return ``self * other``."""
        return self * other

    def div(self, other: Any, *, rounding_mode: Optional[str] = None) -> Tensor:
        """Return ``self / other``; ``rounding_mode`` ``"trunc"`` or ``"floor"`` rounds it.

        Raises:
            ValueError: unknown ``rounding_mode``.
        """
        if rounding_mode is None:
            return self / other
        if rounding_mode == "floor":
            return self // other
        if rounding_mode == "trunc":
            return binary(self, other, _trunc_divide, DIVLIKE)
        raise ValueError(
            f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
            f"{rounding_mode!r}"
        )

    def subtract(self, other: Any, *, alpha: Any = 1) -> Tensor:
        """Return ``self - alpha * other`` (``sub``)."""
        return self - (other if alpha == 1 else other * alpha)

    def multiply(self, other: Any) -> Tensor:
        """Return ``self * other`` (``mul``)."""
        return self * other

    def divide(self, other: Any, *, rounding_mode: Optional[str] = None) -> Tensor:
        """Return ``self / other`` (``div``), rounded as ``rounding_mode`` says."""
        return self.div(other, rounding_mode=rounding_mode)

    true_divide = __truediv__
    floor_divide = __floordiv__
    remainder = __mod__
    pow = __pow__
    matmul = __matmul__
    eq = __eq__
    ne = __ne__
    lt = __lt__
    le = __le__
    gt = __gt__
    ge = __ge__

    def add_(self, other: Any, *, alpha: Any = 1) -> Tensor:
        """In place: ``self += alpha * other``; returns self."""
        return inplace(self, other if alpha == 1 else other * alpha, operator.iadd)

    def sub_(self, other: Any, *, alpha: Any = 1) -> Tensor:
        """In place: ``self -= alpha * other``; returns self."""
        return inplace(self, other if alpha == 1 else other * alpha, operator.isub)

    def mul_(self, other: Any) -> Tensor:
        """In place: ``self *= other``; returns self."""
        return inplace(self, other, operator.imul)

    def div_(self, other: Any, *, rounding_mode: Optional[str] = None) -> Tensor:
        """In place: ``self /= other`` (rounded as ``rounding_mode`` says); returns self.

        Raises:
            ValueError: unknown ``rounding_mode``.
        """
        if rounding_mode is None:
            return inplace(self, other, operator.itruediv, TRUEDIV)
        if rounding_mode == "floor":
            return inplace(self, other, operator.ifloordiv, DIVLIKE)
        if rounding_mode == "trunc":
            return binary_inplace(self, other, _trunc_divide, DIVLIKE, "div_()")
        raise ValueError(
            f"div_ expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
            f"{rounding_mode!r}"
        )

    def subtract_(self, other: Any, *, alpha: Any = 1) -> Tensor:
        """In place: ``self -= alpha * other``; returns self."""
        return inplace(self, other if alpha == 1 else other * alpha, operator.isub)

    def multiply_(self, other: Any) -> Tensor:
        """In place: ``self *= other``; returns self."""
        return inplace(self, other, operator.imul)

    def divide_(self, other: Any, *, rounding_mode: Optional[str] = None) -> Tensor:
        """In place: ``self /= other``; returns self (see :meth:`div_`)."""
        return self.div_(other, rounding_mode=rounding_mode)

    def true_divide_(self, other: Any) -> Tensor:
        """In place: ``self /= other``; returns self."""
        return inplace(self, other, operator.itruediv, TRUEDIV)

    def floor_divide_(self, other: Any) -> Tensor:
        """In place: ``self //= other``; returns self."""
        return inplace(self, other, operator.ifloordiv, DIVLIKE)

    def remainder_(self, other: Any) -> Tensor:
        """In place: ``self %= other``; returns self."""
        return inplace(self, other, operator.imod, DIVLIKE)

    def pow_(self, other: Any) -> Tensor:
        """In place: ``self **= other``; returns self."""
        return inplace(self, other, operator.ipow, DIVLIKE)

    def __contains__(self, element: Any) -> bool:
        y = operand(element)
        if y is NOT_OPERAND:
            raise TypeError(
                f"Tensor.__contains__ only supports a Tensor or a number, got "
                f"{type(element).__name__}"
            )
        x, y = same_device(self._data, y)
        return bool((x == y).any())
