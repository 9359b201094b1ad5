"""2-D pooling of ``torch.nn.functional``: ``max_pool2d`` (and ``max_pool2d_with_indices``),
``avg_pool2d``, ``adaptive_avg_pool1d`` and ``adaptive_avg_pool2d``, the pooling of the classic
convolutional nets (the other dimensions are in :mod:`.pooling1d` and :mod:`.poolingnd`)."""

from __future__ import annotations

import numbers
from typing import Any, Optional

import numpy as np

from mpitensor._core import half as _half
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor, _new

from .. import _kernels as K
from .._kernels import norm as NK
from .checks import _arr, _as_input, _check_float, _IntOrPair, _pair, _reshape, _shape_str

__all__ = ["max_pool2d", "max_pool2d_with_indices", "avg_pool2d", "adaptive_avg_pool2d",
           "adaptive_avg_pool1d"]


# --------------------------------------------------------------------------------------------
# pooling


class _MaxPool2x2(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, oh: int, ow: int, holder: Optional[list]) -> Any:
        out, code = K.maxpool2x2_forward(x, oh, ow)
        ctx.save_for_backward(code)
        ctx.xshape = x.shape
        if holder is not None:
            holder.append(code)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (code,) = ctx.saved_tensors
        return K.maxpool2x2_backward(g, code, ctx.xshape).transpose(3, 0, 1, 2), None, None, None


class _MaxPoolGeneric(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, k: tuple, s: tuple, p: tuple, d: tuple, out_hw: tuple,
                holder: Optional[list]) -> Any:
        out, idx, hpwp = K.maxpool_generic_forward(x, k, s, p, d, out_hw)
        ctx.save_for_backward(idx)
        ctx.xshape, ctx.p, ctx.hpwp = x.shape, p, hpwp
        if holder is not None:
            holder.append((idx, hpwp))
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (idx,) = ctx.saved_tensors
        gin = K.scatter_to_input(g.transpose(1, 0, 2, 3), idx, ctx.xshape, ctx.p, ctx.hpwp)
        return (gin.transpose(1, 0, 2, 3),) + (None,) * 6


def _pool_args(fname: str, input: Any, kernel_size: Any, stride: Any, padding: Any,  # noqa: A002
               dilation: Any) -> tuple:
    _as_input(input, "input", fname)
    x = _arr(input)
    if x.ndim not in (3, 4):
        raise RuntimeError(
            f"{fname}(): Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size "
            f"for input, but got: {_shape_str(x.shape)}"
        )
    k = _pair(kernel_size, "kernel_size", fname, 1)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) \
        else _pair(stride, "stride", fname, 1)
    p = _pair(padding, "padding", fname, 0)
    d = _pair(dilation, "dilation", fname, 1)
    for i in range(2):
        if p[i] > (d[i] * (k[i] - 1) + 1) // 2:
            raise RuntimeError(
                f"{fname}(): pad should be at most half of effective kernel size, but got "
                f"pad={p[i]}, kernel_size={k[i]} and dilation={d[i]}"
            )
    return x, k, s, p, d


