"""``torch.nn.functional.bilinear``: ``y_o = x1 A_o x2 + b_o`` for every output feature o.

One autograd Function; forward and backward are matrix products over the flattened leading
dimensions (no loop over samples or features).

Re-exported by :mod:`mpitensor.nn.functional`; import it from there.

Example:
    >>> import mpitensor as mt
    >>> bilinear(mt.ones(1, 2), mt.ones(1, 3), mt.ones(4, 2, 3)).shape
    mpitensor.Size([1, 4])
"""

from __future__ import annotations

from typing import Any

from mpitensor._core import half as _half
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

from .checks import as_tensor, check_float, dtype_name, shape_str

__all__ = ["bilinear"]


@_half.computes_in_float32
class _Bilinear(Function):
    @staticmethod
    def forward(ctx: Any, x1: Any, x2: Any, w: Any, b: Any) -> Any:
        lead = x1.shape[:-1]
        a = x1.reshape(-1, w.shape[1])  # (n, i)
        c = x2.reshape(-1, w.shape[2])  # (n, j)
        o = w.shape[0]
        # t[n, o, j] = sum_i a[n, i] w[o, i, j]
        t = (a @ w.transpose(1, 0, 2).reshape(w.shape[1], -1)).reshape(-1, o, w.shape[2])
        out = (t * c[:, None, :]).sum(axis=2)
        if b is not None:
            out = out + b
        ctx.save_for_backward(a, c, w, t)
        ctx.lead = lead
        return out.reshape(*lead, o)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        a, c, w, t = ctx.saved_tensors
        need = ctx.needs_input_grad
        o, i, j = w.shape
        g2 = g.reshape(-1, o)
        lead = ctx.lead
        d1 = d2 = dw = db = None
        if need[0]:
            # d1[n, i] = sum_{o, j} g[n, o] w[o, i, j] c[n, j]
            u = (g2[:, :, None] * c[:, None, :]).reshape(-1, o * j)  # (n, o*j)
            d1 = (u @ w.transpose(0, 2, 1).reshape(o * j, i)).reshape(*lead, i)
        if need[1]:
            d2 = (g2[:, :, None] * t).sum(axis=1).reshape(*lead, j)
        if need[2]:
            # dw[o, i, j] = sum_n g[n, o] a[n, i] c[n, j]
            ac = (a[:, :, None] * c[:, None, :]).reshape(-1, i * j)
            dw = (g2.T @ ac).reshape(o, i, j)
        if len(need) > 3 and need[3]:
            db = g2.sum(axis=0)
        return d1, d2, dw, db


def bilinear(input1: Any, input2: Any, weight: Any, bias: Any = None) -> Tensor:
    """Apply ``y[..., o] = sum_ij input1[..., i] weight[o, i, j] input2[..., j] + bias[o]``.

    Args:
        input1: (*, in1_features).
        input2: (*, in2_features), the same leading dimensions.
        weight: (out_features, in1_features, in2_features).
        bias: (out_features,) or None.

    Returns:
        A tensor of shape (*, out_features).

    Raises:
        RuntimeError: mismatched ranks, leading dimensions, feature sizes or dtypes.

    Example:
        >>> import mpitensor as mt
        >>> bilinear(mt.ones(2), mt.ones(3), mt.ones(1, 2, 3))
        tensor([6.])
    """
    fname = "bilinear"
    x1, x2 = as_tensor(input1, "input1", fname), as_tensor(input2, "input2", fname)
    w = as_tensor(weight, "weight", fname)
    b = None if bias is None else as_tensor(bias, "bias", fname)
    check_float(x1, "input1", fname)
    if x1.ndim != x2.ndim:
        raise RuntimeError(f"{fname}(): input1 and input2 must have the same number of "
                           f"dimensions, got {x1.ndim} and {x2.ndim}")
    if x1.ndim == 0 or tuple(x1.shape[:-1]) != tuple(x2.shape[:-1]):
        raise RuntimeError(f"{fname}(): input1 {shape_str(x1.shape)} and input2 "
                           f"{shape_str(x2.shape)} must share their leading dimensions")
    if w.ndim != 3 or w.shape[1] != x1.shape[-1] or w.shape[2] != x2.shape[-1]:
        raise RuntimeError(f"{fname}(): weight of shape {shape_str(w.shape)} does not fit "
                           f"in1_features={x1.shape[-1]} and in2_features={x2.shape[-1]}")
    if b is not None and tuple(b.shape) != (w.shape[0],):
        raise RuntimeError(f"{fname}(): bias must have shape [{w.shape[0]}], got "
                           f"{shape_str(b.shape)}")
    dts = {x._data.dtype for x in (x1, x2, w) + ((b,) if b is not None else ())}
    if len(dts) > 1:
        raise RuntimeError(f"{fname}(): expected one dtype, got "
                           f"{', '.join(sorted(dtype_name(d) for d in dts))}")
    return _Bilinear.apply(x1, x2, w, b)
