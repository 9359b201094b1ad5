"""Half-precision arithmetic (float16, bfloat16) computed as torch computes it on the CPU.

torch does not add or multiply in 16 bits: each op widens its operands to float32, computes,
and rounds the result to the tensor's dtype once. NumPy's float16 loops and ml_dtypes' bfloat16
loops already do that for elementwise ops between two tensors; the places where plain NumPy
would give other numbers, or another dtype, are handled here:

- **Products and sums** (``@``, ``sum``, ``mean``) accumulate in float32 through BLAS and round
  once. NumPy's float16 ``matmul`` is exact but 50x slower, ml_dtypes' bfloat16 ``matmul``
  returns float32, and a bfloat16 ``sum`` adds in bfloat16 (100 000 normal samples sum to 300
  instead of 288).
- **A Python number** next to a half tensor: torch rounds it to the tensor's dtype before
  ``+``, ``-``, ``**``, ``%`` and comparisons, but keeps float32 precision for ``*``, ``/``
  and ``//``; ``number / tensor`` is the tensor's rounded reciprocal times the number, and a
  bfloat16 ``x ** 3`` or ``x ** -2`` rounds ``x * x`` first. A zero-dim tensor of another
  dtype counts as such a number. (NumPy rounds to float16 for all of them; ml_dtypes keeps
  float32 for all of them and returns float32.)

Example:
    >>> import operator
    >>> x = np.array([256.0], dtype=_dt.bfloat16)
    >>> binary(operator.add, x, 1.0039, _dt.bfloat16, False)  # 1.0039 rounds to 1 first
    array([256], dtype=bfloat16)
"""

from __future__ import annotations

import operator
from typing import Any, Optional

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core.devices import xp

#: the dtypes torch computes in float32 and rounds once per op
REDUCED = frozenset({_dt.float16, _dt.bfloat16})

_F32 = _dt.float32
_BF16 = _dt.bfloat16

# The ops for which torch reads a number beside a half tensor at float32 precision; the others
# round it to the tensor's dtype first.
_WIDE_SCALAR = frozenset({operator.mul, operator.truediv, operator.floordiv})


def _is_number(v: Any, x: Any) -> bool:
    """Whether ``v`` acts as a number next to the array ``x``: a Python number, or a zero-dim
    array beside one with dimensions."""
    return not hasattr(v, "ndim") or (v.ndim == 0 and x.ndim != 0)


def _wide(v: Any, rt: np.dtype) -> Any:
    """``v`` (array or number) as ``rt``, widened to float32 where ``rt`` is a half dtype."""
    v = np.asarray(v, dtype=rt) if not hasattr(v, "dtype") else v.astype(rt, copy=False)
    return v.astype(_F32) if rt in REDUCED else v


def binary(op: Any, x: Any, y: Any, rt: np.dtype, rev: bool) -> Any:
    """``x op y`` (``y op x`` when ``rev``) for a result of half dtype ``rt``, or a comparison
    of half operands, computed the way torch's CPU kernels compute it.

    Args:
        op: a function of two arrays (``operator.add``, ``operator.lt``, ``numpy.maximum``, ...).
        x: the tensor's array.
        y: the other operand: an array on ``x``'s device or a Python number.
        rt: the promoted dtype of the operands (float16 or bfloat16 for arithmetic).
        rev: whether ``y`` is the left operand.

    Returns:
        An array of dtype ``rt``, or of bool for a comparison.
    """
    m = xp(x)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        if _is_number(y, x) and op is not operator.matmul:
            value = y.item() if hasattr(y, "item") else y
            if op in _WIDE_SCALAR and (not rev or op is operator.mul):
                s = np.float32(value)
            elif rev and op is operator.truediv:
                # number / tensor is the tensor's reciprocal, rounded, times the number
                inv = (1.0 / _wide(x, rt)).astype(rt)
                return (inv.astype(_F32) * np.float32(value)).astype(rt)
            elif op is operator.pow and not rev and rt == _BF16 and value in (3, -2):
                # torch's bfloat16 x**3 and x**-2 round the square first
                a = _wide(x, rt)
                sq = (a * a).astype(rt).astype(_F32)
                return (sq * a if value == 3 else 1.0 / sq).astype(rt)
            else:
                s = _wide(value, rt)[()]
            a = _wide(x, rt)
            r = op(s, a) if rev else op(a, s)
        else:
            a, b = _wide(x, rt), _wide(y, rt)
            if op is operator.matmul:
                r = m.matmul(b, a) if rev else m.matmul(a, b)
            else:
                r = op(b, a) if rev else op(a, b)
        if not hasattr(r, "dtype"):
            r = m.asarray(r)
        return r if r.dtype == rt or r.dtype.kind == "b" else r.astype(rt)


