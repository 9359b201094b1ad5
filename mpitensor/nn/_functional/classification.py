"""The likelihood losses of ``torch.nn.functional``: ``nll_loss``, ``cross_entropy``,
``binary_cross_entropy`` (and ``_with_logits``), ``kl_div``, and ``mse_loss``, which shares
their reduction and row plumbing (the other losses are in :mod:`.losses`)."""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor._core import autocast as _autocast
from mpitensor._core import half as _half
from mpitensor.autograd import ArrayFunction as Function, _sum_to, grad_enabled_for
from mpitensor.tensor import Tensor

from .. import _kernels as K
from .checks import (
    _arr,
    _as_input,
    _check_float,
    _check_same_device,
    _check_same_dtype,
    _dtype_name,
    _shape_str,
)

__all__ = ["nll_loss", "cross_entropy", "mse_loss", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "kl_div"]


# --------------------------------------------------------------------------------------------
# losses


_REDUCTIONS = ("mean", "sum", "none")


def _reduction(reduction: str, size_average: Any, reduce: Any, fname: str) -> str:
    if size_average is not None or reduce is not None:
        warnings.warn(
            "size_average and reduce args will be deprecated, please use reduction='"
            f"{'sum' if size_average is False else 'mean'}' instead.", UserWarning, stacklevel=3,
        )
        sa = True if size_average is None else bool(size_average)
        rd = True if reduce is None else bool(reduce)
        reduction = "none" if not rd else ("mean" if sa else "sum")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{fname}(): {reduction} is not a valid value for reduction; use one of "
                         f"{_REDUCTIONS}")
    return reduction


def _to_rows(x: Any) -> Any:
    """(N, C, d1, ...) -> (N*d1*..., C) with the class axis last; (C,) -> (1, C)."""
    if x.ndim == 1:
        return x.reshape(1, -1)
    if x.ndim == 2:
        return x
    return K.xp_of(x).moveaxis(x, 1, -1).reshape(-1, x.shape[1])


def _from_rows(g: Any, shape: tuple) -> Any:
    """Inverse of :func:`_to_rows` for a gradient."""
    if len(shape) <= 2:
        return g.reshape(shape)
    xp = K.xp_of(g)
    moved = (shape[0], *shape[2:], shape[1])
    return xp.moveaxis(g.reshape(moved), -1, 1)


def _check_class_target(fname: str, x: Any, t: Any, weight: Any, ignore_index: int) -> None:
    if t.dtype.kind not in "iu":
        raise RuntimeError(
            f"{fname}(): expected target of an integer dtype (class indices), got "
            f"{_dtype_name(t.dtype)}; convert it with target.long()"
        )
    if x.ndim == 1:
        want = ()
    elif x.ndim == 2:
        want = (x.shape[0],)
    else:
        want = (x.shape[0], *x.shape[2:])
    if tuple(t.shape) != want:
        if x.ndim >= 2 and t.ndim >= 1 and t.shape[0] != x.shape[0]:
            raise ValueError(
                f"{fname}(): Expected input batch_size ({x.shape[0]}) to match target "
                f"batch_size ({t.shape[0]})."
            )
        raise RuntimeError(
            f"{fname}(): expected target of shape {_shape_str(want)} for input of shape "
            f"{_shape_str(x.shape)}, got {_shape_str(t.shape)}"
        )
    if x.ndim == 0:
        raise RuntimeError(f"{fname}(): input must have at least 1 dimension (the classes)")
    C = x.shape[0] if x.ndim == 1 else x.shape[1]
    if weight is not None and tuple(_arr(weight).shape) != (C,):
        raise RuntimeError(
            f"{fname}(): weight tensor should be defined either for all {C} classes or no "
            f"classes but got weight tensor of shape: {_shape_str(_arr(weight).shape)}"
        )
    if t.size and not _backend.is_meta_array(t) and (int(t.min()) < 0 or int(t.max()) >= C):
        tt = t[t != ignore_index]
        if tt.size:
            lo, hi = int(tt.min()), int(tt.max())
            if lo < 0 or hi >= C:
                bad = lo if lo < 0 else hi
                raise IndexError(
                    f"{fname}(): Target {bad} is out of bounds: class indices must lie in "
                    f"[0, {C - 1}] (or equal ignore_index={ignore_index})"
                )


