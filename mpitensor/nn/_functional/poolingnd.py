"""N-d pooling of ``torch.nn.functional``: ``max_pool3d``, ``avg_pool3d``,
``adaptive_avg_pool3d``, ``adaptive_max_pool2d``/``3d``, ``max_unpool2d``/``3d``,
``lp_pool2d``/``3d`` and ``fractional_max_pool2d``/``3d`` (with their ``*_with_indices``
forms).

Every pooling here is one gather through a (windows, window elements) map of flat positions
into each (sample, channel) plane, then a reduction; backward is one scatter-add. Positions
that fall in the padding are masked (``-inf`` for a max, weight 0 for a mean), so no padded
copy of the input is made, and no Python loop runs over the batch, the channels or the
windows. Fractional pooling draws its windows per plane, so its map carries a plane axis.

Re-exported by :mod:`mpitensor.nn.functional`; import them from there.

Example:
    >>> import mpitensor as mt
    >>> max_pool3d(mt.arange(8.0).reshape(1, 1, 2, 2, 2), 2).flatten().tolist()
    [7.0]
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core import autocast as _autocast
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor, _new

from .checks import as_tensor, check_float, is_int, scatter_add_flat, shape_str, xp_of
from .pooling1d import _adaptive_windows, _out_len, _SignedAbs, _Unpool1d

__all__ = ["max_pool3d", "max_pool3d_with_indices", "avg_pool3d", "adaptive_avg_pool3d",
           "adaptive_max_pool2d", "adaptive_max_pool2d_with_indices", "adaptive_max_pool3d",
           "adaptive_max_pool3d_with_indices", "max_unpool2d", "max_unpool3d", "lp_pool2d",
           "lp_pool3d", "fractional_max_pool2d", "fractional_max_pool2d_with_indices",
           "fractional_max_pool3d", "fractional_max_pool3d_with_indices"]


# --------------------------------------------------------------------------------------------
# argument checks and window maps

def _tuple(v: Any, name: str, fname: str, nd: int, low: int) -> tuple:
    vals = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    if len(vals) == 1:
        vals = vals * nd
    if len(vals) != nd:
        raise RuntimeError(f"{fname}(): {name} must be an int or a {nd}-tuple, got {v!r}")
    for x in vals:
        if not is_int(x):
            raise TypeError(f"{fname}(): {name} must hold ints, got {v!r}")
        if x < low:
            raise RuntimeError(f"{fname}(): {name} must be >= {low}, got {v!r}")
    return tuple(int(x) for x in vals)


def _planes(input: Any, nd: int, fname: str) -> Tensor:  # noqa: A002 - torch's name
    t = as_tensor(input, "input", fname)
    if t.ndim not in (nd + 1, nd + 2) or any(s == 0 for s in t.shape[-nd:]):
        raise RuntimeError(f"{fname}(): expected a {nd + 1}-D or {nd + 2}-D input with non-zero "
                           f"spatial sizes, got shape {shape_str(t.shape)}")
    return t


def _sliding(sizes: tuple, k: tuple, s: tuple, p: tuple, d: tuple, outs: tuple) -> list:
    return [np.arange(o)[:, None] * si - pi + np.arange(ki)[None, :] * di
            for o, ki, si, pi, di in zip(outs, k, s, p, d)]


def _adaptive_pos(n: int, out: int) -> tuple:
    """Adaptive windows of one dimension: (positions (out, k), in-window mask, lengths)."""
    pos, inside = _adaptive_windows(n, out)
    return pos, inside, inside.sum(axis=1)


def _dev(xp: Any, *arrays: Any) -> tuple:
    return arrays if xp is np else tuple(xp.asarray(a) for a in arrays)


# --------------------------------------------------------------------------------------------
# the two kernels: a masked max and a weighted sum over windows

def _pick(y: Any, ij: Any) -> Any:
    """``y`` (B, ..., n) read at positions ``ij`` of its last axis: shared (O,) or per-plane
    (B, O) -> (B, ..., O)."""
    if ij.ndim == 1:
        return y[..., ij]
    xp = xp_of(y)
    flat = ij.reshape(ij.shape[0], *(1,) * (y.ndim - 2), ij.shape[1])
    if y.shape[0] != ij.shape[0]:
        y = xp.broadcast_to(y, (ij.shape[0], *y.shape[1:]))
    return xp.take_along_axis(y, xp.broadcast_to(flat, (*y.shape[:-1], ij.shape[1])), axis=-1)


def _window_columns(xp: Any, ym: Any, pm: Any, spec: tuple, fill: Any) -> Any:
    """The j-th elements of every window along the last axis, for j = 0, 1, ...: values and
    their positions. ``spec`` is (positions, mask) or, for evenly strided windows,
    (None, (left pad, right pad, stride, dilation, k, windows)), read as strided views."""
    idx, valid = spec
    if idx is None:
        left, right, step, dil, k, count = valid
        if left or right:
            pad = [(0, 0)] * (ym.ndim - 1) + [(left, right)]
            ym = xp.pad(ym, pad, constant_values=fill)
            pm = xp.pad(pm, pad)
        span = (count - 1) * step + 1
        for j in range(k):
            cut = slice(j * dil, j * dil + span, step)
            yield ym[..., cut], pm[..., cut]
        return
    for j in range(idx.shape[-1]):
        v = _pick(ym, idx[..., j])
        if valid is not None:
            v = xp.where(valid[..., j], v, fill)
        yield v, _pick(pm, idx[..., j])


class _WindowMax(Function):
    """Max over box windows of each plane, one spatial dimension at a time (innermost first,
    so ties go to the first maximum in row-major window order); the forward also records
    each max's flat position in its plane."""

    @staticmethod
    def forward(ctx: Any, x: Any, nd: int, maps: tuple, out_sp: tuple,
                holder: Optional[list]) -> Any:
        xp = xp_of(x)
        lead, sp = x.shape[:-nd], x.shape[-nd:]
        planes = int(np.prod(lead, dtype=np.int64))
        y = x.reshape(planes, *sp)
        pos = xp.arange(int(np.prod(sp)), dtype=np.int64).reshape(1, *sp)
        fill = xp.asarray(-xp.inf if _dt.kind_of(x.dtype) == "f" else xp.iinfo(x.dtype).min,
                          dtype=x.dtype)
        is_float = _dt.kind_of(x.dtype) == "f"
        for i in reversed(range(nd)):
            ax = 1 + i
            ym, pm = xp.moveaxis(y, ax, -1), xp.moveaxis(pos, ax, -1)
            best, where_ = None, None
            # one pass per window element (k is small): keep the first maximum, or the
            # first NaN, as a scan of the window in order would
            for v, pj in _window_columns(xp, ym, pm, maps[i], fill):
                if best is None:
                    best, where_ = v, pj
                    continue
                take = v > best
                if is_float:
                    take |= xp.isnan(v) & ~xp.isnan(best)
                best = xp.where(take, v, best)
                where_ = xp.where(take, pj, where_)
            y = xp.moveaxis(best, -1, ax)
            pos = xp.moveaxis(xp.broadcast_to(where_, best.shape), -1, ax)
        src = xp.ascontiguousarray(pos).reshape(planes, -1)
        ctx.save_for_backward(src)
        ctx.shape = x.shape
        if holder is not None:
            holder.append(src)
        return xp.ascontiguousarray(y).reshape(*lead, *out_sp)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (src,) = ctx.saved_tensors
        xp = xp_of(g)
        planes, o = src.shape
        n = int(np.prod(ctx.shape, dtype=np.int64)) // max(planes, 1)
        pos = src + (xp.arange(planes, dtype=np.int64) * n)[:, None]
        gx = scatter_add_flat(xp, planes * n, pos, xp.ascontiguousarray(g).reshape(planes, o))
        return gx.reshape(ctx.shape), None, None, None, None


