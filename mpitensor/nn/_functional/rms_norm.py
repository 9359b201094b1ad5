"""``torch.nn.functional.rms_norm``: root-mean-square normalisation over trailing dimensions.

One autograd Function, forward and backward side by side; half tensors are computed in
float32 and rounded once, as torch does.

Re-exported by :mod:`mpitensor.nn.functional`; import it from there.

Example:
    >>> import mpitensor as mt
    >>> rms_norm(mt.tensor([[3.0, 4.0]]), (2,), eps=0.0)
    tensor([[0.8485, 1.1314]])
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core import half as _half
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

from .checks import as_tensor, check_float, is_int, shape_str, sum_to, xp_of

__all__ = ["rms_norm"]


@_half.computes_in_float32
class _RMSNorm(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, k: int, eps: float) -> Any:
        xp = xp_of(x)
        axes = tuple(range(x.ndim - k, x.ndim))
        inv = 1.0 / xp.sqrt((x * x).mean(axis=axes, keepdims=True) + x.dtype.type(eps))
        y = x * inv
        ctx.save_for_backward(x, w, inv)
        ctx.axes = axes
        return y * w if w is not None else y

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, w, inv = ctx.saved_tensors
        axes = ctx.axes
        need = ctx.needs_input_grad
        y = x * inv
        gw = sum_to(g * y, w.shape) if w is not None and need[1] else None
        gy = g * w if w is not None else g
        n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
        # d/dx of x * (mean(x^2) + eps)^-1/2
        gx = inv * (gy - y * (gy * y).sum(axis=axes, keepdims=True) / n) if need[0] else None
        return gx, gw, None, None


def rms_norm(input: Any, normalized_shape: Any, weight: Any = None,  # noqa: A002
             eps: Optional[float] = None) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight``, the mean over the trailing ``normalized_shape``.

    Args:
        input: a floating point tensor whose trailing shape is ``normalized_shape``.
        normalized_shape: an int or a sequence of ints.
        weight: an optional scale of shape ``normalized_shape``.
        eps: added under the root (default: the dtype's machine epsilon, as in torch).

    Raises:
        RuntimeError: a trailing shape other than ``normalized_shape``, a weight of another
            shape.

    Example:
        >>> import mpitensor as mt
        >>> rms_norm(mt.ones(2, 3), 3)
        tensor([[1., 1., 1.],
                [1., 1., 1.]])
    """
    fname = "rms_norm"
    t = as_tensor(input, "input", fname)
    check_float(t, "input", fname)
    shape = (normalized_shape,) if is_int(normalized_shape) else tuple(normalized_shape)
    if not all(is_int(s) for s in shape):
        raise TypeError(f"{fname}(): normalized_shape must be an int or ints, got "
                        f"{normalized_shape!r}")
    k = len(shape)
    if k > t.ndim or tuple(t.shape[t.ndim - k:]) != shape:
        raise RuntimeError(f"{fname}(): normalized_shape {list(shape)} does not match the "
                           f"trailing dimensions of an input of shape {shape_str(t.shape)}")
    w = None
    if weight is not None:
        w = as_tensor(weight, "weight", fname)
        if tuple(w.shape) != shape:
            raise RuntimeError(f"{fname}(): weight must have shape {list(shape)}, got "
                               f"{shape_str(w.shape)}")
    if eps is None:
        eps = float(_dt.finfo(t.dtype).eps)
    return _RMSNorm.apply(t, w, k, float(eps))