def _class_coeffs(x: Any, t: Any, w: Any, ignore_index: int, reduction: str) -> tuple:
    """Per-row target weights for index targets: ``(rows_t, coef, denom, valid)``.

    ``coef[i]`` is the weight of row i's target class (0 where ignored); ``denom`` the
    mean-reduction divisor (sum of coef), or None; ``valid[i]`` whether row i counts.
    """
    xp = K.xp_of(x)
    tf = t.reshape(-1).astype(xp.int64, copy=False)
    valid = tf != ignore_index
    safe = xp.where(valid, tf, 0)
    if w is not None:
        coef = w.astype(x.dtype, copy=False)[safe] * valid
    else:
        coef = valid.astype(x.dtype)
    denom = coef.sum() if reduction == "mean" else None
    return safe, coef, denom, valid


def _mean_div(total: Any, denom: Any) -> Any:
    """``total / denom``; 0/0 (every target ignored) is nan without a warning, as in torch."""
    if isinstance(total, (np.ndarray, np.generic)):
        with np.errstate(invalid="ignore", divide="ignore"):
            return total / denom
    return total / denom


def _reduce_rows(xp: Any, losses: Any, reduction: str, denom: Any, shape: tuple,
                 dtype: Any) -> Any:
    """A class loss's per-row ``losses`` reduced: reshaped to ``shape`` for 'none', else
    summed (and divided by ``denom`` for 'mean')."""
    if reduction == "none":
        return losses.reshape(shape)
    total = losses.sum()
    if reduction == "mean":
        total = _mean_div(total, denom)
    return xp.asarray(total, dtype=dtype)


def _mean_row_scale(g: Any, denom: Any, valid: Any) -> Any:
    """Per-row factor of a mean-reduced class loss's gradient: ``g / denom`` where the row's
    target counts, 0 where it is ignored. As in torch, ignored rows get no gradient even when
    every target is ignored (the loss is then 0/0 = nan, but its gradient is 0)."""
    xp = K.xp_of(valid)
    return xp.where(valid, _mean_div(g, denom), xp.zeros((), dtype=g.dtype))