def _max_pool(t: Tensor, nd: int, maps: list, out_sp: tuple, return_indices: bool) -> Any:
    """``maps``: per spatial dimension, (positions (O, k) or (planes, O, k) clipped into
    the input, in-range mask or None), or a strided-window spec (see _window_columns)."""
    xp = xp_of(t)
    dev_maps = []
    for idx, valid in maps:
        if idx is None:  # strided windows: no arrays to move
            dev_maps.append((idx, valid))
            continue
        if valid is not None and bool(valid.all()):
            valid = None
        dev_maps.append(_dev(xp, idx) + ((None,) if valid is None else _dev(xp, valid)))
    holder: Optional[list] = [] if return_indices else None
    out = _WindowMax.apply(t, nd, tuple(dev_maps), out_sp, holder)
    if not return_indices:
        return out
    return out, _new(holder[0].astype(np.int64).reshape(tuple(out.shape)))


class _SeparableMean(Function):
    """A window mean whose weights are a product over dimensions (every mean pooling here):
    one small (out, in) matrix product per spatial dimension, and their transposes back."""

    @staticmethod
    def forward(ctx: Any, x: Any, nd: int, mats: tuple) -> Any:
        y = x
        for i, m in enumerate(mats):
            ax = x.ndim - nd + i
            y = (y.swapaxes(ax, -1) @ m.T).swapaxes(ax, -1)
        ctx.meta = (nd, mats)
        return y.astype(x.dtype, copy=False).copy(order="C")

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        nd, mats = ctx.meta
        for i in reversed(range(nd)):
            ax = g.ndim - nd + i
            g = (g.swapaxes(ax, -1) @ mats[i]).swapaxes(ax, -1)
        return g.copy(order="C"), None, None


