"""1-D pooling of ``torch.nn.functional``: ``max_pool1d`` (and ``max_pool1d_with_indices``),
``avg_pool1d``, ``adaptive_max_pool1d``, ``lp_pool1d``, ``max_unpool1d``, and the
cross-channel ``local_response_norm`` (a sliding mean over channels).

Every window of every (sample, channel) row is read at once through one (L_out, k) index map
into the padded row, so forward is a gather and a reduction and backward one scatter-add:
vectorised, no loop over the batch, the channels or the windows. Sizes, padding limits,
``ceil_mode``, ``count_include_pad``, tie-breaking (the first maximum) and NaN propagation
follow torch.

Re-exported by :mod:`mpitensor.nn.functional`; import them from there.

Example:
    >>> import mpitensor as mt
    >>> max_pool1d(mt.tensor([[[1.0, 3.0, 2.0, 0.0]]]), 2)
    tensor([[[3., 2.]]])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor, _new

from .checks import (
    as_tensor,
    check_float,
    is_int,
    scatter_add_axis,
    scatter_add_flat,
    shape_str,
    xp_of,
)

__all__ = ["max_pool1d", "max_pool1d_with_indices", "avg_pool1d", "adaptive_max_pool1d",
           "adaptive_max_pool1d_with_indices", "lp_pool1d", "max_unpool1d",
           "local_response_norm"]


def _one(v: Any, name: str, fname: str, low: int) -> int:
    if isinstance(v, (tuple, list)):
        if len(v) != 1:
            raise RuntimeError(f"{fname}(): {name} must be an int or a 1-tuple, got {v!r}")
        v = v[0]
    if not is_int(v):
        raise TypeError(f"{fname}(): {name} must be an int, got {v!r}")
    if v < low:
        raise RuntimeError(f"{fname}(): {name} must be >= {low}, got {v}")
    return int(v)


def _out_len(n: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    span = n + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= n + p:
        out -= 1  # the last window must start inside the input or its left padding
    return out


def _rows(input: Any, fname: str) -> tuple:  # noqa: A002 - torch's name
    t = as_tensor(input, "input", fname)
    if t.ndim not in (2, 3):
        raise RuntimeError(f"{fname}(): expected a 2-D (C, L) or 3-D (N, C, L) input, got shape "
                           f"{shape_str(t.shape)}")
    return t


def _windows(n: int, k: int, s: int, p: int, d: int, lout: int) -> tuple:
    """(index map (lout, k) into the row padded by p on the left and enough on the right,
    the right padding)."""
    idx = np.arange(lout)[:, None] * s + np.arange(k)[None, :] * d
    right = max(int(idx.max()) + 1 - (n + p), 0) if idx.size else 0
    return idx, right


class _MaxPool1d(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, idx: Any, p: int, right: int) -> Any:
        xp = xp_of(x)
        n = x.shape[-1]
        fill = -xp.inf if _dt.kind_of(x.dtype) == "f" else xp.iinfo(x.dtype).min
        xpad = xp.pad(x, [(0, 0)] * (x.ndim - 1) + [(p, right)], constant_values=fill)
        win = xpad[..., idx]  # (..., lout, k)
        arg = win.argmax(axis=-1)
        out = xp.take_along_axis(win, arg[..., None], axis=-1)[..., 0]
        src = xp.take_along_axis(xp.broadcast_to(idx, win.shape), arg[..., None],
                                 axis=-1)[..., 0] - p
        ctx.save_for_backward(src)
        ctx.n = n
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (src,) = ctx.saved_tensors
        xp = xp_of(g)
        lead = g.shape[:-1]
        rows = int(np.prod(lead)) if lead else 1
        flat_src = src.reshape(rows, -1) + (xp.arange(rows) * ctx.n)[:, None]
        gx = scatter_add_flat(xp, rows * ctx.n, flat_src, xp.ascontiguousarray(g))
        return gx.reshape(*lead, ctx.n), None, None, None


def max_pool1d_with_indices(input: Any, kernel_size: Any, stride: Any = None,  # noqa: A002
                            padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False,
                            return_indices: bool = False) -> Any:
    """:func:`max_pool1d` that returns ``(output, indices)``."""
    return max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool1d(input: Any, kernel_size: Any, stride: Any = None,  # noqa: A002
               padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Any:
    """Max over sliding windows of the last dimension of (N, C, L) or (C, L).

    Args:
        kernel_size: the window length.
        stride: the step (default ``kernel_size``).
        padding: implicit -inf on both ends, at most half the effective window.
        dilation: the spacing of a window's elements.
        ceil_mode: round the output length up (a last, partial window).
        return_indices: also return the int64 positions of the maxima.

    Raises:
        RuntimeError: a bad input rank, a padding above half the window, an empty output.

    Example:
        >>> import mpitensor as mt
        >>> max_pool1d(mt.tensor([[1.0, 5.0, 2.0]]), 2, 1)
        tensor([[5., 5.]])
    """
    fname = "max_pool1d"
    t = _rows(input, fname)
    k = _one(kernel_size, "kernel_size", fname, 1)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and not stride) else \
        _one(stride, "stride", fname, 1)
    p = _one(padding, "padding", fname, 0)
    d = _one(dilation, "dilation", fname, 1)
    if p > (d * (k - 1) + 1) // 2:
        raise RuntimeError(f"{fname}(): padding ({p}) should be at most half of the effective "
                           f"kernel size ({d * (k - 1) + 1})")
    n = t.shape[-1]
    lout = _out_len(n, k, s, p, d, bool(ceil_mode))
    if lout <= 0:
        raise RuntimeError(f"{fname}(): the output would be empty (input length {n}, kernel "
                           f"{k}, stride {s}, padding {p}, dilation {d})")
    idx, right = _windows(n, k, s, p, d, lout)
    xp = xp_of(t)
    node_out = _MaxPool1d.apply(t, idx if xp is np else xp.asarray(idx), p, right)
    if not return_indices:
        return node_out
    with_idx = _max_indices(t, idx, p, right)
    return node_out, with_idx


def _max_indices(t: Tensor, idx: Any, p: int, right: int) -> Tensor:
    x = t._data
    xp = xp_of(x)
    fill = -xp.inf if _dt.kind_of(x.dtype) == "f" else xp.iinfo(x.dtype).min
    xpad = xp.pad(x, [(0, 0)] * (x.ndim - 1) + [(p, right)], constant_values=fill)
    ix = idx if xp is np else xp.asarray(idx)
    arg = xpad[..., ix].argmax(axis=-1)
    src = xp.take_along_axis(xp.broadcast_to(ix, (*arg.shape, ix.shape[1])), arg[..., None],
                             axis=-1)[..., 0] - p
    return _new(src.astype(np.int64))


class _AvgPool1d(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, idx: Any, p: int, right: int, div: Any) -> Any:
        xp = xp_of(x)
        xpad = xp.pad(x, [(0, 0)] * (x.ndim - 1) + [(p, right)])
        out = xpad[..., idx].sum(axis=-1) / div
        ctx.meta = (x.shape, idx, p, right, div)
        return out.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, idx, p, right, div = ctx.meta
        xp = xp_of(g)
        n = shape[-1]
        gw = xp.broadcast_to((g / div)[..., None], (*g.shape, idx.shape[1]))
        gw = gw.reshape(*g.shape[:-1], idx.size)
        acc = scatter_add_axis(gw, gw.ndim - 1, idx.reshape(-1), n + p + right)
        return acc[..., p:p + n], None, None, None, None


def avg_pool1d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,  # noqa: A002
               ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    """Mean over sliding windows of the last dimension of (N, C, L) or (C, L).

    Args:
        kernel_size, stride, padding, ceil_mode: as in :func:`max_pool1d` (zero padding, at
            most half the window).
        count_include_pad: count the padded zeros in each window's divisor.

    Raises:
        RuntimeError: a bad input rank, a padding above half the window, an empty output.

    Example:
        >>> import mpitensor as mt
        >>> avg_pool1d(mt.tensor([[[1.0, 3.0, 2.0, 0.0]]]), 2)
        tensor([[[2., 1.]]])
    """
    fname = "avg_pool1d"
    t = _rows(input, fname)
    check_float(t, "input", fname)
    k = _one(kernel_size, "kernel_size", fname, 1)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and not stride) else \
        _one(stride, "stride", fname, 1)
    p = _one(padding, "padding", fname, 0)
    if p > k // 2:
        raise RuntimeError(f"{fname}(): padding ({p}) should be at most half of the kernel "
                           f"size ({k})")
    n = t.shape[-1]
    lout = _out_len(n, k, s, p, 1, bool(ceil_mode))
    if lout <= 0:
        raise RuntimeError(f"{fname}(): the output would be empty (input length {n}, kernel "
                           f"{k}, stride {s}, padding {p})")
    idx, right = _windows(n, k, s, p, 1, lout)
    start = np.arange(lout) * s - p
    end = np.minimum(start + k, n + p)
    if count_include_pad:
        div = end - start
    else:
        div = np.minimum(end, n) - np.maximum(start, 0)
    x = t._data
    xp = xp_of(x)
    div = div.astype(x.dtype)
    if xp is not np:
        idx, div = xp.asarray(idx), xp.asarray(div)
    return _AvgPool1d.apply(t, idx, p, right, div)


def _adaptive_windows(n: int, lout: int) -> tuple:
    o = np.arange(lout)
    start = (o * n) // lout
    end = -((-(o + 1) * n) // lout)
    k = int((end - start).max())
    idx = start[:, None] + np.arange(k)[None, :]
    inside = idx < end[:, None]
    return np.where(inside, idx, end[:, None] - 1), inside


def adaptive_max_pool1d(input: Any, output_size: Any, return_indices: bool = False) -> Any:  # noqa: A002
    """Max over ``output_size`` windows that tile the last dimension of (N, C, L) or (C, L)
    (window i spans ``[floor(i L / out), ceil((i + 1) L / out))``).

    Example:
        >>> import mpitensor as mt
        >>> adaptive_max_pool1d(mt.tensor([[1.0, 3.0, 2.0, 0.0]]), 2)
        tensor([[3., 2.]])
    """
    fname = "adaptive_max_pool1d"
    t = _rows(input, fname)
    lout = _one(output_size, "output_size", fname, 1)
    n = t.shape[-1]
    if n == 0:
        raise RuntimeError(f"{fname}(): the input length must be positive")
    idx, _ = _adaptive_windows(n, lout)  # a repeated last element does not change the max
    xp = xp_of(t)
    ix = idx if xp is np else xp.asarray(idx)
    out = _MaxPool1d.apply(t, ix, 0, 0)
    if not return_indices:
        return out
    return out, _max_indices(t, ix, 0, 0)


def adaptive_max_pool1d_with_indices(input: Any, output_size: Any,  # noqa: A002
                                     return_indices: bool = False) -> tuple:
    """:func:`adaptive_max_pool1d` that returns ``(output, indices)``."""
    return adaptive_max_pool1d(input, output_size, True)



class _SignedAbs(Function):
    """``sign(x) * |x|``: ``x`` itself, with no gradient where ``x`` is 0 (torch's lp_pool
    writes its pooled power sum this way)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        ctx.save_for_backward(x)
        return x.copy()

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (x,) = ctx.saved_tensors
        return (g * (x != 0),)