def max_pool2d(
    input: Any,  # noqa: A002 - torch's name
    kernel_size: _IntOrPair,
    stride: Optional[_IntOrPair] = None,
    padding: _IntOrPair = 0,
    dilation: _IntOrPair = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """2-D max pooling, as ``torch.nn.functional.max_pool2d``.

    The gradient of a window goes to its first maximum (row-major order) on ties, as in torch.
    2x2/stride-2 pooling (any input size) takes a reshape-view fast path; every other geometry
    a strided-window path. No Python loop runs over the batch or the window.

    Args:
        input: (N, C, H, W) or (C, H, W).
        kernel_size: int or (kH, kW).
        stride: int or pair; default ``kernel_size``.
        padding: implicit -inf padding on both sides (at most half the kernel).
        dilation: spacing of window elements.
        ceil_mode: use ceil instead of floor for the output size.
        return_indices: also return the argmax indices (flat ``h * W + w`` per plane, int64).

    Returns:
        The pooled tensor (C-contiguous NCHW), and the indices when asked.

    Raises:
        RuntimeError: wrong input rank, padding larger than half the kernel, an empty output.

    Example:
        >>> import mpitensor as mt
        >>> max_pool2d(mt.arange(16.0).reshape(1, 1, 4, 4), 2)
        tensor([[[[ 5.,  7.],
                  [13., 15.]]]])
    """
    x, k, s, p, d = _pool_args("max_pool2d", input, kernel_size, stride, padding, dilation)
    unbatched = x.ndim == 3
    xshape = (1, *x.shape) if unbatched else tuple(x.shape)
    H, W = xshape[2], xshape[3]
    oh = K.pool_out_size(H, k[0], s[0], p[0], d[0], bool(ceil_mode))
    ow = K.pool_out_size(W, k[1], s[1], p[1], d[1], bool(ceil_mode))
    if oh < 1 or ow < 1:
        raise RuntimeError(
            f"max_pool2d(): Given input size: ({xshape[1]}x{H}x{W}). Calculated output size: "
            f"({xshape[1]}x{oh}x{ow}). Output size is too small"
        )
    xin = _reshape(input, xshape) if unbatched else input
    holder: Optional[list] = [] if return_indices else None
    fast = k == (2, 2) and s == (2, 2) and p == (0, 0) and d == (1, 1) \
        and 2 * oh <= H and 2 * ow <= W
    if fast:
        out = _MaxPool2x2.apply(xin, oh, ow, holder)
    else:
        out = _MaxPoolGeneric.apply(xin, k, s, p, d, (oh, ow), holder)
    if unbatched:
        out = _reshape(out, tuple(out.shape[1:]))
    if not return_indices:
        return out
    xp = K.xp_of(x)
    if fast:
        code = holder[0].astype(xp.int64)  # (C, oh, ow, N)
        hh = (xp.arange(oh, dtype=xp.int64) * 2).reshape(1, oh, 1, 1) + code // 2
        ww = (xp.arange(ow, dtype=xp.int64) * 2).reshape(1, 1, ow, 1) + code % 2
        ind = (hh * W + ww).transpose(3, 0, 1, 2)
    else:
        idx, hpwp = holder[0]
        ind = K.indices_from_flat(idx, hpwp, p, W)
    ind = xp.ascontiguousarray(ind)
    if unbatched:
        ind = ind[0]
    return out, _new(ind)


def max_pool2d_with_indices(input: Any, kernel_size: _IntOrPair,  # noqa: A002 - torch's name
                            stride: Optional[_IntOrPair] = None, padding: _IntOrPair = 0,
                            dilation: _IntOrPair = 1, ceil_mode: bool = False,
                            return_indices: bool = False) -> tuple:
    """:func:`max_pool2d` that returns ``(output, indices)``."""
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


class _AvgPool2d(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, k: tuple, s: tuple, p: tuple, out_hw: tuple,
                count_include_pad: bool, divisor_override: Optional[int]) -> Any:
        xp = K.xp_of(x)
        d = (1, 1)
        win, hpwp = K.pool_windows(x, k, s, p, d, out_hw, 0)
        total = win.sum(axis=-1)
        N, C, H, W = x.shape
        if divisor_override:
            div = xp.asarray(float(divisor_override), dtype=x.dtype)
        else:
            # torch: windows are clipped to the padded input; without count_include_pad, to
            # the input itself.
            oh, ow = out_hw
            hs = np.arange(oh) * s[0] - p[0]
            ws = np.arange(ow) * s[1] - p[1]
            if count_include_pad:
                he = np.minimum(hs + k[0], H + p[0])
                we = np.minimum(ws + k[1], W + p[1])
                cnt = np.outer(he - hs, we - ws)
            else:
                he = np.minimum(hs + k[0], H)
                we = np.minimum(ws + k[1], W)
                cnt = np.outer(he - np.maximum(hs, 0), we - np.maximum(ws, 0))
            div = xp.asarray(cnt.astype(x.dtype))
        ctx.div, ctx.k, ctx.s, ctx.p, ctx.hpwp, ctx.xshape = div, k, s, p, hpwp, x.shape
        return xp.ascontiguousarray((total / div).astype(x.dtype, copy=False)
                                    .transpose(1, 0, 2, 3))

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        xp = K.xp_of(g)
        gc = g.transpose(1, 0, 2, 3) / ctx.div  # (C, N, OH, OW)
        kk = ctx.k[0] * ctx.k[1]
        C, N, oh, ow = gc.shape
        taps = xp.arange(kk, dtype=xp.int64).reshape(1, 1, 1, 1, kk)
        base = K.window_flat_index((C, N, oh, ow), ctx.k, ctx.s, (1, 1), ctx.hpwp,
                                   xp.zeros((1, 1, 1, 1), dtype=xp.int64), xp)
        wp = ctx.hpwp[1]
        offs = (taps // ctx.k[1]) * wp + taps % ctx.k[1]
        idx = base[..., None] + offs
        vals = xp.broadcast_to(gc[..., None], idx.shape)
        gin = K.scatter_to_input(vals.astype(g.dtype), idx, ctx.xshape, ctx.p, ctx.hpwp)
        return (gin.transpose(1, 0, 2, 3),) + (None,) * 6


def avg_pool2d(
    input: Any,  # noqa: A002 - torch's name
    kernel_size: _IntOrPair,
    stride: Optional[_IntOrPair] = None,
    padding: _IntOrPair = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Optional[int] = None,
) -> Tensor:
    """2-D average pooling, as ``torch.nn.functional.avg_pool2d``.

    Args:
        input: (N, C, H, W) or (C, H, W).
        kernel_size, stride, padding, ceil_mode: as in :func:`max_pool2d` (zero padding).
        count_include_pad: count padded zeros in the divisor.
        divisor_override: use this divisor instead of the window size.

    Returns:
        The pooled tensor (C-contiguous NCHW).

    Raises:
        RuntimeError: wrong input rank, padding larger than half the kernel, empty output.

    Example:
        >>> import mpitensor as mt
        >>> avg_pool2d(mt.arange(16.0).reshape(1, 1, 4, 4), 2)
        tensor([[[[ 2.5000,  4.5000],
                  [10.5000, 12.5000]]]])
    """
    x, k, s, p, d = _pool_args("avg_pool2d", input, kernel_size, stride, padding, 1)
    _check_float(input, "input", "avg_pool2d")
    if divisor_override is not None and (isinstance(divisor_override, bool) or
                                         int(divisor_override) <= 0):
        raise ValueError(f"avg_pool2d(): divisor must be not zero, got {divisor_override!r}")
    unbatched = x.ndim == 3
    xshape = (1, *x.shape) if unbatched else tuple(x.shape)
    H, W = xshape[2], xshape[3]
    oh = K.pool_out_size(H, k[0], s[0], p[0], 1, bool(ceil_mode))
    ow = K.pool_out_size(W, k[1], s[1], p[1], 1, bool(ceil_mode))
    if oh < 1 or ow < 1:
        raise RuntimeError(
            f"avg_pool2d(): Given input size: ({xshape[1]}x{H}x{W}). Calculated output size: "
            f"({xshape[1]}x{oh}x{ow}). Output size is too small"
        )
    xin = _reshape(input, xshape) if unbatched else input
    out = _AvgPool2d.apply(xin, k, s, p, (oh, ow), bool(count_include_pad), divisor_override)
    return _reshape(out, tuple(out.shape[1:])) if unbatched else out


# --------------------------------------------------------------------------------------------
# adaptive average pooling


@_half.computes_in_float32  # half inputs: float32 averages, one rounding, as torch
class _AdaptiveAvgPool2d(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, oh: int, ow: int) -> Any:
        ctx.xshape = x.shape
        ctx.batch_innermost = NK._batch_innermost(x)
        return NK.adaptive_avg_pool2d_forward(x, oh, ow)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return NK.adaptive_avg_pool2d_backward(g, ctx.xshape, ctx.batch_innermost), None, None


def _adaptive_size(output_size: Any, dims: int, fname: str) -> tuple:
    """``output_size`` as a tuple of ``dims`` entries, each a non-negative int or None."""
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * dims
    if len(sizes) != dims:
        raise ValueError(
            f"{fname}(): output_size must be an int, None or a tuple of {dims}, got "
            f"{output_size!r}"
        )
    for s in sizes:
        if s is None:
            continue
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(
                f"{fname}(): output_size entries must be ints or None, got {output_size!r}"
            )
        if s < 0:
            raise ValueError(
                f"{fname}(): output_size entries must be >= 0, got {output_size!r}"
            )
    return tuple(None if s is None else int(s) for s in sizes)


def adaptive_avg_pool2d(input: Any, output_size: Any) -> Tensor:  # noqa: A002 - torch's name
    """2-D adaptive average pooling: average ``input`` over a grid of ``output_size`` bins.

    Output cell ``i`` along a dimension of size ``n`` pooled to ``m`` averages positions
    ``floor(i * n / m)`` to ``ceil((i + 1) * n / m) - 1``, as torch does: bins overlap when
    ``m`` does not divide ``n``.

    Args:
        input: (N, C, H, W) or (C, H, W).
        output_size: an int (square output), or a pair whose entries are ints or None
            (None keeps the input's size along that dimension).

    Returns:
        The pooled tensor, C-contiguous (N, C, oh, ow) (or (C, oh, ow)).

    Raises:
        RuntimeError: an input that is not 3-D or 4-D, or has an empty non-batch dimension.
        ValueError: a negative output size or a tuple of the wrong length.
        TypeError: an output size that is neither an int nor None.

    Example:
        >>> import mpitensor as mt
        >>> adaptive_avg_pool2d(mt.arange(16.0).reshape(1, 1, 4, 4), 1)
        tensor([[[[7.5000]]]])
    """
    _as_input(input, "input", "adaptive_avg_pool2d")
    x = _arr(input)
    sizes = _adaptive_size(output_size, 2, "adaptive_avg_pool2d")
    if x.ndim not in (3, 4):
        raise RuntimeError(
            f"adaptive_avg_pool2d(): expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got "
            f"shape {_shape_str(x.shape)}"
        )
    _check_float(input, "input", "adaptive_avg_pool2d")
    for d in range(x.ndim - 3, x.ndim):
        if x.shape[d] == 0:
            raise RuntimeError(
                f"adaptive_avg_pool2d(): input of shape {_shape_str(x.shape)} has an empty "
                f"dimension {d}; only the batch dimension may be empty"
            )
    H, W = x.shape[-2], x.shape[-1]
    oh = H if sizes[0] is None else sizes[0]
    ow = W if sizes[1] is None else sizes[1]
    unbatched = x.ndim == 3
    xin = _reshape(input, (1, *x.shape)) if unbatched else input
    out = _AdaptiveAvgPool2d.apply(xin, oh, ow)
    return _reshape(out, tuple(out.shape[1:])) if unbatched else out


def adaptive_avg_pool1d(input: Any, output_size: Any) -> Tensor:  # noqa: A002 - torch's name
    """1-D adaptive average pooling over the last dimension (bins as :func:`adaptive_avg_pool2d`).

    Args:
        input: (N, C, L) or (C, L).
        output_size: an int (or a 1-tuple holding one).

    Returns:
        The pooled tensor (N, C, output_size) (or (C, output_size)).

    Raises:
        RuntimeError: an input that is not 2-D or 3-D, or has an empty non-batch dimension.
        ValueError, TypeError: a bad output size.

    Example:
        >>> import mpitensor as mt
        >>> adaptive_avg_pool1d(mt.tensor([[[1.0, 2.0, 3.0, 4.0]]]), 2)
        tensor([[[1.5000, 3.5000]]])
    """
    _as_input(input, "input", "adaptive_avg_pool1d")
    x = _arr(input)
    (size,) = _adaptive_size(output_size, 1, "adaptive_avg_pool1d")
    if size is None:
        raise TypeError("adaptive_avg_pool1d(): output_size must be an int, got None")
    if x.ndim not in (2, 3):
        raise RuntimeError(
            f"adaptive_avg_pool1d(): expected a 2-D (C, L) or 3-D (N, C, L) input, got "
            f"shape {_shape_str(x.shape)}"
        )
    t = _reshape(input, (*x.shape[:-1], 1, x.shape[-1]))  # a height of 1: the 2-D pool
    out = adaptive_avg_pool2d(t, (1, size))
    return _reshape(out, (*x.shape[:-1], size))