def _mean_matrix(pos: Any, n: int, div: Any, dtype: Any) -> Any:
    """(out, n) weights: 1 / div[o] at each in-range position of window o."""
    m = np.zeros((pos.shape[0], n))
    rows = np.broadcast_to(np.arange(pos.shape[0])[:, None], pos.shape)
    ok = (pos >= 0) & (pos < n)
    np.add.at(m, (rows[ok], pos[ok]), 1.0)
    return (m / np.asarray(div, dtype=float).reshape(-1, 1)).astype(dtype)


# --------------------------------------------------------------------------------------------
# max and mean pooling with sliding windows

def _maxpool_nd(nd: int, fname: str, input: Any, kernel_size: Any,  # noqa: A002
                stride: Any, padding: Any, dilation: Any, ceil_mode: bool,
                return_indices: bool) -> Any:
    t = _planes(input, nd, fname)
    k = _tuple(kernel_size, "kernel_size", fname, nd, 1)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and not stride) else \
        _tuple(stride, "stride", fname, nd, 1)
    p = _tuple(padding, "padding", fname, nd, 0)
    d = _tuple(dilation, "dilation", fname, nd, 1)
    for ki, pi, di in zip(k, p, d):
        if pi > (di * (ki - 1) + 1) // 2:
            raise RuntimeError(f"{fname}(): padding {p} should be at most half of the "
                               f"effective kernel size {k} (dilation {d})")
    sp = tuple(t.shape[-nd:])
    outs = tuple(_out_len(n, *a, bool(ceil_mode)) for n, a in zip(sp, zip(k, s, p, d)))
    if min(outs) < 1:
        raise RuntimeError(f"{fname}(): the output size {outs} is too small for an input of "
                           f"spatial size {sp}")
    maps = [(None, (pi, max(0, (o - 1) * si + (ki - 1) * di + 1 - n - pi), si, di, ki, o))
            for n, ki, si, pi, di, o in zip(sp, k, s, p, d, outs)]
    return _max_pool(t, nd, maps, outs, return_indices)


