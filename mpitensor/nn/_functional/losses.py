"""Losses of ``torch.nn.functional`` beyond the classification ones: regression (``l1_loss``,
``smooth_l1_loss``, ``huber_loss``, ``poisson_nll_loss``, ``gaussian_nll_loss``), margin and
embedding losses (``soft_margin_loss``, ``margin_ranking_loss``, ``hinge_embedding_loss``,
``cosine_embedding_loss``, ``triplet_margin_loss``, ``triplet_margin_with_distance_loss``) and
the multi-label/multi-class margin losses.

Losses that torch computes with one kernel are one autograd Function here (forward and
backward side by side); those it builds from other ops are built from the same ops here, so
their gradients (at the kinks too) are the ones torch's autograd finds. Every one takes
``reduction='mean' | 'sum' | 'none'`` (and torch's deprecated ``size_average``/``reduce``
where torch has them).

Re-exported by :mod:`mpitensor.nn.functional`; import them from there.

Example:
    >>> import mpitensor as mt
    >>> l1_loss(mt.tensor([1.0, -1.0]), mt.tensor([0.0, 0.0]))
    tensor(1.)
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._base import determinism as _determinism
from mpitensor._core import autocast as _autocast
from mpitensor._core import half as _half
from mpitensor.autograd import ArrayFunction as Function, grad_enabled_for
from mpitensor.tensor import Tensor

from .activations import logsigmoid
from .checks import (
    REDUCTIONS,
    PassClamped,
    arr,
    as_tensor,
    check_same_device,
    dtype_name,
    float_result,
    is_number,
    loss_grad,
    quiet,
    reduce_loss,
    reduce_tensor,
    reduction_of,
    shape_str,
    sum_to,
    warn_broadcast,
    xp_of,
)
from .checks import real_number as _real
from .distance import pairwise_distance

__all__ = [
    "l1_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss", "margin_ranking_loss",
    "hinge_embedding_loss", "cosine_embedding_loss", "triplet_margin_loss",
    "triplet_margin_with_distance_loss", "poisson_nll_loss", "gaussian_nll_loss",
    "multilabel_soft_margin_loss", "multi_margin_loss", "multilabel_margin_loss",
]


def _pair_inputs(fname: str, input: Any, target: Any) -> tuple:  # noqa: A002
    """(input, target) as Tensors of one floating dtype, checked; the broadcast shape."""
    x = as_tensor(input, "input", fname)
    t = as_tensor(target, "target", fname)
    check_same_device(fname, input=x, target=t)
    shape = warn_broadcast(fname, x, t)
    dt = float_result(x, t)
    if not (_dt.is_floating_dtype(arr(x).dtype) or _dt.is_floating_dtype(arr(t).dtype)):
        raise RuntimeError(
            f"{fname}(): input ({dtype_name(arr(x).dtype)}) and target "
            f"({dtype_name(arr(t).dtype)}) are not floating point; convert them, e.g. x.float()")
    return x, t, shape, dt


# --------------------------------------------------------------------------------------------
# l1, smooth l1, huber


@_half.computes_in_float32
class _Regression(Function):
    """``kind`` 'l1': |d|; 'smooth_l1' (param beta): 0.5 d^2 / beta inside |d| < beta, else
    |d| - beta / 2; 'huber' (param delta): 0.5 d^2 inside |d| < delta, else
    delta (|d| - delta / 2); d = x - y, broadcast."""

    @staticmethod
    def forward(ctx: Any, x: Any, y: Any, kind: str, param: float, reduction: str,
                dtype: Any) -> Any:
        xp = xp_of(x)
        if dtype in _half.REDUCED:
            dtype = _dt.float32  # widened by the decorator; rounded back once at the end
        d = x.astype(dtype, copy=False) - y.astype(dtype, copy=False)
        a = abs(d)
        if kind == "l1":
            loss = a
        elif kind == "smooth_l1":
            loss = xp.where(a < param, (0.5 / param) * d * d if param else a, a - 0.5 * param)
        else:
            loss = xp.where(a < param, 0.5 * d * d, param * (a - 0.5 * param))
        ctx.save_for_backward(d)
        ctx.meta = (kind, param, reduction, x.shape, y.shape, x.dtype, y.dtype)
        return reduce_loss(loss, reduction)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (d,) = ctx.saved_tensors
        kind, param, reduction, xs, ys, xdt, ydt = ctx.meta
        xp = xp_of(d)
        gs = loss_grad(g, reduction, d.shape)
        one = xp.ones((), d.dtype)
        if kind == "l1" or (kind == "smooth_l1" and param == 0):
            gd = xp.sign(d)
        elif kind == "smooth_l1":
            gd = xp.where(d <= -param, -one, xp.where(d >= param, one, d / param))
        else:
            gd = xp.where(d < -param, -param * one, xp.where(d > param, param * one, d))
        gd = gd * gs
        need = ctx.needs_input_grad
        dx = sum_to(gd, xs).astype(xdt, copy=False) if need[0] else None
        dy = (-sum_to(gd, ys)).astype(ydt, copy=False) if need[1] else None
        return dx, dy, None, None, None, None


def _weighted(fname: str, loss: Tensor, weight: Any, x: Tensor, reduction: str,
              mean_by_weight: bool) -> Tensor:
    w = as_tensor(weight, "weight", fname)
    if tuple(w.shape) != tuple(x.shape):
        raise ValueError(f"{fname}(): weight of shape {shape_str(w.shape)} must have the "
                         f"input's shape {shape_str(x.shape)}")
    wl = loss * w
    if reduction == "none":
        return wl
    if reduction == "sum":
        return wl.sum()
    return wl.sum() / w.sum() if mean_by_weight else wl.mean()


@_autocast.op("l1_loss")
def l1_loss(input: Any, target: Any, size_average: Any = None,  # noqa: A002 - torch's name
            reduce: Any = None, reduction: str = "mean", weight: Any = None) -> Tensor:
    """Mean absolute error ``|input - target|``.

    Args:
        input, target: tensors of one shape (broadcast, with torch's warning, otherwise).
        size_average, reduce: torch's deprecated flags (folded into ``reduction``).
        reduction: ``'mean'``, ``'sum'`` or ``'none'``.
        weight: optional per-element weights of the input's shape; ``'mean'`` then divides
            by the weights' sum.

    Returns:
        The loss; gradients flow to input, target and weight.

    Raises:
        RuntimeError: shapes that do not broadcast, non-float tensors.
        ValueError: an unknown reduction, a weight of another shape.

    Example:
        >>> import mpitensor as mt
        >>> l1_loss(mt.tensor([1.0, 3.0]), mt.tensor([0.0, 0.0]), reduction="sum")
        tensor(4.)
    """
    reduction = reduction_of(reduction, size_average, reduce, "l1_loss")
    x, t, _, dt = _pair_inputs("l1_loss", input, target)
    if weight is not None:
        loss = _Regression.apply(x, t, "l1", 0.0, "none", dt)
        return _weighted("l1_loss", loss, weight, x, reduction, True)
    return _Regression.apply(x, t, "l1", 0.0, reduction, dt)


def _threshold(fname: str, name: str, value: Any, zero_ok: bool) -> float:
    """The switch point of smooth_l1 (``beta``, may be 0) or huber (``delta``, > 0) as a float.

    Raises:
        RuntimeError: a value below the bound (NaN included), as torch.
    """
    v = _real(value, name, fname)
    if not (v >= 0 if zero_ok else v > 0):
        raise RuntimeError(f"{fname}(): {name} must be {'non-negative' if zero_ok else 'positive'}"
                           f", got {v}")
    return v


@_autocast.op("smooth_l1_loss")
def smooth_l1_loss(input: Any, target: Any, size_average: Any = None,  # noqa: A002
                   reduce: Any = None, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """Squared error below ``beta`` (scaled by ``1 / beta``), absolute error above it.

    Raises:
        RuntimeError: a negative ``beta``; shapes that do not broadcast.

    Example:
        >>> import mpitensor as mt
        >>> smooth_l1_loss(mt.tensor([0.5, 3.0]), mt.tensor([0.0, 0.0]), reduction="none")
        tensor([0.1250, 2.5000])
    """
    reduction = reduction_of(reduction, size_average, reduce, "smooth_l1_loss")
    b = _threshold("smooth_l1_loss", "beta", beta, zero_ok=True)
    x, t, _, dt = _pair_inputs("smooth_l1_loss", input, target)
    return _Regression.apply(x, t, "smooth_l1", b, reduction, dt)


@_autocast.op("huber_loss")
def huber_loss(input: Any, target: Any, reduction: str = "mean",  # noqa: A002 - torch's name
               delta: float = 1.0, weight: Any = None) -> Tensor:
    """Squared error (halved) below ``delta``, ``delta``-scaled absolute error above it.

    Args:
        weight: optional per-element weights of the input's shape (``'mean'`` averages the
            weighted losses).

    Raises:
        RuntimeError: ``delta <= 0``. ValueError: an unknown reduction, a weight of another
            shape.

    Example:
        >>> import mpitensor as mt
        >>> huber_loss(mt.tensor([0.5, 3.0]), mt.tensor([0.0, 0.0]), reduction="none", delta=2.0)
        tensor([0.1250, 4.0000])
    """
    reduction = reduction_of(reduction, None, None, "huber_loss")
    d = _threshold("huber_loss", "delta", delta, zero_ok=False)
    x, t, _, dt = _pair_inputs("huber_loss", input, target)
    if weight is not None:
        loss = _Regression.apply(x, t, "huber", d, "none", dt)
        return _weighted("huber_loss", loss, weight, x, reduction, False)
    return _Regression.apply(x, t, "huber", d, reduction, dt)


# --------------------------------------------------------------------------------------------
# soft margin


@_half.computes_in_float32
class _SoftMargin(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, y: Any, reduction: str, dtype: Any) -> Any:
        xp = xp_of(x)
        if dtype in _half.REDUCED:
            dtype = _dt.float32
        z = -(y.astype(dtype, copy=False) * x.astype(dtype, copy=False))
        with quiet(xp):
            e = xp.exp(z)
            loss = xp.log1p(e)
        ctx.save_for_backward(y, e)
        ctx.meta = (reduction, x.shape, x.dtype)
        return reduce_loss(loss, reduction)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        y, e = ctx.saved_tensors
        reduction, xs, xdt = ctx.meta
        xp = xp_of(e)
        gs = loss_grad(g, reduction, e.shape)
        with quiet(xp):
            gx = -y * e / (1 + e) * gs
        return sum_to(gx, xs).astype(xdt, copy=False), None, None, None


@_autocast.op("soft_margin_loss")
def soft_margin_loss(input: Any, target: Any, size_average: Any = None,  # noqa: A002
                     reduce: Any = None, reduction: str = "mean") -> Tensor:
    """Two-class logistic loss ``log(1 + exp(-target * input))``, targets in {1, -1}.

    Raises:
        RuntimeError: a target that requires grad (the loss has no gradient for it).

    Example:
        >>> import mpitensor as mt
        >>> round(float(soft_margin_loss(mt.tensor([0.0]), mt.tensor([1.0]))), 4)
        0.6931
    """
    reduction = reduction_of(reduction, size_average, reduce, "soft_margin_loss")
    x, t, _, dt = _pair_inputs("soft_margin_loss", input, target)
    if grad_enabled_for(t):
        raise RuntimeError("soft_margin_loss(): no gradient is defined with respect to "
                           "'target', but it requires grad; pass target.detach()")
    return _SoftMargin.apply(x, arr(t), reduction, dt)


# --------------------------------------------------------------------------------------------
# composite margin losses


@_autocast.op("margin_ranking_loss")
def margin_ranking_loss(input1: Any, input2: Any, target: Any, margin: float = 0.0,
                        size_average: Any = None, reduce: Any = None,
                        reduction: str = "mean") -> Tensor:
    """``max(0, -target * (input1 - input2) + margin)``: ``target = 1`` asks for input1 to
    rank above input2, ``-1`` below. The three broadcast, but must have one number of
    dimensions.

    Raises:
        RuntimeError: different numbers of dimensions.

    Example:
        >>> import mpitensor as mt
        >>> margin_ranking_loss(mt.tensor([1.0]), mt.tensor([2.0]), mt.tensor([1.0]))
        tensor(1.)
    """
    reduction = reduction_of(reduction, size_average, reduce, "margin_ranking_loss")
    a = as_tensor(input1, "input1", "margin_ranking_loss")
    b = as_tensor(input2, "input2", "margin_ranking_loss")
    t = as_tensor(target, "target", "margin_ranking_loss")
    if not a.ndim == b.ndim == t.ndim:
        raise RuntimeError(
            f"margin_ranking_loss(): input1, input2 and target must have the same number of "
            f"dimensions, got shapes {shape_str(a.shape)}, {shape_str(b.shape)} and "
            f"{shape_str(t.shape)}")
    m = _real(margin, "margin", "margin_ranking_loss")
    loss = (-t * (a - b) + m).clamp(min=0)
    return reduce_tensor(loss, reduction)


@_autocast.op("hinge_embedding_loss")
def hinge_embedding_loss(input: Any, target: Any, margin: float = 1.0,  # noqa: A002
                         size_average: Any = None, reduce: Any = None,
                         reduction: str = "mean") -> Tensor:
    """``input`` where ``target == 1``, ``max(0, margin - input)`` where ``target == -1``
    (other target values take both terms, as in torch).

    Example:
        >>> import mpitensor as mt
        >>> hinge_embedding_loss(mt.tensor([0.3, 0.3]), mt.tensor([1.0, -1.0]),
        ...                      reduction="none")
        tensor([0.3000, 0.7000])
    """
    reduction = reduction_of(reduction, size_average, reduce, "hinge_embedding_loss")
    x = as_tensor(input, "input", "hinge_embedding_loss")
    t = as_tensor(target, "target", "hinge_embedding_loss")
    m = _real(margin, "margin", "hinge_embedding_loss")
    below = (m - x).clamp(min=0).masked_fill(t == 1, 0.0)
    above = x.masked_fill(t == -1, 0.0)
    return reduce_tensor(below + above, reduction)


_COS_EPS = 1e-12


@_autocast.op("cosine_embedding_loss")
def cosine_embedding_loss(input1: Any, input2: Any, target: Any, margin: float = 0.0,
                          size_average: Any = None, reduce: Any = None,
                          reduction: str = "mean") -> Tensor:
    """``1 - cos(x1, x2)`` where ``target == 1``, ``max(0, cos(x1, x2) - margin)`` where
    ``target == -1``; the cosine is over the last dimension (2-D inputs with a 1-D target, or
    1-D inputs with a 0-d target).

    Raises:
        RuntimeError: a target of more than 1 dimension, inputs of the wrong rank or shape.

    Example:
        >>> import mpitensor as mt
        >>> cosine_embedding_loss(mt.tensor([[1.0, 0.0]]), mt.tensor([[1.0, 0.0]]),
        ...                       mt.tensor([1.0]))
        tensor(0.)
    """
    fname = "cosine_embedding_loss"
    reduction = reduction_of(reduction, size_average, reduce, fname)
    a, b = as_tensor(input1, "input1", fname), as_tensor(input2, "input2", fname)
    t = as_tensor(target, "target", fname)
    if t.ndim > 1:
        raise RuntimeError(f"{fname}(): the target must be 0-d or 1-D (one label per pair), "
                           f"got shape {shape_str(t.shape)}")
    want = t.ndim + 1
    if a.ndim != want or b.ndim != want:
        raise RuntimeError(f"{fname}(): a {t.ndim}-D target goes with {want}-D inputs, got "
                           f"inputs of shapes {shape_str(a.shape)} and {shape_str(b.shape)}")
    if tuple(a.shape) != tuple(b.shape):
        raise RuntimeError(f"{fname}(): input1 and input2 must have the same shape, got "
                           f"{shape_str(a.shape)} and {shape_str(b.shape)}")
    if t.ndim == 1 and t.shape[0] != a.shape[0]:
        raise RuntimeError(f"{fname}(): the target has {t.shape[0]} labels for {a.shape[0]} "
                           f"pairs")
    dim = t.ndim
    dot = (a * b).sum(dim)
    sq1 = (a * a).sum(dim) + _COS_EPS
    sq2 = (b * b).sum(dim) + _COS_EPS
    cos = dot / (sq1 * sq2).sqrt()
    m = _real(margin, "margin", fname)
    pos = (1 - cos).masked_fill(t != 1, 0.0)
    neg = (cos - m).clamp(min=0).masked_fill(t != -1, 0.0)
    return reduce_tensor(pos + neg, reduction)


class _Minimum(Function):
    """Elementwise minimum; a tie splits the gradient in halves (torch's choice)."""

    @staticmethod
    def forward(ctx: Any, a: Any, b: Any) -> Any:
        ctx.save_for_backward(a, b)
        return xp_of(a).minimum(a, b)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        a, b = ctx.saved_tensors
        xp = xp_of(a)
        tie = a == b
        zero = xp.zeros((), g.dtype)
        ga = xp.where(tie, g / 2, xp.where(a < b, g, zero))
        gb = xp.where(tie, g / 2, xp.where(b < a, g, zero))
        return sum_to(ga, a.shape), sum_to(gb, b.shape)


def _triplet(fname: str, anchor: Any, positive: Any, negative: Any,
             dist: Callable[[Any, Any], Tensor], margin: float, swap: bool,
             reduction: str) -> Tensor:
    a = as_tensor(anchor, "anchor", fname)
    p = as_tensor(positive, "positive", fname)
    n = as_tensor(negative, "negative", fname)
    if not a.ndim == p.ndim == n.ndim:
        raise RuntimeError(f"{fname}(): anchor, positive and negative must have the same number "
                           f"of dimensions, got {a.ndim}-D, {p.ndim}-D and {n.ndim}-D")
    d_pos = dist(a, p)
    d_neg = dist(a, n)
    if swap:
        d_neg = _Minimum.apply(d_neg, dist(p, n))
    return reduce_tensor((margin + d_pos - d_neg).clamp(min=0), reduction)


@_autocast.op("triplet_margin_loss")
def triplet_margin_loss(anchor: Any, positive: Any, negative: Any, margin: float = 1.0,
                        p: float = 2, eps: float = 1e-6, swap: bool = False,
                        size_average: Any = None, reduce: Any = None,
                        reduction: str = "mean") -> Tensor:
    """``max(0, d(a, p) - d(a, n) + margin)`` with d the :func:`pairwise_distance` of norm
    ``p``; ``swap`` uses ``min(d(a, n), d(p, n))`` for the negative distance.

    Raises:
        RuntimeError: inputs of different numbers of dimensions. ValueError: ``margin <= 0``.

    Example:
        >>> import mpitensor as mt
        >>> a = mt.tensor([[0.0, 0.0]])
        >>> triplet_margin_loss(a, mt.tensor([[0.0, 1.0]]), mt.tensor([[0.0, 3.0]]), eps=0.0)
        tensor(0.)
    """
    fname = "triplet_margin_loss"
    reduction = reduction_of(reduction, size_average, reduce, fname)
    m = _real(margin, "margin", fname)
    if not m > 0:
        raise ValueError(f"{fname}(): margin must be greater than 0, got {m}")
    pv, ev = _real(p, "p", fname), _real(eps, "eps", fname)
    a = as_tensor(anchor, "anchor", fname)
    if a.ndim not in (1, 2):
        raise RuntimeError(f"{fname}(): expected 1-D or 2-D (N, D) inputs, got anchor of shape "
                           f"{shape_str(a.shape)}")

    def dist(u: Any, v: Any) -> Tensor:
        return pairwise_distance(u, v, pv, ev)

    return _triplet(fname, anchor, positive, negative, dist, m, bool(swap), reduction)


def triplet_margin_with_distance_loss(anchor: Any, positive: Any, negative: Any, *,
                                      distance_function: Optional[Callable] = None,
                                      margin: float = 1.0, swap: bool = False,
                                      reduction: str = "mean") -> Tensor:
    """:func:`triplet_margin_loss` with any ``distance_function(x1, x2) -> Tensor``
    (default :func:`pairwise_distance`).

    Raises:
        ValueError: ``margin <= 0`` or an unknown reduction.

    Example:
        >>> import mpitensor as mt
        >>> a = mt.tensor([[0.0, 0.0]])
        >>> triplet_margin_with_distance_loss(a, a, mt.tensor([[0.0, 3.0]]))
        tensor(0.)
    """
    fname = "triplet_margin_with_distance_loss"
    if reduction not in REDUCTIONS:
        raise ValueError(f"{fname}(): {reduction!r} is not a valid value for reduction")
    m = _real(margin, "margin", fname)
    if not m > 0:
        raise ValueError(f"{fname}(): margin must be greater than 0, got {m}")
    dist = distance_function if distance_function is not None else pairwise_distance
    return _triplet(fname, anchor, positive, negative, dist, m, bool(swap), reduction)


# --------------------------------------------------------------------------------------------
# likelihood losses


@_autocast.op("poisson_nll_loss")
def poisson_nll_loss(input: Any, target: Any, log_input: bool = True,  # noqa: A002
                     full: bool = False, size_average: Any = None, eps: float = 1e-8,
                     reduce: Any = None, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of ``target`` under a Poisson of rate ``input``:
    ``exp(input) - target * input`` for ``log_input`` (the input is the log-rate), else
    ``input - target * log(input + eps)``; ``full`` adds Stirling's approximation of
    ``log(target!)`` where ``target > 1``.

    Example:
        >>> import mpitensor as mt
        >>> poisson_nll_loss(mt.tensor([0.0]), mt.tensor([1.0]))
        tensor(1.)
    """
    fname = "poisson_nll_loss"
    reduction = reduction_of(reduction, size_average, reduce, fname)
    x, t = as_tensor(input, "input", fname), as_tensor(target, "target", fname)
    if log_input:
        loss = x.exp() - t * x
    else:
        loss = x - t * (x + _real(eps, "eps", fname)).log()
    if full:
        with np.errstate(all="ignore"):
            stirling = t * t.log() - t + 0.5 * (2 * math.pi * t).log()
        loss = loss + stirling.masked_fill(t <= 1, 0.0)
    return reduce_tensor(loss, reduction)


def gaussian_nll_loss(input: Any, target: Any, var: Any, full: bool = False,  # noqa: A002
                      eps: float = 1e-6, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of ``target`` under a Gaussian of mean ``input`` and variance
    ``var``: ``0.5 * (log(var) + (input - target)^2 / var)`` (+ ``0.5 * log(2 pi)`` with
    ``full``).

    ``var`` is a number, a tensor of the input's shape, the input's shape without its last
    dimension, or the input's shape with one dimension of size 1 (one variance shared along
    it). It is floored at ``eps`` with the gradient passing as if it were not.

    Raises:
        ValueError: a negative variance, a variance of another shape, an unknown reduction.

    Example:
        >>> import mpitensor as mt
        >>> gaussian_nll_loss(mt.tensor([1.0]), mt.tensor([1.0]), mt.tensor([1.0]))
        tensor(0.)
    """
    fname = "gaussian_nll_loss"
    x, t = as_tensor(input, "input", fname), as_tensor(target, "target", fname)
    if is_number(var):
        if var < 0:
            raise ValueError(f"{fname}(): var must be non-negative, got {var}")
        v = x.detach() * 0 + float(var)
    else:
        v = as_tensor(var, "var", fname)
        if v.numel() and bool((arr(v) < 0).any()):
            raise ValueError(f"{fname}(): var has negative entries")
    xs, vs = tuple(x.shape), tuple(v.shape)
    if vs != xs:
        if xs[:-1] == vs:
            v = v.unsqueeze(-1)
        elif len(xs) == len(vs) and sum(b for a, b in zip(xs, vs) if a != b) == 1:
            pass  # one dimension of size 1 to broadcast along
        else:
            raise ValueError(f"{fname}(): var of shape {shape_str(vs)} does not fit the input "
                             f"of shape {shape_str(xs)}; give it the input's shape, that shape "
                             f"without its last dimension, or size 1 along one dimension")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{fname}(): {reduction!r} is not a valid value for reduction")
    v = PassClamped.apply(v, _real(eps, "eps", fname))
    loss = 0.5 * (v.log() + (x - t) ** 2 / v)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return reduce_tensor(loss, reduction)


# --------------------------------------------------------------------------------------------
# multi-label / multi-class margins


def multilabel_soft_margin_loss(input: Any, target: Any, weight: Any = None,  # noqa: A002
                                size_average: Any = None, reduce: Any = None,
                                reduction: str = "mean") -> Tensor:
    """Per-class logistic loss averaged over the classes (the last dimension):
    ``-(t log sigmoid(x) + (1 - t) log sigmoid(-x))``, times ``weight`` per class if given.

    Example:
        >>> import mpitensor as mt
        >>> round(float(multilabel_soft_margin_loss(mt.zeros(1, 2), mt.tensor([[1.0, 0.0]]))), 4)
        0.6931
    """
    fname = "multilabel_soft_margin_loss"
    reduction = reduction_of(reduction, size_average, reduce, fname)
    x, t = as_tensor(input, "input", fname), as_tensor(target, "target", fname)
    loss = -(t * logsigmoid(x) + (1 - t) * logsigmoid(-x))
    if weight is not None:
        loss = loss * as_tensor(weight, "weight", fname)
    c = x.shape[-1] if x.ndim else 1
    loss = loss.sum(x.ndim - 1 if x.ndim else 0) / c
    return reduce_tensor(loss, reduction)


def _class_rows(fname: str, x: Any, t: Any) -> tuple:
    """(N, C) rows of a (C,) or (N, C) input and its (N,) integer targets, checked."""
    if x.ndim not in (1, 2) or x.shape[-1] == 0:
        raise RuntimeError(f"{fname}(): expected a non-empty 1-D (C) or 2-D (N, C) input, got "
                           f"shape {shape_str(x.shape)}")
    if _dt.kind_of(t.dtype) not in "iu":
        raise RuntimeError(f"{fname}(): the target must hold integer class indices, got "
                           f"{dtype_name(t.dtype)}")
    n = 1 if x.ndim == 1 else x.shape[0]
    return n, x.shape[-1]


@_half.computes_in_float32
class _MultiMargin(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, t: Any, w: Any, p: int, margin: float, reduction: str,
                out_shape: tuple) -> Any:
        xp = xp_of(x)
        rows = x.reshape(-1, x.shape[-1])
        n, c = rows.shape
        tt = t.reshape(-1).astype(np.int64)
        picked = rows[xp.arange(n), tt][:, None]
        z = margin - picked + rows
        active = z > 0
        active[xp.arange(n), tt] = False
        zp = xp.where(active, z if p == 1 else z * z, xp.zeros((), x.dtype))
        scale = (w.astype(x.dtype, copy=False)[tt] if w is not None
                 else xp.ones(n, x.dtype))[:, None] / c
        per = (zp * scale).sum(axis=1)
        ctx.save_for_backward(z, active, scale)
        ctx.meta = (tt, p, reduction, x.shape)
        if reduction == "none":
            return per.reshape(out_shape)
        return reduce_loss(per, reduction)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        z, active, scale = ctx.saved_tensors
        tt, p, reduction, xs = ctx.meta
        xp = xp_of(z)
        n = z.shape[0]
        gs = g.reshape(-1, 1) if reduction == "none" else loss_grad(g, reduction, (n,))
        d = xp.where(active, (1.0 if p == 1 else 2.0 * z), 0.0).astype(z.dtype) * scale * gs
        gx = d.copy()
        gx[xp.arange(n), tt] -= d.sum(axis=1)
        return gx.reshape(xs), None, None, None, None, None, None


@_autocast.op("multi_margin_loss")
def multi_margin_loss(input: Any, target: Any, p: int = 1, margin: float = 1.0,  # noqa: A002
                      weight: Any = None, size_average: Any = None, reduce: Any = None,
                      reduction: str = "mean") -> Tensor:
    """Multi-class hinge loss: for each sample, ``sum_{i != y} max(0, margin - x[y] + x[i])^p``
    over the C classes, divided by C (times ``weight[y]`` if given).

    Raises:
        ValueError: ``p`` other than 1 or 2. RuntimeError: a target out of range, wrong
            shapes.

    Example:
        >>> import mpitensor as mt
        >>> multi_margin_loss(mt.tensor([[0.0, 0.5]]), mt.tensor([0]))
        tensor(0.7500)
    """
    fname = "multi_margin_loss"
    reduction = reduction_of(reduction, size_average, reduce, fname)
    if p not in (1, 2) or isinstance(p, bool):
        raise ValueError(f"{fname}(): p must be 1 or 2, got {p!r}")
    x, t = as_tensor(input, "input", fname), as_tensor(target, "target", fname)
    xa, ta = arr(x), arr(t)
    n, c = _class_rows(fname, xa, ta)
    if ta.size != n or ta.ndim > 1:
        raise RuntimeError(f"{fname}(): expected a target of {n} class indices for an input of "
                           f"shape {shape_str(xa.shape)}, got shape {shape_str(ta.shape)}")
    if ta.size and (int(ta.min()) < 0 or int(ta.max()) >= c):
        raise RuntimeError(f"{fname}(): target out of range: class indices must lie in "
                           f"[0, {c - 1}]")
    w = None
    if weight is not None:
        w = arr(as_tensor(weight, "weight", fname))
        if w.ndim != 1 or w.shape[0] != c:
            raise RuntimeError(f"{fname}(): weight must be 1-D with {c} elements, got shape "
                               f"{shape_str(w.shape)}")
    out_shape = tuple(ta.shape) if xa.ndim == 2 or ta.ndim == 1 else ()
    return _MultiMargin.apply(x, ta, w, int(p), _real(margin, "margin", fname), reduction,
                              out_shape)


@_half.computes_in_float32
class _MultiLabelMargin(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, t: Any, reduction: str, out_shape: tuple) -> Any:
        xp = xp_of(x)
        rows = x.reshape(-1, x.shape[-1])
        n, c = rows.shape
        tt = t.reshape(n, c).astype(np.int64)
        # the targets of a row are its entries before the first -1
        valid = xp.cumprod(tt >= 0, axis=1).astype(bool)
        safe = xp.where(valid, tt, 0)
        is_target = xp.zeros((n, c), bool)
        rr = xp.broadcast_to(xp.arange(n)[:, None], (n, c))
        is_target[rr[valid], safe[valid]] = True
        picked = xp.take_along_axis(rows, safe, axis=1)  # (n, j)
        z = 1 - picked[:, :, None] + rows[:, None, :]  # (n, j, i)
        active = (z > 0) & valid[:, :, None] & ~is_target[:, None, :]
        per = xp.where(active, z, xp.zeros((), x.dtype)).sum(axis=(1, 2)) / c
        ctx.save_for_backward(active)
        ctx.meta = (safe, reduction, x.shape, c)
        if reduction == "none":
            return per.reshape(out_shape)
        return reduce_loss(per, reduction)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (active,) = ctx.saved_tensors
        safe, reduction, xs, c = ctx.meta
        xp = xp_of(active)
        n = active.shape[0]
        gs = g.reshape(-1) if reduction == "none" else loss_grad(g, reduction, (n,))
        gs = xp.broadcast_to(xp.asarray(gs, dtype=g.dtype), (n,))
        a = active.astype(g.dtype) * (gs / c)[:, None, None]
        gx = a.sum(axis=1)  # + for every non-target class i
        minus = a.sum(axis=2)  # - for every target class y_j
        rr = xp.broadcast_to(xp.arange(n)[:, None], safe.shape)
        if xp is np:
            np.subtract.at(gx, (rr, safe), minus)
        elif not _determinism.add_at(gx, (rr, safe), -minus):  # atomics unless deterministic
            import cupyx  # noqa: PLC0415 - only on GPUs

            cupyx.scatter_add(gx, (rr, safe), -minus)
        return gx.reshape(xs), None, None, None


@_autocast.op("multilabel_margin_loss")
def multilabel_margin_loss(input: Any, target: Any, size_average: Any = None,  # noqa: A002
                           reduce: Any = None, reduction: str = "mean") -> Tensor:
    """Multi-label hinge loss: for each sample, ``sum_{j, i} max(0, 1 - (x[y_j] - x[i])) / C``
    over its target classes ``y_j`` (the target row's entries before the first -1) and the
    classes ``i`` that are not targets.

    Raises:
        RuntimeError: a target of another shape than the input, or out of range.

    Example:
        >>> import mpitensor as mt
        >>> multilabel_margin_loss(mt.tensor([[0.1, 0.2, 0.4, 0.8]]),
        ...                        mt.tensor([[3, 0, -1, 1]]))
        tensor(0.8500)
    """
    fname = "multilabel_margin_loss"
    reduction = reduction_of(reduction, size_average, reduce, fname)
    x, t = as_tensor(input, "input", fname), as_tensor(target, "target", fname)
    xa, ta = arr(x), arr(t)
    _class_rows(fname, xa, ta)
    if tuple(ta.shape) != tuple(xa.shape):
        raise RuntimeError(f"{fname}(): the target must have the input's shape "
                           f"{shape_str(xa.shape)}, got {shape_str(ta.shape)}")
    c = xa.shape[-1]
    if ta.size and (int(ta.min()) < -1 or int(ta.max()) >= c):
        raise RuntimeError(f"{fname}(): target out of range: entries must lie in [-1, {c - 1}]")
    out_shape = (xa.shape[0],) if xa.ndim == 2 else ()
    return _MultiLabelMargin.apply(x, ta, reduction, out_shape)