def lp_pool1d(input: Any, norm_type: float, kernel_size: int, stride: Any = None,  # noqa: A002
              ceil_mode: bool = False) -> Tensor:
    """Power-average pooling: ``(sum over the window of x^p) ^ (1 / p)`` over sliding windows
    of the last dimension.

    Example:
        >>> import mpitensor as mt
        >>> lp_pool1d(mt.tensor([[[3.0, 4.0]]]), 2, 2)
        tensor([[[5.]]])
    """
    t = as_tensor(input, "input", "lp_pool1d")
    p = float(norm_type)
    k = _one(kernel_size, "kernel_size", "lp_pool1d", 1)
    out = avg_pool1d(t ** p, k, stride, 0, ceil_mode)
    return (_SignedAbs.apply(out) * k) ** (1.0 / p)


class _Unpool1d(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, idx: Any, n_out: int) -> Any:
        xp = xp_of(x)
        lead = x.shape[:-1]
        rows = x.reshape(-1, x.shape[-1])
        ii = idx.reshape(rows.shape[0], -1)
        out = xp.zeros((rows.shape[0], n_out), dtype=x.dtype)
        out[xp.arange(rows.shape[0])[:, None], ii] = rows
        ctx.save_for_backward(ii)
        ctx.shape = x.shape
        return out.reshape(*lead, n_out)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (ii,) = ctx.saved_tensors
        xp = xp_of(g)
        rows = g.reshape(ii.shape[0], -1)
        return rows[xp.arange(ii.shape[0])[:, None], ii].reshape(ctx.shape), None, None