@_autocast.op("max_pool3d")
def max_pool3d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,  # noqa: A002
               dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """Max over sliding 3-D windows of (N, C, D, H, W) or (C, D, H, W).

    Args:
        kernel_size, stride (default ``kernel_size``), padding (implicit -inf, at most half
            the effective window), dilation: ints or triples.
        ceil_mode: round the output size up (a last, partial window).
        return_indices: also return each max's flat position ``d * H * W + h * W + w``.

    Raises:
        RuntimeError: a bad input rank, a padding above half the window, an empty output.

    Example:
        >>> import mpitensor as mt
        >>> max_pool3d(mt.ones(1, 2, 4, 4, 4), 2).shape
        mpitensor.Size([1, 2, 2, 2, 2])
    """
    return _maxpool_nd(3, "max_pool3d", input, kernel_size, stride, padding, dilation,
                       ceil_mode, return_indices)


def max_pool3d_with_indices(input: Any, kernel_size: Any, stride: Any = None,  # noqa: A002
                            padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False,
                            return_indices: bool = False) -> tuple:
    """:func:`max_pool3d` that returns ``(output, indices)``."""
    return max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def _avgpool_nd(nd: int, fname: str, input: Any, kernel_size: Any, stride: Any,  # noqa: A002
                padding: Any, ceil_mode: bool, count_include_pad: bool,
                divisor_override: Optional[int]) -> Tensor:
    t = _planes(input, nd, fname)
    check_float(t, "input", fname)
    k = _tuple(kernel_size, "kernel_size", fname, nd, 1)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and not stride) else \
        _tuple(stride, "stride", fname, nd, 1)
    p = _tuple(padding, "padding", fname, nd, 0)
    if any(pi > ki // 2 for pi, ki in zip(p, k)):
        raise RuntimeError(f"{fname}(): padding {p} should be at most half of the kernel "
                           f"size {k}")
    if divisor_override is not None and (not is_int(divisor_override) or divisor_override == 0):
        raise RuntimeError(f"{fname}(): divisor_override must be a non-zero int, got "
                           f"{divisor_override!r}")
    sp = tuple(t.shape[-nd:])
    outs = tuple(_out_len(n, ki, si, pi, 1, bool(ceil_mode))
                 for n, ki, si, pi in zip(sp, k, s, p))
    if min(outs) < 1:
        raise RuntimeError(f"{fname}(): the output size {outs} is too small for an input of "
                           f"spatial size {sp}")
    x = t._data
    mats = []
    for n, ki, pi, q in zip(sp, k, p, _sliding(sp, k, s, p, (1,) * nd, outs)):
        start = q[:, 0]
        end = np.minimum(start + ki, n + pi)
        cnt = (end - start) if count_include_pad else \
            (np.minimum(end, n) - np.maximum(start, 0))
        mats.append(_mean_matrix(q, n, np.ones_like(cnt) if divisor_override else cnt,
                                 x.dtype))
    if divisor_override is not None:
        mats[0] = (mats[0] / float(divisor_override)).astype(x.dtype)
    return _SeparableMean.apply(t, nd, _dev(xp_of(x), *mats))


@_autocast.op("avg_pool3d")
def avg_pool3d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0,  # noqa: A002
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: Optional[int] = None) -> Tensor:
    """Mean over sliding 3-D windows of (N, C, D, H, W) or (C, D, H, W).

    Args:
        kernel_size, stride (default ``kernel_size``), padding (zeros, at most half the
            window): ints or triples.
        ceil_mode: round the output size up.
        count_include_pad: count the padded zeros in each window's divisor.
        divisor_override: divide every window's sum by this instead.

    Raises:
        RuntimeError: a bad input rank, a padding above half the window, an empty output.

    Example:
        >>> import mpitensor as mt
        >>> avg_pool3d(mt.ones(1, 1, 2, 2, 2), 2).flatten().tolist()
        [1.0]
    """
    return _avgpool_nd(3, "avg_pool3d", input, kernel_size, stride, padding, ceil_mode,
                       count_include_pad, divisor_override)


# --------------------------------------------------------------------------------------------
# adaptive pooling

def _adaptive_sizes(output_size: Any, sp: tuple, fname: str) -> tuple:
    nd = len(sp)
    vals = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size,) * nd
    if len(vals) != nd:
        raise ValueError(f"{fname}(): output_size must be an int or a {nd}-tuple, got "
                         f"{output_size!r}")
    outs = []
    for v, n in zip(vals, sp):
        if v is None:
            v = n
        if not is_int(v) or v < 0:
            raise RuntimeError(f"{fname}(): output_size must hold non-negative ints or None, "
                               f"got {output_size!r}")
        outs.append(int(v))
    return tuple(outs)


