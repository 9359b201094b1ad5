"""Normalisation of ``torch.nn.functional``: ``batch_norm``, ``instance_norm``, ``group_norm``
and ``layer_norm`` (kernels in :mod:`mpitensor.nn._kernels.norm`)."""

from __future__ import annotations

import math
import numbers
from typing import Any

from mpitensor._core import autocast as _autocast
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor, _new

from .. import _kernels as K
from .._kernels import norm as NK
from .checks import (
    _arr,
    _as_input,
    _check_float,
    _check_same_device,
    _check_same_dtype,
    _half_with_float_params,
    _shape_str,
)

__all__ = ["batch_norm", "instance_norm", "group_norm", "layer_norm"]


# --------------------------------------------------------------------------------------------
# normalisation


def _check_per_channel(fname: str, what: str, v: Any, C: int, xshape: tuple) -> None:
    _as_input(v, what, fname)
    if tuple(_arr(v).shape) != (C,):
        raise RuntimeError(
            f"{fname}(): {what} must hold one value per channel, i.e. have shape [{C}] for an "
            f"input of shape {_shape_str(xshape)}; got shape {_shape_str(_arr(v).shape)}"
        )


def _channels_input(fname: str, input: Any) -> Any:  # noqa: A002 - torch's name
    """The array of a normalisation's (N, C, ...) float ``input``, checked."""
    _as_input(input, "input", fname)
    x = _arr(input)
    if x.ndim < 2:
        raise ValueError(
            f"{fname}(): input must have at least 2 dimensions (N, C, ...), got shape "
            f"{_shape_str(x.shape)}"
        )
    _check_float(input, "input", fname)
    return x


def _affine_norm(fname: str, public: Any, node: Any, input: Any, arg: Any,  # noqa: A002
                 node_arg: Any, weight: Any, bias: Any, eps: float) -> Tensor:
    """The common end of group_norm and layer_norm, ``public(input, arg, weight, bias, eps)``:
    a half input with float parameters computed in float32, the parameters' dtype and device
    checked, an empty input passed through, else ``node`` applied."""
    if _half_with_float_params(input, weight, bias):
        return public(input.float(), arg, weight, bias, eps).to(input.dtype)
    _check_same_dtype(fname, input=input, weight=weight, bias=bias)
    _check_same_device(fname, input=input, weight=weight, bias=bias)
    if _arr(input).size == 0:
        return (input if isinstance(input, Tensor) else _new(input)) * 1
    return node.apply(input, weight, bias, node_arg, float(eps))


class _BatchNorm(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, rm: Any, rv: Any, training: bool,
                momentum: float, eps: float) -> Any:
        xp = K.xp_of(x)
        lay = NK.channel_layout(x)
        x3 = lay.view(x)
        y, y3 = lay.empty(xp, x.dtype)
        if training:
            mean, invstd, var = NK.batch_norm_train(x3, y3, w, b, eps)
            NK.update_running_stats(rm, rv, mean, var, lay.A * lay.B, momentum)
        else:
            mean = rm.copy()  # the buffer may change in place before backward runs
            invstd = NK.batch_norm_eval(x3, y3, rm, rv, w, b, eps)
        ctx.save_for_backward(x3, mean, invstd, w)
        ctx.layout, ctx.training = lay, training
        return y

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x3, mean, invstd, w = ctx.saved_tensors
        lay = ctx.layout
        need = ctx.needs_input_grad
        dx = dx3 = None
        if need[0]:
            dx, dx3 = lay.empty(K.xp_of(g), g.dtype)
        _, dw, db = NK.batch_norm_backward(lay.view(g), x3, mean, invstd, w, ctx.training,
                                           (need[0], need[1], need[2]), dx3)
        return dx, dw, db, None, None, None, None, None