def matmul(a: Any, b: Any) -> Any:
    """``a @ b`` of two half arrays of one dtype: a float32 product rounded once."""
    dt = a.dtype
    if dt not in REDUCED:
        return a @ b
    m = xp(a)
    with np.errstate(over="ignore"):
        return m.matmul(a.astype(_F32), b.astype(_F32)).astype(dt)


def sum(x: Any, axis: Any, keepdims: bool, dtype: Optional[np.dtype] = None) -> Any:  # noqa: A001
    """``x.sum(axis)`` of a half array: accumulated in float32, rounded once to ``dtype``
    (``x``'s by default)."""
    with np.errstate(over="ignore"):
        return x.sum(axis=axis, dtype=_F32, keepdims=keepdims).astype(dtype or x.dtype)


def mean(x: Any, axis: Any, keepdims: bool, dtype: Optional[np.dtype] = None) -> Any:
    """``x.mean(axis)`` of a half array: summed in float32, divided, rounded once to ``dtype``
    (``x``'s by default)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return x.mean(axis=axis, dtype=_F32, keepdims=keepdims).astype(dtype or x.dtype)


def _widen_args(args: tuple) -> tuple:
    """``args`` with half arrays widened to float32, and the half dtype met (None if none)."""
    half = None
    out = []
    for a in args:
        dt = getattr(a, "dtype", None)
        if dt in REDUCED and hasattr(a, "astype"):
            half = dt
            a = a.astype(_F32)
        out.append(a)
    return tuple(out), half


def _narrow(v: Any, dt: np.dtype) -> Any:
    """``v`` rounded to ``dt`` where it is a float32 array; anything else as it is."""
    if getattr(v, "dtype", None) == _F32 and hasattr(v, "astype"):
        return v.astype(dt)
    return v


def computes_in_float32(fn: type) -> type:
    """Class decorator for an autograd :class:`~mpitensor.autograd.Function`: half inputs are
    widened to float32 for ``forward`` and ``backward`` and each result is rounded once, which
    is how torch's CPU kernels of composite ops (linear, softmax, losses, sigmoid, tanh) treat
    half tensors. A backward that reads the saved output reads it rounded, as torch's does.

    Args:
        fn: a Function subclass; its ``forward(ctx, *args)`` and ``backward(ctx, *grads)``
            (static or class methods) are replaced by wrappers.

    Returns:
        ``fn``, its two methods wrapped; float32 and float64 calls run them unchanged.
    """
    forward, backward = fn.forward, fn.backward

    def wide_forward(ctx: Any, *args: Any) -> Any:
        for a in args:  # the float32 path: one look at each argument, nothing built
            if getattr(a, "dtype", None) in REDUCED:
                break
        else:
            return forward(ctx, *args)  # a fresh ctx: backward finds no half_dtype
        wide, half = _widen_args(args)
        ctx.half_dtype = half
        with np.errstate(over="ignore"):
            out = forward(ctx, *wide)
            rounded = _narrow(out, half)
            saved = getattr(ctx, "saved", ())
            if rounded is not out and any(s is out for s in saved):
                # torch's backward reads the output as it was returned, rounded
                back = rounded.astype(_F32)
                ctx.saved = tuple(back if s is out else s for s in saved)
        return rounded

    def wide_backward(ctx: Any, *grads: Any) -> Any:
        half = getattr(ctx, "half_dtype", None)
        if half is None:
            return backward(ctx, *grads)
        with np.errstate(over="ignore"):
            out = backward(ctx, *(_narrow_to_wide(g) for g in grads))
        return tuple(_narrow(g, half) for g in out)

    fn.forward = staticmethod(wide_forward)
    fn.backward = staticmethod(wide_backward)
    return fn


def _narrow_to_wide(g: Any) -> Any:
    """A gradient of a half output, widened to float32 for a widened backward."""
    return g.astype(_F32) if getattr(g, "dtype", None) in REDUCED else g