@_autocast.op("adaptive_avg_pool3d")
def adaptive_avg_pool3d(input: Any, output_size: Any) -> Tensor:  # noqa: A002 - torch's name
    """Mean over windows that tile (N, C, D, H, W) or (C, D, H, W) into ``output_size``
    cells (None keeps a dimension's size); window i of a dimension of size n spans
    ``[floor(i n / out), ceil((i + 1) n / out))``.

    Example:
        >>> import mpitensor as mt
        >>> adaptive_avg_pool3d(mt.ones(1, 3, 5, 6, 7), (2, None, 3)).shape
        mpitensor.Size([1, 3, 2, 6, 3])
    """
    fname = "adaptive_avg_pool3d"
    t = _planes(input, 3, fname)
    check_float(t, "input", fname)
    sp = tuple(t.shape[-3:])
    outs = _adaptive_sizes(output_size, sp, fname)
    if min(outs) < 1:
        raise RuntimeError(f"{fname}(): output_size {outs} must be positive")
    mats = []
    for n, o in zip(sp, outs):
        pos, inside, cnt = _adaptive_pos(n, o)
        mats.append(_mean_matrix(np.where(inside, pos, -1), n, cnt, t._data.dtype))
    return _SeparableMean.apply(t, 3, _dev(xp_of(t), *mats))


def _adaptive_max(nd: int, fname: str, input: Any, output_size: Any,  # noqa: A002
                  return_indices: bool) -> Any:
    t = _planes(input, nd, fname)
    sp = tuple(t.shape[-nd:])
    outs = _adaptive_sizes(output_size, sp, fname)
    if min(outs) < 1:
        raise RuntimeError(f"{fname}(): output_size {outs} must be positive")
    # a window's repeated last element cannot change its max or its first maximum
    maps = [(_adaptive_pos(n, o)[0], None) for n, o in zip(sp, outs)]
    return _max_pool(t, nd, maps, outs, return_indices)


def adaptive_max_pool2d(input: Any, output_size: Any, return_indices: bool = False) -> Any:  # noqa: A002
    """Max over windows that tile (N, C, H, W) or (C, H, W) into ``output_size`` cells.

    Example:
        >>> import mpitensor as mt
        >>> adaptive_max_pool2d(mt.arange(16.0).reshape(1, 4, 4), 2).tolist()
        [[[5.0, 7.0], [13.0, 15.0]]]
    """
    return _adaptive_max(2, "adaptive_max_pool2d", input, output_size, return_indices)


def adaptive_max_pool2d_with_indices(input: Any, output_size: Any,  # noqa: A002
                                     return_indices: bool = False) -> tuple:
    """:func:`adaptive_max_pool2d` that returns ``(output, indices)``."""
    return adaptive_max_pool2d(input, output_size, True)


@_autocast.op("adaptive_max_pool3d")
def adaptive_max_pool3d(input: Any, output_size: Any, return_indices: bool = False) -> Any:  # noqa: A002
    """Max over windows that tile (N, C, D, H, W) or (C, D, H, W) into ``output_size``
    cells.

    Example:
        >>> import mpitensor as mt
        >>> adaptive_max_pool3d(mt.ones(1, 1, 4, 4, 4), 1).shape
        mpitensor.Size([1, 1, 1, 1, 1])
    """
    return _adaptive_max(3, "adaptive_max_pool3d", input, output_size, return_indices)


def adaptive_max_pool3d_with_indices(input: Any, output_size: Any,  # noqa: A002
                                     return_indices: bool = False) -> tuple:
    """:func:`adaptive_max_pool3d` that returns ``(output, indices)``."""
    return adaptive_max_pool3d(input, output_size, True)


# --------------------------------------------------------------------------------------------
# unpooling and power-average pooling