def batch_norm(input: Any, running_mean: Any, running_var: Any,  # noqa: A002 - torch's name
               weight: Any = None, bias: Any = None, training: bool = False, momentum: float = 0.1,
               eps: float = 1e-5) -> Tensor:
    """Batch normalisation over every dimension but the channels (dimension 1).

    With ``training=True`` the batch's own mean and biased variance normalise it, and the
    running statistics given (if any) are updated in place:
    ``running = (1 - momentum) * running + momentum * batch`` (the variance unbiased, as in
    torch). With ``training=False`` the running statistics normalise it. The output keeps the
    input's memory layout (conv2d's batch-innermost one included).

    Args:
        input: (N, C, *) floating point.
        running_mean, running_var: (C,) tensors (updated in training), or None.
        weight, bias: optional (C,) affine parameters.
        training: use (and track) the batch's statistics.
        momentum: the weight of the batch in the running update.
        eps: added to the variance for stability.

    Returns:
        The normalised tensor, shaped and laid out like ``input``.

    Raises:
        ValueError: an input of fewer than 2 dimensions, or one value per channel in
            training (no variance to take).
        RuntimeError: per-channel tensors of the wrong size, mixed dtypes or devices, or
            evaluation without running statistics.

    Example:
        >>> import mpitensor as mt
        >>> batch_norm(mt.tensor([[1.0], [3.0]]), None, None, training=True)
        tensor([[-1.0000],
                [ 1.0000]])
    """
    fname = "batch_norm"
    x = _channels_input(fname, input)
    C = x.shape[1]
    extras = {"weight": weight, "bias": bias, "running_mean": running_mean,
              "running_var": running_var}
    for name, v in extras.items():
        if v is not None:
            _check_per_channel(fname, name, v, C, x.shape)
    if _half_with_float_params(input, *extras.values()):
        return batch_norm(input.float(), running_mean, running_var, weight, bias, training,
                          momentum, eps).to(input.dtype)
    _check_same_dtype(fname, input=input, **extras)
    _check_same_device(fname, input=input, **extras)
    if not training and (running_mean is None or running_var is None):
        raise RuntimeError(
            f"{fname}(): evaluation (training=False) normalises with running_mean and "
            f"running_var, but {'running_mean' if running_mean is None else 'running_var'} "
            f"is None; pass both, or use training=True for the batch's own statistics"
        )
    if training and x.size == C:
        raise ValueError(
            f"{fname}(): training needs more than 1 value per channel to take a variance, but "
            f"the input has shape {_shape_str(x.shape)}; use a bigger batch or eval mode"
        )
    if x.size == 0:  # nothing to normalise, no statistics to take (torch leaves them alone)
        return (input if isinstance(input, Tensor) else _new(input)) * 1
    rm = _arr(running_mean) if running_mean is not None else None
    rv = _arr(running_var) if running_var is not None else None
    return _BatchNorm.apply(input, weight, bias, rm, rv, bool(training), float(momentum),
                            float(eps))


