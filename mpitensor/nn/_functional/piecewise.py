"""The piecewise-linear activations of ``torch.nn.functional``: ``leaky_relu``, ``hardtanh``,
``relu6``, ``hardsigmoid``, ``hardswish``, ``hardshrink``/``softshrink``, ``threshold``, and
the learned or randomised slopes of ``prelu`` and ``rrelu``.

As in :mod:`.activations`, each is an autograd Function with torch's gradients, including its
choices at the kinks (``leaky_relu`` takes the negative slope at 0, ``hardtanh`` passes no
gradient at its bounds); the ``inplace=True`` forms go through the tensor in-place machinery.
Re-exported by :mod:`mpitensor.nn.functional`; import them from there.

Example:
    >>> import mpitensor as mt
    >>> x = mt.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    >>> leaky_relu(x, 0.1).sum().backward()
    >>> x.grad
    tensor([0.1000, 0.1000, 1.0000])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core import autocast as _autocast
from mpitensor._ops.random import _draw
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

from .activations import (
    _ONE_SIXTH_F32,
    _float_input,
    _inplace_only,
    _keeps_input,
    _pointwise,
    _real,
    _unary_api,
)
from .checks import (
    as_tensor,
    dtype_name,
    half_safe,
    quiet,
    run_inplace,
    sum_to,
    xp_of,
)

__all__ = ["leaky_relu", "leaky_relu_", "hardtanh", "hardtanh_", "relu6", "hardsigmoid",
           "hardswish", "hardshrink", "softshrink", "threshold", "threshold_", "prelu", "rrelu",
           "rrelu_"]


_LeakyRelu = _keeps_input("_LeakyRelu", lambda xp, x, slope: xp.where(x > 0, x, x * slope),
                          lambda xp, x, g, slope: xp.where(x > 0, g, g * slope))


def leaky_relu(input: Any, negative_slope: float = 0.01,  # noqa: A002 - torch's name
               inplace: bool = False) -> Tensor:
    """``x`` for x > 0, ``negative_slope * x`` otherwise.

    Example:
        >>> import mpitensor as mt
        >>> leaky_relu(mt.tensor([-1.0, 1.0]), 0.5)
        tensor([-0.5000,  1.0000])
    """
    s = _real(negative_slope, "negative_slope", "leaky_relu")
    return _pointwise(_LeakyRelu, "leaky_relu", input, inplace, s)


def leaky_relu_(input: Any, negative_slope: float = 0.01) -> Tensor:  # noqa: A002
    """In-place :func:`leaky_relu`."""
    s = _real(negative_slope, "negative_slope", "leaky_relu_")
    return _inplace_only(_LeakyRelu, "leaky_relu_", input, s)


def _hardtanh(xp: Any, x: Any, lo: float, hi: float) -> Any:
    if _dt.kind_of(x.dtype) in "iu":
        return xp.clip(x, math.ceil(lo), math.floor(hi)).astype(x.dtype, copy=False)
    return xp.clip(x, x.dtype.type(lo), x.dtype.type(hi))


_Hardtanh = _keeps_input(
    "_Hardtanh", _hardtanh,
    lambda xp, x, g, lo, hi: xp.where((x <= lo) | (x >= hi), xp.zeros((), g.dtype), g),
    "``clip(x, lo, hi)``; no gradient at or beyond the bounds (NaN passes through).")


def _hardtanh_args(min_val: Any, max_val: Any, fname: str) -> tuple:
    lo, hi = _real(min_val, "min_val", fname), _real(max_val, "max_val", fname)
    if lo > hi:
        raise ValueError(f"{fname}(): min_val ({lo}) cannot be greater than max_val ({hi})")
    return lo, hi


def _int_or_float(input: Any, fname: str) -> Tensor:  # noqa: A002 - torch's name
    t = as_tensor(input, "input", fname)
    if _dt.kind_of(t._data.dtype) == "b":
        raise NotImplementedError(f"{fname}(): a bool tensor is not supported; convert it "
                                  f"first, e.g. x.float()")
    return t


def hardtanh(input: Any, min_val: float = -1.0, max_val: float = 1.0,  # noqa: A002
             inplace: bool = False) -> Tensor:
    """Clip to ``[min_val, max_val]`` (integer tensors too, as torch).

    Raises:
        ValueError: ``min_val > max_val``.

    Example:
        >>> import mpitensor as mt
        >>> hardtanh(mt.tensor([-2.0, 0.5, 2.0]))
        tensor([-1.0000,  0.5000,  1.0000])
    """
    lo, hi = _hardtanh_args(min_val, max_val, "hardtanh")
    t = _int_or_float(input, "hardtanh")
    if inplace:
        return run_inplace(input, _Hardtanh, "hardtanh(inplace=True)", lo, hi)
    return _Hardtanh.apply(t, lo, hi)


def hardtanh_(input: Any, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:  # noqa: A002
    """In-place :func:`hardtanh`."""
    lo, hi = _hardtanh_args(min_val, max_val, "hardtanh_")
    _int_or_float(input, "hardtanh_")
    return run_inplace(input, _Hardtanh, "hardtanh_()", lo, hi)


def relu6(input: Any, inplace: bool = False) -> Tensor:  # noqa: A002 - torch's name
    """``min(max(0, x), 6)`` (torch's ``hardtanh(x, 0, 6)``, gradients included).

    Example:
        >>> import mpitensor as mt
        >>> relu6(mt.tensor([-1.0, 7.0]))
        tensor([0., 6.])
    """
    t = _int_or_float(input, "relu6")
    if inplace:
        return run_inplace(input, _Hardtanh, "relu6(inplace=True)", 0.0, 6.0)
    return _Hardtanh.apply(t, 0.0, 6.0)


# the gradient: torch's kernel multiplies by 1/6 rounded to float32, in every dtype
_Hardsigmoid = _keeps_input(
    "_Hardsigmoid", lambda xp, x: xp.minimum(xp.maximum(x + 3, 0), 6) / 6,
    lambda xp, x, g: xp.where((x > -3) & (x < 3), g * _ONE_SIXTH_F32, xp.zeros((), g.dtype)))


hardsigmoid = _unary_api(_Hardsigmoid, "hardsigmoid", "``relu6(x + 3) / 6``.", "[0.0]",
                         "tensor([0.5000])")


_Hardswish = _keeps_input(
    "_Hardswish", lambda xp, x: x * xp.minimum(xp.maximum(x + 3, 0), 6) / 6,
    lambda xp, x, g: xp.where(x <= -3, xp.zeros((), g.dtype),
                              xp.where(x < 3, g * (x / 3 + 0.5), g)))


hardswish = _unary_api(_Hardswish, "hardswish", "``x * relu6(x + 3) / 6``.", "[3.0]",
                       "tensor([3.])")


def _shrink(xp: Any, x: Any, lambd: float, soft: bool) -> Any:
    zero = xp.zeros((), x.dtype)
    if not soft:
        return xp.where((x >= -lambd) & (x <= lambd), zero, x)
    return xp.where(x > lambd, x - lambd, xp.where(x < -lambd, x + lambd, zero))


_Shrink = _keeps_input(
    "_Shrink", _shrink,
    lambda xp, x, g, lambd, soft: xp.where((x >= -lambd) & (x <= lambd), xp.zeros((), g.dtype), g),
    "Hard (``soft=False``) or soft shrinkage by ``lambd``; no gradient inside the band.")


def hardshrink(input: Any, lambd: float = 0.5) -> Tensor:  # noqa: A002 - torch's name
    """``x`` where ``|x| > lambd``, 0 elsewhere.

    Example:
        >>> import mpitensor as mt
        >>> hardshrink(mt.tensor([0.2, 1.0]))
        tensor([0., 1.])
    """
    t = _float_input(input, "hardshrink")
    return _Shrink.apply(t, _real(lambd, "lambd", "hardshrink"), False)


def softshrink(input: Any, lambd: float = 0.5) -> Tensor:  # noqa: A002 - torch's name
    """``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, 0 in between.

    Raises:
        RuntimeError: a negative ``lambd``.

    Example:
        >>> import mpitensor as mt
        >>> softshrink(mt.tensor([0.2, 1.0]))
        tensor([0.0000, 0.5000])
    """
    t = _float_input(input, "softshrink")
    lam = _real(lambd, "lambd", "softshrink")
    if not lam >= 0:
        raise RuntimeError(f"softshrink(): lambd must be non-negative, got {lam}")
    return _Shrink.apply(t, lam, True)


def _threshold(xp: Any, x: Any, threshold: float, value: float) -> Any:
    with quiet(xp):
        v = xp.asarray(value).astype(x.dtype)
    return xp.where(x <= threshold, v, x)


_Threshold = _keeps_input(
    "_Threshold", _threshold,
    lambda xp, x, g, threshold, value: xp.where(x <= threshold, xp.zeros((), g.dtype), g),
    half=False)


def threshold(input: Any, threshold: float, value: float,  # noqa: A002 - torch's names
              inplace: bool = False) -> Tensor:
    """``x`` where ``x > threshold``, ``value`` elsewhere (integer tensors too).

    Example:
        >>> import mpitensor as mt
        >>> threshold(mt.tensor([0.5, 2.0]), 1.0, -1.0)
        tensor([-1.,  2.])
    """
    t = _int_or_float(input, "threshold")
    th, v = _real(threshold, "threshold", "threshold"), _real(value, "value", "threshold")
    if inplace:
        return run_inplace(input, _Threshold, "threshold(inplace=True)", th, v)
    return _Threshold.apply(t, th, v)


def threshold_(input: Any, threshold: float, value: float) -> Tensor:  # noqa: A002
    """In-place :func:`threshold`."""
    _int_or_float(input, "threshold_")
    th, v = _real(threshold, "threshold", "threshold_"), _real(value, "value", "threshold_")
    return run_inplace(input, _Threshold, "threshold_()", th, v)


@half_safe
class _Prelu(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any) -> Any:
        xp = xp_of(x)
        if w.size > 1:
            wb = w.reshape((1, -1) + (1,) * (x.ndim - 2))
        else:
            wb = w.reshape(())
        ctx.save_for_backward(x, wb)
        ctx.wshape = w.shape
        return xp.where(x > 0, x, wb * x)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, wb = ctx.saved_tensors
        xp = xp_of(x)
        pos = x > 0
        need = ctx.needs_input_grad
        gx = xp.where(pos, g, wb * g) if need[0] else None
        gw = None
        if need[1]:
            gwf = xp.where(pos, xp.zeros((), g.dtype), x * g)
            gw = sum_to(gwf, wb.shape).reshape(ctx.wshape)
        return gx, gw


@_autocast.op("prelu")
def prelu(input: Any, weight: Any) -> Tensor:  # noqa: A002 - torch's name
    """``x`` for x > 0, ``weight * x`` otherwise; ``weight`` has 1 element or one per channel
    (dimension 1; an input of fewer than 2 dimensions has one channel).

    Raises:
        RuntimeError: a 0-d input, a weight of more than 1 dimension, or a channel count that
            does not match.

    Example:
        >>> import mpitensor as mt
        >>> prelu(mt.tensor([-2.0, 1.0]), mt.tensor([0.25]))
        tensor([-0.5000,  1.0000])
    """
    t = _float_input(input, "prelu")
    w = as_tensor(weight, "weight", "prelu")
    x = t._data
    if x.ndim == 0:
        raise RuntimeError("prelu(): a 0-d input is not supported; give it a dimension")
    if w._data.ndim > 1:
        raise RuntimeError(f"prelu(): weight must be a scalar or 1-D tensor, got "
                           f"{w._data.ndim} dimensions")
    channels = x.shape[1] if x.ndim >= 2 else 1
    n = w._data.size
    if n != 1 and n != channels:
        raise RuntimeError(f"prelu(): weight has {n} elements but the input has {channels} "
                           f"channels; give one weight, or one per channel (dimension 1)")
    if w._data.dtype != x.dtype:
        raise RuntimeError(f"prelu(): input ({dtype_name(x.dtype)}) and weight "
                           f"({dtype_name(w._data.dtype)}) must have the same dtype")
    return _Prelu.apply(t, w)


@half_safe
class _MulMask(Function):
    """``x * mask`` for a constant ``mask`` (dropout's scaled keep mask, rrelu's noise): the
    gradient is the output's times the mask."""

    @staticmethod
    def forward(ctx: Any, x: Any, mask: Any) -> Any:
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (mask,) = ctx.saved_tensors
        return g * mask, None


def _rrelu_args(lower: Any, upper: Any, fname: str) -> tuple:
    lo, hi = _real(lower, "lower", fname), _real(upper, "upper", fname)
    if lo > hi:
        raise RuntimeError(f"{fname}(): lower ({lo}) must be less than or equal to upper ({hi})")
    return lo, hi


def _rrelu(input: Any, lo: float, hi: float, training: bool, inplace: bool,  # noqa: A002
           fname: str) -> Tensor:
    t = _float_input(input, fname)
    what = f"{fname}(inplace=True)" if fname == "rrelu" else f"{fname}()"
    if not training:
        s = (lo + hi) / 2
        if inplace:
            return run_inplace(input, _LeakyRelu, what, s)
        return _LeakyRelu.apply(t, s)
    x = t._data
    draw_dt = x.dtype if x.dtype in (_dt.float32, _dt.float64) else _dt.float32
    u = _draw("rand", tuple(x.shape), None, np.dtype(draw_dt), _backend.device_of(x))
    slopes = (lo + (hi - lo) * u).astype(x.dtype, copy=False)
    xp = xp_of(x)
    noise = xp.where(x <= 0, slopes, xp.ones((), x.dtype))  # the slope on negatives, else 1
    if inplace:
        return run_inplace(input, _MulMask, what, noise)
    return _MulMask.apply(t, noise)


def rrelu(input: Any, lower: float = 1.0 / 8, upper: float = 1.0 / 3,  # noqa: A002
          training: bool = False, inplace: bool = False) -> Tensor:
    """Randomized leaky ReLU: in training each non-positive element gets its own slope drawn
    uniformly from ``[lower, upper]`` (mpitensor's global generator, ``manual_seed``); in
    evaluation the slope is ``(lower + upper) / 2``.

    Raises:
        RuntimeError: ``lower > upper``.

    Example:
        >>> import mpitensor as mt
        >>> rrelu(mt.tensor([-1.0, 1.0]), 0.2, 0.4)
        tensor([-0.3000,  1.0000])
    """
    lo, hi = _rrelu_args(lower, upper, "rrelu")
    return _rrelu(input, lo, hi, bool(training), inplace, "rrelu")


def rrelu_(input: Any, lower: float = 1.0 / 8, upper: float = 1.0 / 3,  # noqa: A002
           training: bool = False) -> Tensor:
    """In-place :func:`rrelu`."""
    lo, hi = _rrelu_args(lower, upper, "rrelu_")
    return _rrelu(input, lo, hi, bool(training), True, "rrelu_")