def _unpool_nd(nd: int, fname: str, input: Any, indices: Any, kernel_size: Any,  # noqa: A002
               stride: Any, padding: Any, output_size: Any) -> Tensor:
    t = _planes(input, nd, fname)
    ix = as_tensor(indices, "indices", fname)._data
    if tuple(ix.shape) != tuple(t.shape) or _dt.kind_of(ix.dtype) not in "iu":
        raise RuntimeError(f"{fname}(): indices must be integers of the input's shape "
                           f"{shape_str(t.shape)}, got {shape_str(ix.shape)}")
    k = _tuple(kernel_size, "kernel_size", fname, nd, 1)
    s = k if stride is None else _tuple(stride, "stride", fname, nd, 1)
    p = _tuple(padding, "padding", fname, nd, 0)
    sp = tuple(t.shape[-nd:])
    default = tuple((n - 1) * si - 2 * pi + ki for n, ki, si, pi in zip(sp, k, s, p))
    outs = default
    if output_size is not None:
        vals = tuple(int(v) for v in output_size) if isinstance(output_size, (tuple, list)) \
            else (int(output_size),)
        if len(vals) == nd + (t.ndim - nd):
            vals = vals[t.ndim - nd:]
        if len(vals) != nd:
            raise ValueError(f"{fname}(): output_size should have {nd} or {t.ndim} entries, "
                             f"got {len(vals)}")
        for v, dv, si in zip(vals, default, s):
            if not dv - si < v < dv + si:
                raise ValueError(f"{fname}(): invalid output_size {vals} (each entry must lie "
                                 f"strictly between {tuple(a - b for a, b in zip(default, s))} "
                                 f"and {tuple(a + b for a, b in zip(default, s))})")
        outs = vals
    total = int(np.prod(outs))
    if min(outs) <= 0:
        raise RuntimeError(f"{fname}(): the output size {outs} must be positive")
    if ix.size and (int(ix.min()) < 0 or int(ix.max()) >= total):
        raise RuntimeError(f"{fname}(): an index is out of range for an output of spatial "
                           f"size {outs}")
    lead = tuple(t.shape[:-nd])
    flat = t.reshape((*lead, int(np.prod(sp))))
    out = _Unpool1d.apply(flat, ix.reshape(*lead, -1).astype(np.int64, copy=False), total)
    return out.reshape((*lead, *outs))


@_autocast.op("max_unpool2d")
def max_unpool2d(input: Any, indices: Any, kernel_size: Any, stride: Any = None,  # noqa: A002
                 padding: Any = 0, output_size: Any = None) -> Tensor:
    """The partial inverse of a 2-D max pooling: each value goes to the flat position
    ``h * W + w`` its index names; every other position is 0.

    Args:
        output_size: the (H, W) (or full) output size; default
            ``(in - 1) * stride - 2 * padding + kernel_size`` per dimension.

    Raises:
        RuntimeError: indices of another shape or out of range. ValueError: a bad
            ``output_size``.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.nn.functional import max_pool2d
        >>> out, idx = max_pool2d(mt.arange(4.0).reshape(1, 1, 2, 2), 2, return_indices=True)
        >>> max_unpool2d(out, idx, 2).flatten().tolist()
        [0.0, 0.0, 0.0, 3.0]
    """
    return _unpool_nd(2, "max_unpool2d", input, indices, kernel_size, stride, padding,
                      output_size)


@_autocast.op("max_unpool3d")
def max_unpool3d(input: Any, indices: Any, kernel_size: Any, stride: Any = None,  # noqa: A002
                 padding: Any = 0, output_size: Any = None) -> Tensor:
    """The partial inverse of :func:`max_pool3d` (flat positions ``d * H * W + h * W + w``).

    Example:
        >>> import mpitensor as mt
        >>> out, idx = max_pool3d(mt.arange(8.0).reshape(1, 1, 2, 2, 2), 2, return_indices=True)
        >>> max_unpool3d(out, idx, 2).flatten().tolist()[-1]
        7.0
    """
    return _unpool_nd(3, "max_unpool3d", input, indices, kernel_size, stride, padding,
                      output_size)