def max_unpool1d(input: Any, indices: Any, kernel_size: Any, stride: Any = None,  # noqa: A002
                 padding: Any = 0, output_size: Any = None) -> Tensor:
    """The partial inverse of :func:`max_pool1d`: each value goes to the position its index
    names (from ``max_pool1d(..., return_indices=True)``); every other position is 0.

    Args:
        output_size: the output length (or a size whose last entry is it); default
            ``(L_in - 1) * stride - 2 * padding + kernel_size``.

    Raises:
        RuntimeError: indices of another shape, out of range, or a bad output size.

    Example:
        >>> import mpitensor as mt
        >>> out, idx = max_pool1d(mt.tensor([[[1.0, 3.0, 2.0, 0.0]]]), 2, return_indices=True)
        >>> max_unpool1d(out, idx, 2)
        tensor([[[0., 3., 2., 0.]]])
    """
    fname = "max_unpool1d"
    t = _rows(input, fname)
    ix = as_tensor(indices, "indices", fname)._data
    if tuple(ix.shape) != tuple(t.shape) or _dt.kind_of(ix.dtype) not in "iu":
        raise RuntimeError(f"{fname}(): indices must be integers of the input's shape "
                           f"{shape_str(t.shape)}, got {shape_str(ix.shape)}")
    k = _one(kernel_size, "kernel_size", fname, 1)
    s = k if stride is None else _one(stride, "stride", fname, 1)
    p = _one(padding, "padding", fname, 0)
    n_out = (t.shape[-1] - 1) * s - 2 * p + k
    if output_size is not None:
        sizes = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size,)
        n_out = int(sizes[-1])
    if n_out <= 0:
        raise RuntimeError(f"{fname}(): the output length {n_out} must be positive")
    if ix.size and (int(ix.min()) < 0 or int(ix.max()) >= n_out):
        raise RuntimeError(f"{fname}(): an index is out of range for an output of length "
                           f"{n_out}")
    return _Unpool1d.apply(t, ix.astype(np.int64, copy=False), n_out)