class _NLLLoss(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, t: Any, w: Any, ignore_index: int, reduction: str) -> Any:
        xp = K.xp_of(x)
        rows = _to_rows(x)
        safe, coef, denom, valid = _class_coeffs(x, t, w, ignore_index, reduction)
        picked = rows[xp.arange(rows.shape[0]), safe]
        losses = -picked * coef
        ctx.safe, ctx.coef, ctx.denom, ctx.reduction = safe, coef, denom, reduction
        ctx.valid = valid
        ctx.xshape, ctx.tshape = x.shape, t.shape
        return _reduce_rows(xp, losses, reduction, denom, t.shape, x.dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        xp = K.xp_of(g)
        coef = -ctx.coef
        if ctx.reduction == "none":
            coef = coef * g.reshape(-1)
        elif ctx.reduction == "mean":
            coef = coef * _mean_row_scale(g, ctx.denom, ctx.valid)
        else:
            coef = coef * g
        C = 1
        if len(ctx.xshape) >= 1:
            C = ctx.xshape[0] if len(ctx.xshape) == 1 else ctx.xshape[1]
        rows = xp.zeros((coef.shape[0], C), dtype=g.dtype)
        rows[xp.arange(rows.shape[0]), ctx.safe] = coef.astype(g.dtype)  # CuPy lacks put_along_axis
        return _from_rows(rows, ctx.xshape), None, None, None, None


@_autocast.op("nll_loss")
def nll_loss(input: Any, target: Any, weight: Any = None,  # noqa: A002 - torch's name
             size_average: Any = None, ignore_index: int = -100, reduce: Any = None,
             reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of class indices under log-probabilities ``input``.

    Args:
        input: (N, C), (C,) or (N, C, d1, ...) log-probabilities.
        target: integer class indices, (N,), () or (N, d1, ...).
        weight: optional per-class weights (C,).
        size_average, reduce: deprecated torch arguments (mapped onto ``reduction``).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``'mean'`` (weighted by the targets' class weights), ``'sum'`` or ``'none'``.

    Returns:
        The loss (a 0-d tensor, or per element for ``'none'``).

    Raises:
        RuntimeError: a non-integer target or mismatched shapes.
        IndexError: a target outside ``[0, C)`` that is not ``ignore_index``.

    Example:
        >>> import mpitensor as mt
        >>> nll_loss(mt.tensor([[-1.0, -2.0]]), mt.tensor([1]))
        tensor(2.)
    """
    reduction = _reduction(reduction, size_average, reduce, "nll_loss")
    _as_input(input, "input", "nll_loss")
    target = _as_input(target, "target", "nll_loss")
    _check_float(input, "input", "nll_loss")
    x, t = _arr(input), _arr(target)
    _check_class_target("nll_loss", x, t, weight, ignore_index)
    _check_same_device("nll_loss", input=input, target=target, weight=weight)
    w = _arr(weight) if weight is not None else None
    return _NLLLoss.apply(input, _arr(target), w, int(ignore_index), reduction)


@_half.computes_in_float32
class _CrossEntropy(Function):
    """Fused log_softmax + NLL (index or probability targets, label smoothing, weights)."""

    @staticmethod
    def forward(ctx: Any, x: Any, t: Any, w: Any, ignore_index: int, reduction: str,
                eps: float, prob: bool) -> Any:
        xp = K.xp_of(x)
        rows = _to_rows(x)
        R, C = rows.shape
        lsm = K.log_softmax(rows, 1)
        wv = w.astype(x.dtype, copy=False) if w is not None else None
        if prob:
            tp = _to_rows(t).astype(x.dtype, copy=False)
            if eps:
                tp = tp * (1 - eps) + eps / C
            a = tp * wv if wv is not None else tp  # coefficient of -lsm per (row, class)
            denom = R if reduction == "mean" else None
            valid = None
        else:
            safe, coef, denom, valid = _class_coeffs(x, t, w, ignore_index, reduction)
            a = xp.zeros((R, C), dtype=x.dtype)
            a[xp.arange(R), safe] = (1 - eps) * coef
            if eps:
                sm = (eps / C) * valid.astype(x.dtype)[:, None]
                a += sm * wv if wv is not None else sm
        losses = -(a * lsm).sum(axis=1)
        ctx.save_for_backward(lsm, a)
        ctx.denom, ctx.reduction, ctx.xshape, ctx.tshape = denom, reduction, x.shape, t.shape
        ctx.valid = valid
        shape = t.shape if not prob else ((x.shape[0], *x.shape[2:]) if x.ndim > 1 else ())
        return _reduce_rows(xp, losses, reduction, denom, shape, x.dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        lsm, a = ctx.saved_tensors
        xp = K.xp_of(lsm)
        if ctx.reduction == "none":
            scale = g.reshape(-1, 1)
        elif ctx.reduction == "mean":
            scale = (g / ctx.denom if ctx.valid is None  # probability targets: denom = rows
                     else _mean_row_scale(g, ctx.denom, ctx.valid)[:, None])
        else:
            scale = g
        # d/dx of -sum_c a_c * lsm_c  =  softmax * sum_c a_c - a
        grad = (xp.exp(lsm) * a.sum(axis=1, keepdims=True) - a) * scale
        return (_from_rows(grad.astype(lsm.dtype, copy=False), ctx.xshape),
                None, None, None, None, None, None)


@_autocast.op("cross_entropy")
def cross_entropy(input: Any, target: Any, weight: Any = None,  # noqa: A002 - torch's name
                  size_average: Any = None, ignore_index: int = -100, reduce: Any = None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Cross entropy between logits ``input`` and ``target`` (log_softmax + NLL, fused).

    Args:
        input: (N, C), (C,) or (N, C, d1, ...) unnormalised logits.
        target: class indices (integer, shaped like :func:`nll_loss`'s target) or class
            probabilities (float, shaped like ``input``).
        weight: optional per-class weights (C,).
        size_average, reduce: deprecated torch arguments (mapped onto ``reduction``).
        ignore_index: index target that contributes nothing (index targets only).
        reduction: ``'mean'``, ``'sum'`` or ``'none'``, with torch's normalisation.
        label_smoothing: in [0, 1]; mixes the target with the uniform distribution.

    Returns:
        The loss (a 0-d tensor, or per element for ``'none'``).

    Raises:
        RuntimeError: bad target dtype/shape; IndexError: target out of range;
        ValueError: label_smoothing outside [0, 1].

    Example:
        >>> import mpitensor as mt
        >>> round(float(cross_entropy(mt.tensor([[0.0, 0.0]]), mt.tensor([0]))), 4)
        0.6931
    """
    reduction = _reduction(reduction, size_average, reduce, "cross_entropy")
    _as_input(input, "input", "cross_entropy")
    target = _as_input(target, "target", "cross_entropy")
    _check_float(input, "input", "cross_entropy")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(
            f"cross_entropy(): label_smoothing must be between 0.0 and 1.0. Got: "
            f"{label_smoothing}"
        )
    x, t = _arr(input), _arr(target)
    if x.ndim == 0:
        raise RuntimeError("cross_entropy(): input must have at least 1 dimension (the classes)")
    _check_same_device("cross_entropy", input=input, target=target, weight=weight)
    prob = t.dtype.kind == "f"
    if prob:
        if tuple(t.shape) != tuple(x.shape):
            raise RuntimeError(
                f"cross_entropy(): class-probability targets must have the input's shape "
                f"{_shape_str(x.shape)}, got {_shape_str(t.shape)}"
            )
        C = x.shape[0] if x.ndim == 1 else x.shape[1]
        if weight is not None and tuple(_arr(weight).shape) != (C,):
            raise RuntimeError(
                f"cross_entropy(): weight should have shape [{C}], got "
                f"{_shape_str(_arr(weight).shape)}"
            )
    else:
        _check_class_target("cross_entropy", x, t, weight, ignore_index)
    w = _arr(weight) if weight is not None else None
    return _CrossEntropy.apply(input, t, w, int(ignore_index), reduction,
                               float(label_smoothing), prob)


@_half.computes_in_float32
class _MSELoss(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, y: Any, reduction: str) -> Any:
        xp = K.xp_of(x)
        diff = x - y
        ctx.save_for_backward(diff)
        ctx.reduction, ctx.xshape, ctx.yshape = reduction, x.shape, y.shape
        sq = diff * diff
        if reduction == "none":
            return sq
        total = sq.sum()
        if reduction == "mean":
            total = total / sq.size
        return xp.asarray(total, dtype=sq.dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (diff,) = ctx.saved_tensors
        scale = g * 2
        if ctx.reduction == "mean":
            scale = scale / diff.size
        gd = diff * scale
        need = ctx.needs_input_grad
        dx = _sum_to(gd, ctx.xshape) if need[0] else None
        dy = -_sum_to(gd, ctx.yshape) if need[1] else None
        return dx, dy, None


@_autocast.op("mse_loss")
def mse_loss(input: Any, target: Any, size_average: Any = None,  # noqa: A002 - torch's name
             reduce: Any = None, reduction: str = "mean") -> Tensor:
    """Mean squared error ``(input - target) ** 2``, reduced as asked.

    Args:
        input, target: tensors of the same shape (broadcast, with torch's warning, otherwise).
        size_average, reduce: deprecated torch arguments (mapped onto ``reduction``).
        reduction: ``'mean'``, ``'sum'`` or ``'none'``.

    Returns:
        The loss; gradients flow to both ``input`` and ``target``.

    Raises:
        RuntimeError: shapes that do not broadcast, non-float inputs, mixed devices.

    Example:
        >>> import mpitensor as mt
        >>> mse_loss(mt.tensor([1.0, 3.0]), mt.tensor([0.0, 0.0]))
        tensor(5.)
    """
    reduction = _reduction(reduction, size_average, reduce, "mse_loss")
    _as_input(input, "input", "mse_loss")
    _as_input(target, "target", "mse_loss")
    _check_float(input, "input", "mse_loss")
    _check_float(target, "target", "mse_loss")
    _check_same_device("mse_loss", input=input, target=target)
    x, y = _arr(input), _arr(target)
    if tuple(x.shape) != tuple(y.shape):
        try:
            np.broadcast_shapes(x.shape, y.shape)
        except ValueError:
            raise RuntimeError(
                f"mse_loss(): The size of tensor a ({_shape_str(x.shape)}) must match the size "
                f"of tensor b ({_shape_str(y.shape)})"
            ) from None
        warnings.warn(
            f"Using a target size ({_shape_str(y.shape)}) that is different to the input size "
            f"({_shape_str(x.shape)}). This will likely lead to incorrect results due to "
            f"broadcasting. Please ensure they have the same size.", UserWarning, stacklevel=2,
        )
    _check_same_dtype("mse_loss", input=input, target=target)
    return _MSELoss.apply(input, target, reduction)


def _quiet(xp: Any) -> Any:
    """Silence NumPy's floating point warnings (log(0), 0/0): torch computes these silently."""
    return np.errstate(all="ignore") if xp is np else contextlib.nullcontext()


def _reduce_loss(xp: Any, loss: Any, reduction: str, dtype: Any, batch: Optional[int] = None
                 ) -> Any:
    """Apply ``reduction`` ('none', 'sum', 'mean' or 'batchmean') to elementwise losses.

    ``batch`` is what 'batchmean' divides by (the input's first dimension; None for a 0-d
    input, which is not divided).
    """
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "mean":
        total = _mean_div(total, loss.size)
    elif reduction == "batchmean" and batch is not None:
        total = _mean_div(total, batch)
    return xp.asarray(total, dtype=dtype)


def _loss_grad(g: Any, reduction: str, shape: tuple, batch: Optional[int] = None,
               weight: Any = None) -> Any:
    """The output gradient of a reduced elementwise loss, per element (broadcastable), times
    the loss's elementwise ``weight`` where there is one."""
    if reduction == "mean":
        g = g / max(math.prod(shape), 1)  # an empty input's mean is nan; its gradient 0
    elif reduction == "batchmean" and batch is not None:
        g = g / max(batch, 1)
    return g if weight is None else g * weight


def _broadcasts_to(fname: str, name: str, v: Any, shape: tuple) -> None:
    vs = tuple(_arr(v).shape)
    try:
        ok = np.broadcast_shapes(vs, shape) == shape
    except ValueError:
        ok = False
    if not ok:
        raise RuntimeError(
            f"{fname}(): {name} of shape {_shape_str(vs)} does not broadcast to the input's "
            f"shape {_shape_str(shape)}"
        )


def _loss_pair(fname: str, input: Any, target: Any, same_shape: bool) -> tuple:  # noqa: A002
    """The operand checks of an elementwise loss, returning its ``(x, t)`` arrays.

    Both operands must be tensors and the input a float one; with ``same_shape`` the target
    must have the input's shape exactly (these losses do not broadcast it).
    """
    _as_input(input, "input", fname)
    _as_input(target, "target", fname)
    x, t = _arr(input), _arr(target)
    if same_shape and tuple(t.shape) != tuple(x.shape):
        raise ValueError(
            f"{fname}(): target shape {_shape_str(t.shape)} must equal the input shape "
            f"{_shape_str(x.shape)}; give them the same shape (no broadcasting here)"
        )
    _check_float(input, "input", fname)
    return x, t


def _float_result(x: Any, t: Any) -> Any:
    """The dtype a loss of ``x`` and ``t`` computes in: their promotion, or x's if not float."""
    dtype = np.result_type(x.dtype, t.dtype)
    return dtype if dtype.kind == "f" else x.dtype


def _no_grad_for(fname: str, **tensors: Any) -> None:
    for name, v in tensors.items():
        if isinstance(v, Tensor) and grad_enabled_for(v):
            raise RuntimeError(
                f"{fname}(): no gradient is defined with respect to '{name}' (as in torch), "
                f"but it requires grad; pass {name}.detach()"
            )


#: the floor of x(1 - x) in binary_cross_entropy's input gradient: torch's 1e-12, which it
#: applies rounded to float32 in every dtype (so float64 gradients at x = 0 or 1 agree too)
_BCE_GUARD = float(np.float32(1e-12))


class _BinaryCrossEntropy(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, t: Any, w: Any, reduction: str) -> Any:
        xp = K.xp_of(x)
        with _quiet(xp):
            log_x = xp.maximum(xp.log(x), -100)  # as torch: clamped, so x = 0 or 1 is finite
            log_1mx = xp.maximum(xp.log1p(-x), -100)
            loss = (t - 1) * log_1mx - t * log_x
        if w is not None:
            loss *= w
        ctx.save_for_backward(x, t, w)
        ctx.reduction = reduction
        return _reduce_loss(xp, loss, reduction, x.dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, t, w = ctx.saved_tensors
        xp = K.xp_of(x)
        gs = _loss_grad(g, ctx.reduction, x.shape, weight=w)
        need = ctx.needs_input_grad
        dx = dt = None
        with _quiet(xp):
            if need[0]:
                # x(1 - x) is kept above torch's guard, so x at 0 or 1 gives finite gradients
                dx = (x - t) / xp.maximum(x * (1 - x), x.dtype.type(_BCE_GUARD)) * gs
            if need[1]:
                dt = (xp.log1p(-x) - xp.log(x)) * gs
        return dx, dt, None, None


@_autocast.op("binary_cross_entropy")
def binary_cross_entropy(input: Any, target: Any, weight: Any = None,  # noqa: A002 - torch's name
                         size_average: Any = None, reduce: Any = None,
                         reduction: str = "mean") -> Tensor:
    """Binary cross entropy between probabilities ``input`` and ``target``.

    Elementwise ``-w * (t * log(x) + (1 - t) * log(1 - x))`` with both logarithms clamped to
    >= -100 (as torch), so probabilities of exactly 0 or 1 give finite losses and gradients.

    Args:
        input: probabilities in [0, 1], any shape.
        target: a tensor of the same shape and dtype, values in [0, 1].
        weight: optional rescaling, broadcastable to the input's shape (no gradient).
        size_average, reduce: deprecated torch arguments (mapped onto ``reduction``).
        reduction: ``'mean'``, ``'sum'`` or ``'none'``.

    Returns:
        The loss; gradients flow to ``input`` and ``target``.

    Raises:
        ValueError: a target shaped unlike the input, or an unknown reduction.
        RuntimeError: values outside [0, 1] (NaN included), mixed dtypes or devices, a weight
            that does not broadcast or that requires grad.

    Example:
        >>> import mpitensor as mt
        >>> round(float(binary_cross_entropy(mt.tensor([0.5]), mt.tensor([1.0]))), 4)
        0.6931
    """
    fname = "binary_cross_entropy"
    reduction = _reduction(reduction, size_average, reduce, fname)
    x, t = _loss_pair(fname, input, target, True)
    _check_same_dtype(fname, input=input, target=target)
    _check_same_device(fname, input=input, target=target, weight=weight)
    if weight is not None:
        _as_input(weight, "weight", fname)
        _broadcasts_to(fname, "weight", weight, tuple(x.shape))
        _no_grad_for(fname, weight=weight)
    for name, a in (("input", x), ("target", t)):
        if a.size and not _backend.is_meta_array(a) and not (  # meta: no values to check
                float(a.min()) >= 0.0 and float(a.max()) <= 1.0):  # NaN fails too
            raise RuntimeError(
                f"{fname}(): every element of {name} must lie in [0, 1]; found values from "
                f"{float(a.min())} to {float(a.max())} (apply sigmoid to logits, or use "
                f"binary_cross_entropy_with_logits)"
            )
    w = _arr(weight).astype(x.dtype, copy=False) if weight is not None else None
    return _BinaryCrossEntropy.apply(input, target, w, reduction)


class _BCEWithLogits(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, t: Any, w: Any, pw: Any, reduction: str, dtype: Any) -> Any:
        xp = K.xp_of(x)
        xd, td = x.astype(dtype, copy=False), t.astype(dtype, copy=False)
        # log(sigmoid(x)) without overflow: min(x, 0) - log(1 + exp(-|x|)), in the input's own
        # dtype before any promotion (as torch: a float32 input with a float64 target agrees)
        log_sig = (xp.minimum(x, 0) - xp.log1p(xp.exp(-xp.abs(x)))).astype(dtype, copy=False)
        if pw is None:
            loss = (1 - td) * xd - log_sig
        else:
            loss = (1 - td) * xd - (1 + (pw - 1) * td) * log_sig
        if w is not None:
            loss = loss * w
        ctx.save_for_backward(xd, td, w, pw, log_sig)
        ctx.reduction, ctx.shapes = reduction, (x.shape, t.shape, x.dtype, t.dtype)
        return _reduce_loss(xp, loss, reduction, dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, t, w, pw, log_sig = ctx.saved_tensors
        xp = K.xp_of(x)
        xshape, tshape, xdt, tdt = ctx.shapes
        gs = _loss_grad(g, ctx.reduction, x.shape, weight=w)
        need = ctx.needs_input_grad
        dx = dt = None
        if need[0]:
            sig = xp.exp(log_sig)
            # d/dx = (1 + (pw - 1) t) sigmoid(x) - pw t, i.e. sigmoid(x) - t without pw
            dx = (sig - t) if pw is None else ((1 + (pw - 1) * t) * sig - pw * t)
            dx = _sum_to(dx * gs, xshape).astype(xdt, copy=False)
        if need[1]:
            dt = -x if pw is None else (-x - (pw - 1) * log_sig)
            dt = _sum_to(dt * gs, tshape).astype(tdt, copy=False)
        return dx, dt, None, None, None, None


@_autocast.op("binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(input: Any, target: Any,  # noqa: A002 - torch's name
                                     weight: Any = None, size_average: Any = None,
                                     reduce: Any = None, reduction: str = "mean",
                                     pos_weight: Any = None) -> Tensor:
    """Binary cross entropy of ``sigmoid(input)`` against ``target``, computed from the logits.

    Elementwise ``w * ((1 - t) * x - (1 + (pos_weight - 1) * t) * log(sigmoid(x)))``, with
    ``log(sigmoid(x))`` taken as ``min(x, 0) - log1p(exp(-|x|))``: no overflow for any
    logit, and more accurate than ``sigmoid`` followed by :func:`binary_cross_entropy`.

    Args:
        input: logits, any shape.
        target: a tensor of the input's shape (values usually in [0, 1]).
        weight: optional rescaling, broadcastable to the input's shape (no gradient).
        size_average, reduce: deprecated torch arguments (mapped onto ``reduction``).
        reduction: ``'mean'``, ``'sum'`` or ``'none'``.
        pos_weight: optional weight of the positive term, broadcast along the last
            dimension (one per class), no gradient.

    Returns:
        The loss (dtype promoted from input and target); gradients flow to both.

    Raises:
        ValueError: a target shaped unlike the input, or an unknown reduction.
        RuntimeError: a weight or pos_weight that does not broadcast or that requires grad,
            mixed devices, a non-float input.

    Example:
        >>> import mpitensor as mt
        >>> loss = binary_cross_entropy_with_logits(mt.tensor([0.0, 0.0]), mt.tensor([1.0, 0.0]),
        ...                                         pos_weight=mt.tensor([2.0]))
        >>> round(float(loss), 4)  # (2 log 2 + log 2) / 2
        1.0397
    """
    fname = "binary_cross_entropy_with_logits"
    reduction = _reduction(reduction, size_average, reduce, fname)
    x, t = _loss_pair(fname, input, target, True)
    _check_same_device(fname, input=input, target=target, weight=weight, pos_weight=pos_weight)
    dtype = _float_result(x, t)
    extras = []
    for name, v in (("weight", weight), ("pos_weight", pos_weight)):
        if v is not None:
            _as_input(v, name, fname)
            _broadcasts_to(fname, name, v, tuple(x.shape))
            _no_grad_for(fname, **{name: v})
            extras.append(_arr(v).astype(dtype, copy=False))
        else:
            extras.append(None)
    return _BCEWithLogits.apply(input, target, extras[0], extras[1], reduction, dtype)


class _KLDiv(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, t: Any, reduction: str, log_target: bool, dtype: Any) -> Any:
        xp = K.xp_of(x)
        xd, td = x.astype(dtype, copy=False), t.astype(dtype, copy=False)
        with _quiet(xp):
            if log_target:
                et = xp.exp(td)
                loss = et * (td - xd)
            else:
                et = None
                # t * log(t) taken as 0 where t == 0 (the limit), as torch's xlogy does
                loss = xp.where(td == 0, dtype.type(0), td * xp.log(td)) - td * xd
        ctx.save_for_backward(xd, td, et)
        ctx.reduction, ctx.log_target = reduction, log_target
        ctx.shapes = (x.shape, t.shape, x.dtype, t.dtype, loss.shape)
        batch = x.shape[0] if x.ndim else None  # torch: 'batchmean' is over input's dim 0
        ctx.batch = batch
        return _reduce_loss(xp, loss, reduction, dtype, batch)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, t, et = ctx.saved_tensors
        xp = K.xp_of(x)
        xshape, tshape, xdt, tdt, lshape = ctx.shapes
        gs = _loss_grad(g, ctx.reduction, lshape, ctx.batch)
        need = ctx.needs_input_grad
        dx = dt = None
        with _quiet(xp):
            if need[0]:
                dx = _sum_to(xp.broadcast_to(-(et if ctx.log_target else t) * gs, lshape),
                              xshape).astype(xdt, copy=False)
            if need[1]:
                if ctx.log_target:
                    d = et * (t - x + 1)
                else:
                    # d/dt of t log t - t x; like torch, 0/0 = nan where t == 0
                    d = xp.where(t == 0, t.dtype.type(0), xp.log(t)) + t / t - x
                dt = _sum_to(xp.broadcast_to(d * gs, lshape), tshape).astype(tdt, copy=False)
        return dx, dt, None, None, None


@_autocast.op("kl_div")
def kl_div(input: Any, target: Any, size_average: Any = None,  # noqa: A002 - torch's name
           reduce: Any = None, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """Kullback-Leibler divergence of ``target`` from ``input`` (given as log-probabilities).

    Elementwise ``t * (log t - x)`` (``exp(t) * (t - x)`` with ``log_target=True``, where
    ``t`` holds log-probabilities too), 0 where ``t == 0``. Input and target broadcast.

    Args:
        input: log-probabilities.
        target: probabilities (log-probabilities with ``log_target=True``).
        size_average, reduce: deprecated torch arguments (mapped onto ``reduction``).
        reduction: ``'mean'`` (over every element; warns, as torch does), ``'batchmean'``
            (the sum divided by the batch size: the mathematical KL divergence), ``'sum'`` or
            ``'none'``.
        log_target: whether ``target`` is given in log space.

    Returns:
        The loss; gradients flow to ``input`` and ``target``.

    Raises:
        ValueError: an unknown reduction.
        RuntimeError: shapes that do not broadcast, mixed devices, a non-float input.

    Example:
        >>> import mpitensor as mt
        >>> kl_div(mt.tensor([[0.0, 0.0]]).log_softmax(1), mt.tensor([[0.5, 0.5]]),
        ...        reduction="batchmean")
        tensor(0.)
    """
    fname = "kl_div"
    if reduction != "batchmean" or size_average is not None or reduce is not None:
        reduction = _reduction(reduction, size_average, reduce, fname)
    x, t = _loss_pair(fname, input, target, False)
    try:
        np.broadcast_shapes(tuple(x.shape), tuple(t.shape))
    except ValueError:
        raise RuntimeError(
            f"{fname}(): input of shape {_shape_str(x.shape)} and target of shape "
            f"{_shape_str(t.shape)} do not broadcast together"
        ) from None
    _check_same_device(fname, input=input, target=target)
    if reduction == "mean":
        warnings.warn(
            "kl_div(): reduction='mean' averages over every element, batch and classes "
            "alike; the KL divergence is the sum over classes averaged over the batch, which "
            "is reduction='batchmean' (torch plans to make 'mean' mean that)",
            UserWarning, stacklevel=2,
        )
    dtype = _float_result(x, t)
    return _KLDiv.apply(input, target, reduction, bool(log_target), np.dtype(dtype))