def _lp_pool_nd(nd: int, fname: str, input: Any, norm_type: float, kernel_size: Any,  # noqa: A002
                stride: Any, ceil_mode: bool) -> Tensor:
    t = as_tensor(input, "input", fname)
    if nd == 2 and t.ndim < 3:  # torch reads the spatial sizes first, and fails on the index
        raise IndexError(f"{fname}(): expected a 3-D or 4-D input, got shape "
                         f"{shape_str(t.shape)}")
    k = _tuple(kernel_size, "kernel_size", fname, nd, 1)
    pw = float(norm_type)
    out = _avgpool_nd(nd, fname, t ** pw, k, stride, 0, ceil_mode, True, None)
    return (_SignedAbs.apply(out) * math.prod(k)) ** (1.0 / pw)


def lp_pool2d(input: Any, norm_type: float, kernel_size: Any, stride: Any = None,  # noqa: A002
              ceil_mode: bool = False) -> Tensor:
    """Power-average pooling over 2-D windows: ``(sum of x^p over the window) ^ (1 / p)``.

    Example:
        >>> import mpitensor as mt
        >>> lp_pool2d(mt.tensor([[[[3.0, 4.0]]]]), 2, (1, 2)).flatten().tolist()
        [5.0]
    """
    return _lp_pool_nd(2, "lp_pool2d", input, norm_type, kernel_size, stride, ceil_mode)


def lp_pool3d(input: Any, norm_type: float, kernel_size: Any, stride: Any = None,  # noqa: A002
              ceil_mode: bool = False) -> Tensor:
    """Power-average pooling over 3-D windows.

    Example:
        >>> import mpitensor as mt
        >>> lp_pool3d(mt.ones(1, 1, 2, 2, 2), 1, 2).flatten().tolist()
        [8.0]
    """
    return _lp_pool_nd(3, "lp_pool3d", input, norm_type, kernel_size, stride, ceil_mode)


# --------------------------------------------------------------------------------------------
# fractional max pooling

def _fractional_starts(u: Any, n: int, out: int, k: int) -> Any:
    """Window starts for samples ``u`` (any shape, in [0, 1)) -> u.shape + (out,): spread
    pseudo-randomly so the last window ends at the input's end; computed in u's dtype."""
    starts = np.empty((*u.shape, out), dtype=np.int64)
    if out > 1:
        alpha = u.dtype.type(n - k) / u.dtype.type(out - 1)
        i = np.arange(out - 1, dtype=u.dtype)
        first = (u * alpha).astype(np.int64)
        starts[..., :-1] = ((i + u[..., None]) * alpha).astype(np.int64) - first[..., None]
    starts[..., -1] = n - k
    return starts


def _fractional(nd: int, fname: str, input: Any, kernel_size: Any,  # noqa: A002
                output_size: Any, output_ratio: Any, return_indices: bool,
                _random_samples: Any) -> Any:
    t = _planes(input, nd, fname)
    k = _tuple(kernel_size, "kernel_size", fname, nd, 1)
    sp = tuple(t.shape[-nd:])
    if output_size is None and output_ratio is None:
        raise ValueError(f"{fname}(): give either output_size or output_ratio")
    if output_size is None:
        ratios = tuple(output_ratio) if isinstance(output_ratio, (tuple, list)) else \
            (output_ratio,) * nd
        if len(ratios) != nd or not all(0 < float(r) < 1 for r in ratios):
            raise ValueError(f"{fname}(): output_ratio must be {nd} numbers in (0, 1), got "
                             f"{output_ratio!r}")
        outs = tuple(int(n * float(r)) for n, r in zip(sp, ratios))
    else:
        outs = _tuple(output_size, "output_size", fname, nd, 1)
    for n, o, ki in zip(sp, outs, k):
        if o + ki - 1 > n:
            raise RuntimeError(f"{fname}(): output_size {outs} with kernel_size {k} does not "
                               f"fit in an input of spatial size {sp}")
    batched = t.ndim == nd + 2
    n_b = t.shape[0] if batched else 1
    c = t.shape[-nd - 1]
    xp = xp_of(t)
    if _random_samples is None:
        from mpitensor._ops.random import rand  # noqa: PLC0415 - the global generator

        samples = rand(n_b, c, nd, dtype=t.dtype, device=t.device)._data
    else:
        samples = as_tensor(_random_samples, "_random_samples", fname)._data
        if tuple(samples.shape) != (n_b, c, nd):
            raise RuntimeError(f"{fname}(): _random_samples must have shape "
                               f"{(n_b, c, nd)}, got {shape_str(samples.shape)}")
    u = np.asarray(samples.get() if xp is not np else samples).reshape(n_b * c, nd)
    # the samples name the dimensions innermost first for 2-D windows, outermost first for 3-D
    order = [1, 0] if nd == 2 else [0, 1, 2]
    pos = []
    for i, (n, o, ki) in enumerate(zip(sp, outs, k)):
        st = _fractional_starts(u[:, order[i]].astype(t._data.dtype), n, o, ki)
        pos.append(st[..., None] + np.arange(ki))
    return _max_pool(t, nd, [(q, None) for q in pos], outs, return_indices)