def local_response_norm(input: Any, size: int, alpha: float = 1e-4,  # noqa: A002
                        beta: float = 0.75, k: float = 1.0) -> Tensor:
    """Normalise each element by its neighbours across channels (dimension 1):
    ``x / (k + alpha * mean of x^2 over `size` channels around it) ^ beta`` (the mean counts
    the zero padding at the edges, as torch's does).

    Raises:
        ValueError: an input of fewer than 3 dimensions.

    Example:
        >>> import mpitensor as mt
        >>> local_response_norm(mt.ones(1, 3, 2), 2).shape
        mpitensor.Size([1, 3, 2])
    """
    from .spatial import pad  # noqa: PLC0415 - a sibling op module

    t = as_tensor(input, "input", "local_response_norm")
    if t.ndim < 3:
        raise ValueError(f"local_response_norm(): expected an input of 3 or more dimensions "
                         f"(N, C, *), got {t.ndim}")
    if t.numel() == 0:
        return t
    size = _one(size, "size", "local_response_norm", 1)
    nd = t.ndim
    perm = (0, *range(2, nd), 1)  # channels last
    sq = (t * t).permute(perm)
    shape = tuple(sq.shape)
    rows = sq.reshape((-1, 1, shape[-1]))
    rows = pad(rows, (size // 2, (size - 1) // 2))
    div = avg_pool1d(rows, size, 1).reshape(shape)
    inv = [0] * nd
    for i, ax in enumerate(perm):
        inv[ax] = i
    div = div.permute(tuple(inv))
    return t / (div * float(alpha) + float(k)) ** float(beta)