def instance_norm(input: Any, running_mean: Any = None,  # noqa: A002 - torch's name
                  running_var: Any = None, weight: Any = None, bias: Any = None,
                  use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalise each (sample, channel) plane of (N, C, ...) by its own mean and variance.

    It is :func:`batch_norm` over the input seen as one sample of N*C channels; the running
    statistics (when given and ``use_input_stats``) move toward the batch's average of the
    per-plane statistics, updated in place.

    Args:
        running_mean, running_var: optional (C,) running statistics.
        weight, bias: optional (C,) affine parameters.
        use_input_stats: normalise with the planes' own statistics (else the running ones).
        momentum: the weight of this batch in the running statistics.
        eps: added to the variance.

    Raises:
        ValueError: an input of fewer than 2 dimensions, or a single value per plane.

    Example:
        >>> import mpitensor as mt
        >>> instance_norm(mt.randn(2, 3, 5)).shape
        mpitensor.Size([2, 3, 5])
    """
    fname = "instance_norm"
    _as_input(input, "input", fname)
    t = input if isinstance(input, Tensor) else _new(input)
    if t.ndim < 2:
        raise ValueError(f"{fname}(): input must have at least 2 dimensions (N, C, ...), got "
                         f"shape {_shape_str(t.shape)}")
    if use_input_stats and math.prod(t.shape[2:]) == 1:
        raise ValueError(f"{fname}(): normalising with the input's statistics needs more than "
                         f"one spatial element per plane, got shape {_shape_str(t.shape)}")
    n, c = t.shape[0], t.shape[1]
    for name, v in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                    ("running_var", running_var)):
        if v is not None:
            _check_per_channel(fname, name, v, c, t.shape)
    xp = K.xp_of(t._data)

    def tiled(v: Any) -> Any:
        if v is None:
            return None
        return v.repeat(n) if isinstance(v, Tensor) else _new(xp.tile(_arr(v), n))

    rm, rv = tiled(running_mean), tiled(running_var)
    out = batch_norm(t.reshape((1, n * c, *t.shape[2:])), rm, rv, tiled(weight), tiled(bias),
                     bool(use_input_stats), momentum, eps)
    if use_input_stats:
        for buf, rep in ((running_mean, rm), (running_var, rv)):
            if buf is not None:
                _arr(buf)[...] = rep._data.reshape(n, c).mean(axis=0)
    return out.reshape(tuple(t.shape))


class _GroupNorm(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, groups: int, eps: float) -> Any:
        y, x2, ctx.layout, mean, invstd = NK.group_norm_forward(x, groups, w, b, eps)
        ctx.save_for_backward(x2, mean, invstd, w)
        ctx.groups = groups
        return y

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x2, mean, invstd, w = ctx.saved_tensors
        dx, dw, db = NK.group_norm_backward(g, x2, ctx.layout, ctx.groups, mean, invstd, w,
                                            tuple(ctx.needs_input_grad[:3]))
        return dx, dw, db, None, None


@_autocast.op("group_norm")
def group_norm(input: Any, num_groups: int, weight: Any = None,  # noqa: A002 - torch's name
               bias: Any = None, eps: float = 1e-5) -> Tensor:
    """Group normalisation: each sample's channels, in ``num_groups`` groups, normalised apart.

    Every (sample, group) pair is normalised by the mean and biased variance of its
    ``C / num_groups`` channels over all positions; then a per-channel affine map applies.

    Args:
        input: (N, C, *) floating point.
        num_groups: groups to split the C channels into (must divide C).
        weight, bias: optional (C,) affine parameters.
        eps: added to the variance for stability.

    Returns:
        The normalised tensor, shaped like ``input``.

    Raises:
        ValueError: an input of fewer than 2 dimensions, or num_groups not a positive int.
        RuntimeError: C not divisible by num_groups, parameters of the wrong size, mixed
            dtypes or devices.

    Example:
        >>> import mpitensor as mt
        >>> group_norm(mt.tensor([[1.0, 3.0]]), 1)
        tensor([[-1.0000,  1.0000]])
    """
    fname = "group_norm"
    if isinstance(num_groups, bool) or not isinstance(num_groups, numbers.Integral) \
            or num_groups <= 0:
        raise ValueError(f"{fname}(): num_groups must be a positive int, got {num_groups!r}")
    x = _channels_input(fname, input)
    C = x.shape[1]
    if C % num_groups:
        raise RuntimeError(
            f"{fname}(): the {C} channels of input {_shape_str(x.shape)} cannot be split into "
            f"num_groups={num_groups} equal groups; use a divisor of {C}"
        )
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None:
            _check_per_channel(fname, name, v, C, x.shape)
    return _affine_norm(fname, group_norm, _GroupNorm, input, num_groups, int(num_groups),
                        weight, bias, eps)


class _LayerNorm(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, k: int, eps: float) -> Any:
        x2 = K.xp_of(x).ascontiguousarray(x).reshape(-1, math.prod(x.shape[x.ndim - k:]))
        wf = w.reshape(-1) if w is not None else None
        bf = b.reshape(-1) if b is not None else None
        y2, mean, invstd = NK.layer_norm_forward(x2, wf, bf, eps)
        ctx.save_for_backward(x2, mean, invstd, wf)
        ctx.xshape = x.shape
        ctx.pshape = None if w is None and b is None else (w if w is not None else b).shape
        return y2.reshape(x.shape)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x2, mean, invstd, wf = ctx.saved_tensors
        need = ctx.needs_input_grad
        g2 = K.xp_of(g).ascontiguousarray(g).reshape(x2.shape)
        dx, dw, db = NK.layer_norm_backward(g2, x2, mean, invstd, wf,
                                            (need[0], need[1], need[2]))
        dx = dx.reshape(ctx.xshape) if dx is not None else None
        dw = dw.reshape(ctx.pshape) if dw is not None else None
        db = db.reshape(ctx.pshape) if db is not None else None
        return dx, dw, db, None, None


def _normalized_shape(normalized_shape: Any, fname: str) -> tuple:
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) \
        else normalized_shape
    try:
        shape = tuple(shape)
    except TypeError:
        raise TypeError(
            f"{fname}(): normalized_shape must be an int or a sequence of ints, got "
            f"{normalized_shape!r}"
        ) from None
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in shape):
        raise TypeError(
            f"{fname}(): normalized_shape must be an int or a sequence of ints, got "
            f"{normalized_shape!r}"
        )
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(
            f"{fname}(): normalized_shape must hold at least one dimension, each > 0, got "
            f"{normalized_shape!r}"
        )
    return tuple(int(s) for s in shape)


@_autocast.op("layer_norm")
def layer_norm(input: Any, normalized_shape: Any, weight: Any = None,  # noqa: A002 - torch's name
               bias: Any = None, eps: float = 1e-5) -> Tensor:
    """Layer normalisation over the last ``len(normalized_shape)`` dimensions.

    Each slice over those dimensions is normalised by its mean and biased variance; then an
    elementwise affine map (``weight``, ``bias`` shaped ``normalized_shape``) applies.

    Args:
        input: (*, *normalized_shape) floating point.
        normalized_shape: an int or a sequence of ints: the trailing shape to normalise.
        weight, bias: optional tensors of shape ``normalized_shape``.
        eps: added to the variance for stability.

    Returns:
        The normalised tensor, shaped like ``input``.

    Raises:
        TypeError, ValueError: a malformed normalized_shape.
        RuntimeError: an input whose trailing shape is not normalized_shape, parameters of
            the wrong shape, mixed dtypes or devices.

    Example:
        >>> import mpitensor as mt
        >>> layer_norm(mt.tensor([[1.0, 3.0]]), 2)
        tensor([[-1.0000,  1.0000]])
    """
    fname = "layer_norm"
    _as_input(input, "input", fname)
    shape = _normalized_shape(normalized_shape, fname)
    x = _arr(input)
    k = len(shape)
    if x.ndim < k or tuple(x.shape[x.ndim - k:]) != shape:
        raise RuntimeError(
            f"{fname}(): normalized_shape={list(shape)} must be the input's trailing shape, "
            f"i.e. the input must be [*, {', '.join(map(str, shape))}], but it is "
            f"{_shape_str(x.shape)}"
        )
    _check_float(input, "input", fname)
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None:
            _as_input(v, name, fname)
            if tuple(_arr(v).shape) != shape:
                raise RuntimeError(
                    f"{fname}(): {name} must have shape normalized_shape={list(shape)}, got "
                    f"{_shape_str(_arr(v).shape)}"
                )
    return _affine_norm(fname, layer_norm, _LayerNorm, input, normalized_shape, k, weight, bias,
                        eps)