@_autocast.op("fractional_max_pool2d")
def fractional_max_pool2d(input: Any, kernel_size: Any, output_size: Any = None,  # noqa: A002
                          output_ratio: Any = None, return_indices: bool = False,
                          _random_samples: Any = None) -> Any:
    """Fractional max pooling over (N, C, H, W) or (C, H, W): windows of ``kernel_size``
    placed at pseudo-random steps (one sample in [0, 1) per plane and dimension, drawn unless
    ``_random_samples`` of shape (N, C, 2) gives them) so the output has ``output_size``
    (or ``int(input size * output_ratio)``) cells.

    Raises:
        ValueError: neither ``output_size`` nor ``output_ratio``, or a ratio outside (0, 1).
        RuntimeError: an output that does not fit, or a bad input rank.

    Example:
        >>> import mpitensor as mt
        >>> fractional_max_pool2d(mt.ones(1, 1, 5, 5), 2, output_size=3).shape
        mpitensor.Size([1, 1, 3, 3])
    """
    return _fractional(2, "fractional_max_pool2d", input, kernel_size, output_size,
                       output_ratio, return_indices, _random_samples)


def _with_indices(pool: Callable) -> Callable:
    """torch's ``<pool>_with_indices``: ``pool`` with ``return_indices`` forced on."""
    def with_indices(input: Any, kernel_size: Any, output_size: Any = None,  # noqa: A002
                     output_ratio: Any = None, return_indices: bool = False,
                     _random_samples: Any = None) -> tuple:
        return pool(input, kernel_size, output_size, output_ratio, True, _random_samples)

    with_indices.__name__ = with_indices.__qualname__ = f"{pool.__name__}_with_indices"
    with_indices.__doc__ = f":func:`{pool.__name__}` that returns ``(output, indices)``."
    return with_indices


fractional_max_pool2d_with_indices = _with_indices(fractional_max_pool2d)


@_autocast.op("fractional_max_pool3d")
def fractional_max_pool3d(input: Any, kernel_size: Any, output_size: Any = None,  # noqa: A002
                          output_ratio: Any = None, return_indices: bool = False,
                          _random_samples: Any = None) -> Any:
    """Fractional max pooling over (N, C, D, H, W) or (C, D, H, W) (samples of shape
    (N, C, 3)); see :func:`fractional_max_pool2d`.

    Example:
        >>> import mpitensor as mt
        >>> fractional_max_pool3d(mt.ones(1, 1, 5, 5, 5), 2, output_ratio=0.5).shape
        mpitensor.Size([1, 1, 2, 2, 2])
    """
    return _fractional(3, "fractional_max_pool3d", input, kernel_size, output_size,
                       output_ratio, return_indices, _random_samples)


fractional_max_pool3d_with_indices = _with_indices(fractional_max_pool3d)
