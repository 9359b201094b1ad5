"""Spatial rearrangements of ``torch.nn.functional``: ``pad``, ``interpolate`` (and the
deprecated ``upsample*``), ``pixel_shuffle``/``pixel_unshuffle``, ``channel_shuffle``,
``unfold``/``fold``.

Padding and resampling work one spatial axis at a time, each through an index map (which input
position an output position reads) or a small interpolation matrix (out x in), so forward and
backward are gathers, scatter-adds and matrix products: vectorised, the same on NumPy and
CuPy, and exact adjoints of each other. The interpolation weights follow torch's CPU kernels
(the legacy ``nearest`` rule computed in float32, ``align_corners``, a given ``scale_factor``
used as such unless ``recompute_scale_factor``), so sizes and values agree with torch.

Re-exported by :mod:`mpitensor.nn.functional`; import them from there.

Example:
    >>> import mpitensor as mt
    >>> pad(mt.tensor([[1.0, 2.0]]), (1, 1), mode="reflect")
    tensor([[2., 1., 2., 1.]])
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Optional, Sequence

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core import autocast as _autocast
from mpitensor._core import half as _half
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

from .checks import (
    as_tensor,
    is_int,
    is_number,
    pad_misfit,
    scatter_add_axis,
    scatter_add_flat,
    shape_str,
    xp_of,
)

__all__ = [
    "pad", "interpolate", "upsample", "upsample_nearest", "upsample_bilinear",
    "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle", "unfold",
    "fold",
]


class _Gather(Function):
    """``x`` read through per-axis index maps: ``maps`` is a tuple of (axis, index array)."""

    @staticmethod
    def forward(ctx: Any, x: Any, maps: tuple) -> Any:
        xp = xp_of(x)
        ctx.meta = (x.shape, maps)
        out = x
        for axis, idx in maps:
            out = xp.take(out, idx, axis=axis)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, maps = ctx.meta
        for axis, idx in reversed(maps):
            g = scatter_add_axis(g, axis, idx, shape[axis])
        return g, None


class _ConstantPad(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, src: tuple, dst: tuple, out_shape: tuple, value: Any) -> Any:
        xp = xp_of(x)
        out = xp.full(out_shape, value, dtype=x.dtype)
        out[dst] = x[src]
        ctx.meta = (x.shape, src, dst)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, src, dst = ctx.meta
        xp = xp_of(g)
        gx = xp.zeros(shape, dtype=g.dtype)
        gx[src] = g[dst]
        return gx, None, None, None, None


def _pad_map(n: int, before: int, after: int, mode: str, xp: Any) -> Any:
    """For each output position along one axis, the input position it reads. A negative
    amount crops that side first; the other side then pads what is left (as torch does)."""
    start, stop = max(-before, 0), n - max(-after, 0)
    m = _pad_map_positive(stop - start, max(before, 0), max(after, 0), mode) + start
    return m if xp is np else xp.asarray(m)


def _pad_map_positive(n: int, before: int, after: int, mode: str) -> np.ndarray:
    idx = np.arange(-before, n + after)
    if mode == "replicate":
        idx = np.clip(idx, 0, n - 1)
    elif mode == "circular":
        idx = idx % n
    else:  # reflect, without repeating the edge
        period = 2 * (n - 1)
        m = idx % period if period else np.zeros_like(idx)
        idx = np.where(m >= n, period - m, m)
    return idx


_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _pad_op(input: Any, pad: Sequence[int], mode: str = "constant",  # noqa: A002
            value: Optional[float] = None) -> str:
    """The name autocast knows this padding by: torch's reflection_pad1d/2d and
    replication_pad1d/2d/3d run in float32 under CPU autocast; other paddings are not cast."""
    n = len(pad) // 2
    if mode == "reflect" and n <= 2:
        return "reflection_pad"
    if mode == "replicate" and n <= 3:
        return "replication_pad"
    return "pad"


@_autocast.op(_pad_op)
def pad(input: Any, pad: Sequence[int], mode: str = "constant",  # noqa: A002
        value: Optional[float] = None) -> Tensor:
    """Pad (or, with negative amounts, crop) the last dimensions of ``input``.

    Args:
        input: a tensor.
        pad: ``(left, right)`` for the last dimension, then ``(top, bottom)`` for the one
            before, and so on (an even number of ints, at most two per dimension).
        mode: ``'constant'`` (any number of dimensions), or ``'reflect'``, ``'replicate'``,
            ``'circular'`` for the last 1, 2 or 3 dimensions of a batched or unbatched input.
        value: the fill of ``'constant'`` padding (default 0).

    Returns:
        The padded tensor; the gradient flows back to ``input`` (summed where positions were
        read several times).

    Raises:
        RuntimeError: an odd or too long ``pad``, a ``value`` with another mode, a reflect pad
            not smaller than the dimension, a circular one larger than it, a negative size.
        NotImplementedError: a non-constant mode on an input of a rank it does not support.
        ValueError: an unknown mode.

    Example:
        >>> import mpitensor as mt
        >>> pad(mt.ones(1, 2), (1, 0), value=5.0)
        tensor([[5., 1., 1.]])
    """
    t = as_tensor(input, "input", "pad")
    if mode not in _PAD_MODES:
        raise ValueError(f"pad(): mode must be one of {', '.join(_PAD_MODES)}, got {mode!r}")
    amounts = [int(p) for p in pad] if isinstance(pad, (tuple, list)) else None
    if amounts is None or not all(is_int(p) for p in pad):
        raise TypeError(f"pad(): pad must be a tuple or list of ints, got {pad!r}")
    if len(amounts) % 2:
        raise RuntimeError(f"pad(): the padding must have an even length (two ints per "
                           f"dimension), got {len(amounts)}")
    nd = t.ndim
    k = len(amounts) // 2
    if k > nd:
        raise RuntimeError(f"pad(): {len(amounts)} padding values pad {k} dimensions, but the "
                           f"input has only {nd}")
    pairs = [(nd - 1 - i, amounts[2 * i], amounts[2 * i + 1]) for i in range(k)]
    if mode == "constant":
        return _constant_pad(t, pairs, value)
    if value is not None:
        raise RuntimeError(f"pad(): mode {mode!r} takes no value argument")
    if k not in (1, 2, 3) or nd not in (k + 1, k + 2):
        raise NotImplementedError(
            f"pad(): {mode!r} padding of {k} dimension(s) needs a {k + 1}-D or {k + 2}-D input, "
            f"got a {nd}-D one (non-constant modes pad the last 1, 2 or 3 dimensions)")
    return _mapped_pad(t, pairs, mode)


def _constant_pad(t: Tensor, pairs: list, value: Optional[float]) -> Tensor:
    """pad()'s 'constant' mode: one slice copy into a filled output (negative amounts crop)."""
    x = t._data
    nd = x.ndim
    out_shape = list(x.shape)
    src, dst = [slice(None)] * nd, [slice(None)] * nd
    for axis, lo, hi in pairs:
        n = x.shape[axis]
        size = n + lo + hi
        if size < 0:
            raise RuntimeError(f"pad(): padding ({lo}, {hi}) leaves a negative size for "
                               f"dimension {axis} of size {n}")
        out_shape[axis] = size
        src[axis] = slice(max(-lo, 0), max(n - max(-hi, 0), max(-lo, 0)))
        dst[axis] = slice(max(lo, 0), max(lo, 0) + max(n - max(-lo, 0) - max(-hi, 0), 0))
    fill = 0 if value is None else value
    if _dt.kind_of(x.dtype) in "iub" and isinstance(fill, float):
        fill = int(fill) if _dt.kind_of(x.dtype) != "b" else bool(fill)
    return _ConstantPad.apply(t, tuple(src), tuple(dst), tuple(out_shape), fill)


def _mapped_pad(t: Tensor, pairs: list, mode: str) -> Tensor:
    """pad()'s reflect, replicate and circular modes: one gather through an index map per
    padded dimension (its gradient sums the positions read several times)."""
    x = t._data
    xp = xp_of(x)
    maps = []
    for axis, lo, hi in pairs:
        n = x.shape[axis]
        kept = n - max(-lo, 0) - max(-hi, 0)
        if kept <= 0:
            raise RuntimeError(f"pad(): padding ({lo}, {hi}) crops all of dimension {axis} of "
                               f"size {n}")
        why = pad_misfit(mode, lo, hi, n)
        if why is not None:
            raise RuntimeError(f"pad(): {why} in dimension {axis}")
        if n + lo + hi < 0 or n == 0:
            raise RuntimeError(f"pad(): padding ({lo}, {hi}) does not fit dimension {axis} of "
                               f"size {n}")
        maps.append((axis, _pad_map(n, lo, hi, mode, xp)))
    return _Gather.apply(t, tuple(maps))


# --------------------------------------------------------------------------------------------
# interpolate

_MODES = {"nearest": None, "nearest-exact": None, "area": None, "linear": 1, "bilinear": 2,
          "bicubic": 2, "trilinear": 3}


def _float32_scale(scale: Optional[float], n_in: int, n_out: int) -> np.float32:
    if scale is not None and scale > 0:
        return np.float32(1.0 / scale)
    return np.float32(n_in) / np.float32(n_out)


def _nearest_map(n_in: int, n_out: int, scale: Optional[float], exact: bool) -> np.ndarray:
    dst = np.arange(n_out)
    if not exact:
        if n_out == n_in:
            return dst
        if n_out == 2 * n_in:
            return dst >> 1
    s = _float32_scale(scale, n_in, n_out)
    pos = dst.astype(np.float32) + (np.float32(0.5) if exact else np.float32(0.0))
    return np.minimum(np.floor(pos * s).astype(np.int64), n_in - 1)


def _linear_scale(n_in: int, n_out: int, scale: Optional[float], align: bool,
                  dt: Any) -> Any:
    if align:
        return dt.type((n_in - 1) / (n_out - 1)) if n_out > 1 else dt.type(0)
    if scale is not None and scale > 0:
        return dt.type(1.0 / scale)
    return dt.type(n_in) / dt.type(n_out)


def _linear_matrix(n_in: int, n_out: int, scale: Optional[float], align: bool,
                   dt: Any) -> np.ndarray:
    s = _linear_scale(n_in, n_out, scale, align, dt)
    dst = np.arange(n_out).astype(dt)
    real = s * dst if align else np.maximum(s * (dst + dt.type(0.5)) - dt.type(0.5), 0)
    i0 = np.minimum(np.floor(real).astype(np.int64), n_in - 1)
    lam1 = np.clip(real - i0, 0, 1).astype(dt)
    i1 = i0 + (i0 < n_in - 1)
    w = np.zeros((n_out, n_in), dtype=dt)
    rows = np.arange(n_out)
    np.add.at(w, (rows, i0), (1 - lam1).astype(dt))
    np.add.at(w, (rows, i1), lam1)
    return w


_CUBIC_A = -0.75


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    """Keys' cubic convolution weights (A = -0.75) of the 4 taps at offsets -1, 0, 1, 2."""
    a = _CUBIC_A

    def near(x: np.ndarray) -> np.ndarray:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1)


def _cubic_matrix(n_in: int, n_out: int, scale: Optional[float], align: bool,
                  dt: Any) -> np.ndarray:
    s = _linear_scale(n_in, n_out, scale, align, dt)
    dst = np.arange(n_out).astype(dt)
    real = s * dst if align else s * (dst + dt.type(0.5)) - dt.type(0.5)
    base = np.floor(real).astype(np.int64)
    t = (real - base).astype(dt)
    wts = _cubic_weights(t).astype(dt)
    w = np.zeros((n_out, n_in), dtype=dt)
    rows = np.repeat(np.arange(n_out), 4)
    cols = np.clip(base[:, None] + np.arange(-1, 3)[None, :], 0, n_in - 1).reshape(-1)
    np.add.at(w, (rows, cols), wts.reshape(-1))
    return w


def _area_matrix(n_in: int, n_out: int, dt: Any) -> np.ndarray:
    dst = np.arange(n_out)
    start = (dst * n_in) // n_out
    end = -((-(dst + 1) * n_in) // n_out)
    cols = np.arange(n_in)
    inside = (cols[None, :] >= start[:, None]) & (cols[None, :] < end[:, None])
    return (inside / (end - start)[:, None]).astype(dt)


def _along(x: Any, axis: int, m: Any) -> Any:
    """``m`` (out x in) applied along ``axis`` of ``x``, as one (batched) matrix product
    without moving axes where the axis is one of the last two (so BLAS sees contiguous
    operands)."""
    xp = xp_of(x)
    if axis == x.ndim - 1:
        return xp.ascontiguousarray(x) @ m.T
    if axis == x.ndim - 2:
        return m @ xp.ascontiguousarray(x)
    moved = xp.ascontiguousarray(xp.moveaxis(x, axis, -1))
    return xp.moveaxis(moved @ m.T, -1, axis)


@_half.computes_in_float32
class _Resample(Function):
    """Per-axis linear maps: ``ops`` holds (axis, kind, data), kind 'take' (an index map) or
    'mat' (an out x in matrix)."""

    @staticmethod
    def forward(ctx: Any, x: Any, ops: tuple) -> Any:
        xp = xp_of(x)
        ctx.meta = (x.shape, ops)
        out = x
        for axis, kind, data in ops:
            if kind == "take":
                out = xp.take(out, data, axis=axis)
            else:
                out = _along(out, axis, data)
        return xp.ascontiguousarray(out)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, ops = ctx.meta
        xp = xp_of(g)
        for axis, kind, data in reversed(ops):
            if kind == "take":
                g = scatter_add_axis(g, axis, data, shape[axis])
            else:
                g = _along(g, axis, data.T)
        return xp.ascontiguousarray(g), None


def _tuple_of(v: Any, n: int, name: str, kind: type) -> tuple:
    if isinstance(v, (tuple, list)):
        if len(v) != n:
            raise ValueError(f"interpolate(): {name} has {len(v)} entries for an input with {n} "
                             f"spatial dimensions")
        return tuple(v)
    return (v,) * n


def interpolate(input: Any, size: Any = None, scale_factor: Any = None,  # noqa: A002
                mode: str = "nearest", align_corners: Optional[bool] = None,
                recompute_scale_factor: Optional[bool] = None,
                antialias: bool = False) -> Tensor:
    """Resize the spatial dimensions of a (N, C, *spatial) input (1 to 3 of them).

    Args:
        input: 3-D, 4-D or 5-D.
        size: the output spatial size (an int or one per dimension).
        scale_factor: a multiplier of the spatial size (a number or one per dimension); the
            output size is ``floor(size * scale_factor)``.
        mode: ``'nearest'`` (torch's legacy rule), ``'nearest-exact'``, ``'linear'`` (3-D),
            ``'bilinear'``/``'bicubic'`` (4-D), ``'trilinear'`` (5-D) or ``'area'``.
        align_corners: for the linear and cubic modes: map corner pixel centres onto each
            other (default False).
        recompute_scale_factor: compute the interpolation from the output size rather than
            from the given ``scale_factor``.
        antialias: not supported (raises).

    Returns:
        The resized tensor, differentiable with respect to ``input``.

    Raises:
        ValueError: both or neither of size/scale_factor, align_corners with a mode that
            takes none, an unknown mode.
        NotImplementedError: a mode for an input of the wrong rank, ``antialias=True``.

    Example:
        >>> import mpitensor as mt
        >>> interpolate(mt.tensor([[[1.0, 2.0]]]), scale_factor=2)
        tensor([[[1., 1., 2., 2.]]])
    """
    t = as_tensor(input, "input", "interpolate")
    if mode not in _MODES:
        raise ValueError(f"interpolate(): mode must be one of {', '.join(_MODES)}, got {mode!r}")
    nsp = t.ndim - 2
    if nsp not in (1, 2, 3):
        raise NotImplementedError(f"interpolate(): expected a 3-D, 4-D or 5-D (N, C, *spatial) "
                                  f"input, got shape {shape_str(t.shape)}")
    need = _MODES[mode]
    if need is not None and need != nsp:
        raise NotImplementedError(f"interpolate(): mode {mode!r} needs a {need + 2}-D input, "
                                  f"got a {t.ndim}-D one")
    if align_corners is not None and need is None:
        raise ValueError("interpolate(): align_corners can only be set with the linear and "
                         "cubic modes (linear, bilinear, bicubic, trilinear)")
    if antialias:
        raise NotImplementedError("interpolate(): antialias=True is not supported")
    align = bool(align_corners)
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate(): give exactly one of size and scale_factor")
    in_sizes = tuple(t.shape[2:])
    if size is not None:
        out_sizes = tuple(int(s) for s in _tuple_of(size, nsp, "size", int))
        scales: tuple = (None,) * nsp
    else:
        sf = _tuple_of(scale_factor, nsp, "scale_factor", float)
        if not all(is_number(s) for s in sf):
            raise TypeError(f"interpolate(): scale_factor must be numbers, got {scale_factor!r}")
        out_sizes = tuple(int(math.floor(float(n) * float(s))) for n, s in zip(in_sizes, sf))
        scales = (None,) * nsp if recompute_scale_factor else tuple(float(s) for s in sf)
    if any(o <= 0 for o in out_sizes) or any(n <= 0 for n in in_sizes):
        raise ValueError(f"interpolate(): input size {in_sizes} and output size {out_sizes} "
                         f"must be positive")
    x = t._data
    if mode in ("linear", "bilinear", "bicubic", "trilinear", "area") and \
            not _dt.is_floating_dtype(x.dtype):
        raise RuntimeError(f"interpolate(): mode {mode!r} needs a floating point input")
    return _Resample.apply(t, _resample_ops(x, mode, in_sizes, out_sizes, scales, align))


def _resample_ops(x: Any, mode: str, in_sizes: tuple, out_sizes: tuple, scales: tuple,
                  align: bool) -> tuple:
    """interpolate()'s plan, one step per spatial axis: an index map to take (nearest modes)
    or an interpolation matrix to apply (linear, cubic, area)."""
    xp = xp_of(x)
    dt = np.dtype(x.dtype) if x.dtype in (np.float32, np.float64) else np.dtype(np.float32)
    ops = []
    for i, (n_in, n_out, sc) in enumerate(zip(in_sizes, out_sizes, scales)):
        axis = 2 + i
        if mode in ("nearest", "nearest-exact"):
            idx = _nearest_map(n_in, n_out, sc, mode == "nearest-exact")
            ops.append((axis, "take", idx if xp is np else xp.asarray(idx)))
            continue
        if mode == "area":
            m = _area_matrix(n_in, n_out, dt)
        elif mode == "bicubic":
            m = _cubic_matrix(n_in, n_out, sc, align, dt)
        else:
            m = _linear_matrix(n_in, n_out, sc, align, dt)
        ops.append((axis, "mat", m if xp is np else xp.asarray(m)))
    return tuple(ops)


def upsample(input: Any, size: Any = None, scale_factor: Any = None,  # noqa: A002
             mode: str = "nearest", align_corners: Optional[bool] = None) -> Tensor:
    """Deprecated spelling of :func:`interpolate` (warns, as torch does)."""
    warnings.warn("upsample() is deprecated; use interpolate() instead", UserWarning,
                  stacklevel=2)
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input: Any, size: Any = None, scale_factor: Any = None) -> Tensor:  # noqa: A002
    """Deprecated: ``interpolate(..., mode='nearest')`` (warns)."""
    warnings.warn("upsample_nearest() is deprecated; use interpolate() instead", UserWarning,
                  stacklevel=2)
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input: Any, size: Any = None, scale_factor: Any = None) -> Tensor:  # noqa: A002
    """Deprecated: ``interpolate(..., mode='bilinear', align_corners=True)`` (warns)."""
    warnings.warn("upsample_bilinear() is deprecated; use interpolate() instead", UserWarning,
                  stacklevel=2)
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


# --------------------------------------------------------------------------------------------
# pixel and channel shuffles


def _shuffle_args(input: Any, v: Any, name: str, fname: str, layout: str) -> tuple:  # noqa: A002
    """The shuffles' operands: the input as a tensor of 3 or more dimensions (``layout`` names
    them in the message) and the positive integer factor ``v``."""
    t = as_tensor(input, "input", fname)
    if not is_int(v) or v <= 0:
        raise ValueError(f"{fname}(): {name} must be a positive integer, got {v!r}")
    if t.ndim < 3:
        raise RuntimeError(f"{fname}(): expected at least 3 dimensions {layout}, got shape "
                           f"{shape_str(t.shape)}")
    return t, int(v)


def pixel_shuffle(input: Any, upscale_factor: int) -> Tensor:  # noqa: A002 - torch's name
    """Rearrange (*, C * r^2, H, W) into (*, C, H * r, W * r) (sub-pixel convolution).

    Raises:
        RuntimeError: fewer than 3 dimensions, or channels not divisible by r^2.

    Example:
        >>> import mpitensor as mt
        >>> pixel_shuffle(mt.arange(4.0).reshape(1, 4, 1, 1), 2)
        tensor([[[[0., 1.],
                  [2., 3.]]]])
    """
    t, r = _shuffle_args(input, upscale_factor, "upscale_factor", "pixel_shuffle",
                         "(*, C, H, W)")
    *lead, c, h, w = t.shape
    if c % (r * r):
        raise RuntimeError(f"pixel_shuffle(): the channel dimension ({c}) must be divisible by "
                           f"upscale_factor ** 2 ({r * r})")
    nl = len(lead)
    y = t.reshape((*lead, c // (r * r), r, r, h, w))
    perm = (*range(nl), nl, nl + 3, nl + 1, nl + 4, nl + 2)
    return y.permute(perm).reshape((*lead, c // (r * r), h * r, w * r))


def pixel_unshuffle(input: Any, downscale_factor: int) -> Tensor:  # noqa: A002 - torch's name
    """Rearrange (*, C, H * r, W * r) into (*, C * r^2, H, W): the inverse of
    :func:`pixel_shuffle`.

    Raises:
        RuntimeError: fewer than 3 dimensions, or a height or width not divisible by r.

    Example:
        >>> import mpitensor as mt
        >>> pixel_unshuffle(mt.arange(4.0).reshape(1, 1, 2, 2), 2).flatten()
        tensor([0., 1., 2., 3.])
    """
    t, r = _shuffle_args(input, downscale_factor, "downscale_factor", "pixel_unshuffle",
                         "(*, C, H, W)")
    *lead, c, h, w = t.shape
    if h % r or w % r:
        raise RuntimeError(f"pixel_unshuffle(): height ({h}) and width ({w}) must be divisible "
                           f"by downscale_factor ({r})")
    nl = len(lead)
    y = t.reshape((*lead, c, h // r, r, w // r, r))
    perm = (*range(nl), nl, nl + 2, nl + 4, nl + 1, nl + 3)
    return y.permute(perm).reshape((*lead, c * r * r, h // r, w // r))


def channel_shuffle(input: Any, groups: int) -> Tensor:  # noqa: A002 - torch's name
    """Interleave the channels of a (N, C, *) input across ``groups`` groups (ShuffleNet).

    Raises:
        RuntimeError: fewer than 3 dimensions, or channels not divisible by ``groups``.

    Example:
        >>> import mpitensor as mt
        >>> channel_shuffle(mt.arange(4.0).reshape(1, 4, 1), 2).flatten()
        tensor([0., 2., 1., 3.])
    """
    t, g = _shuffle_args(input, groups, "groups", "channel_shuffle", "(N, C, *)")
    n, c, *rest = t.shape
    if c % g:
        raise RuntimeError(f"channel_shuffle(): the channels ({c}) must be divisible by groups "
                           f"({g})")
    return t.reshape((n, g, c // g, *rest)).transpose(1, 2).reshape((n, c, *rest))


def native_channel_shuffle(input: Any, groups: int) -> Tensor:  # noqa: A002 - torch's name
    """The same as :func:`channel_shuffle` (torch's name for its native kernel)."""
    return channel_shuffle(input, groups)


# --------------------------------------------------------------------------------------------
# unfold / fold (im2col / col2im)


def _pair2(v: Any, name: str, fname: str, low: int) -> tuple:
    pair = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(pair) != 2 or not all(is_int(e) for e in pair):
        raise TypeError(f"{fname}(): {name} must be an int or a pair of ints, got {v!r}")
    if any(e < low for e in pair):
        raise RuntimeError(f"{fname}(): {name} must be >= {low}, got {v!r}")
    return int(pair[0]), int(pair[1])


def _block_geometry(kernel_size: Any, dilation: Any, padding: Any, stride: Any,
                    fname: str) -> tuple:
    """fold's and unfold's block arguments as pairs ``(k, d, p, s)``, checked in that order."""
    return (_pair2(kernel_size, "kernel_size", fname, 1), _pair2(dilation, "dilation", fname, 1),
            _pair2(padding, "padding", fname, 0), _pair2(stride, "stride", fname, 1))


def _block_index(hw: tuple, k: tuple, d: tuple, p: tuple, s: tuple, fname: str) -> tuple:
    """(flat index into the padded plane for each (kernel position, block): (K, L), the block
    grid (oh, ow), the padded size)."""
    hp, wp = hw[0] + 2 * p[0], hw[1] + 2 * p[1]
    oh = (hp - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (wp - d[1] * (k[1] - 1) - 1) // s[1] + 1
    if oh <= 0 or ow <= 0:
        raise RuntimeError(f"{fname}(): the {k[0]}x{k[1]} kernel (dilation {d}) does not fit "
                           f"the padded {hp}x{wp} input")
    rows = (np.arange(k[0]) * d[0])[:, None, None, None] + (np.arange(oh) * s[0])[None, None,
                                                                                   :, None]
    cols = (np.arange(k[1]) * d[1])[None, :, None, None] + (np.arange(ow) * s[1])[None, None,
                                                                                   None, :]
    idx = (rows * wp + cols).reshape(k[0] * k[1], oh * ow)
    return idx, (oh, ow), (hp, wp)


def _im2col(x: Any, idx: Any, p: tuple) -> Any:
    xp = xp_of(x)
    n, c = x.shape[:2]
    xpad = xp.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1]))) if any(p) else x
    out = xpad.reshape(n, c, -1)[:, :, idx]  # (n, c, K, L)
    return out.reshape(n, c * idx.shape[0], idx.shape[1])


class _Unfold(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, idx: Any, p: tuple, padded: tuple) -> Any:
        ctx.meta = (x.shape, idx, p, padded)
        return _im2col(x, idx, p)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, idx, p, padded = ctx.meta
        return _col2im(g, shape, idx, p, padded), None, None, None


def _col2im(cols: Any, shape: tuple, idx: Any, p: tuple, padded: tuple) -> Any:
    xp = xp_of(cols)
    n, c = shape[:2]
    plane = padded[0] * padded[1]
    vals = xp.ascontiguousarray(cols).reshape(n * c, idx.size)
    pos = xp.arange(n * c, dtype=np.int64)[:, None] * plane + idx.reshape(1, -1)
    acc = scatter_add_flat(xp, n * c * plane, pos, vals).reshape(n, c, *padded)
    return acc[:, :, p[0]:padded[0] - p[0], p[1]:padded[1] - p[1]]


class _Fold(Function):
    @staticmethod
    def forward(ctx: Any, cols: Any, shape: tuple, idx: Any, p: tuple, padded: tuple) -> Any:
        ctx.meta = (idx, p, padded)
        return xp_of(cols).ascontiguousarray(_col2im(cols, shape, idx, p, padded))

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        idx, p, _ = ctx.meta
        return _im2col(g, idx, p), None, None, None, None


def _batched(t: Tensor, want: int, fname: str) -> tuple:
    if t.ndim == want:
        return t, True
    if t.ndim == want - 1:
        return t.unsqueeze(0), False
    raise RuntimeError(f"{fname}(): expected a {want - 1}-D (unbatched) or {want}-D (batched) "
                       f"input, got shape {shape_str(t.shape)}")


def unfold(input: Any, kernel_size: Any, dilation: Any = 1, padding: Any = 0,  # noqa: A002
           stride: Any = 1) -> Tensor:
    """Extract sliding blocks (im2col): (N, C, H, W) -> (N, C * kh * kw, L), L the number of
    blocks; an unbatched (C, H, W) input gives (C * kh * kw, L).

    Example:
        >>> import mpitensor as mt
        >>> unfold(mt.arange(4.0).reshape(1, 1, 2, 2), 2).flatten()
        tensor([0., 1., 2., 3.])
    """
    t = as_tensor(input, "input", "unfold")
    t4, batched = _batched(t, 4, "unfold")
    k, d, p, s = _block_geometry(kernel_size, dilation, padding, stride, "unfold")
    idx, _, padded = _block_index(tuple(t4.shape[2:]), k, d, p, s, "unfold")
    xp = xp_of(t4)
    out = _Unfold.apply(t4, idx if xp is np else xp.asarray(idx), p, padded)
    return out if batched else out.squeeze(0)


def fold(input: Any, output_size: Any, kernel_size: Any, dilation: Any = 1,  # noqa: A002
         padding: Any = 0, stride: Any = 1) -> Tensor:
    """Sum sliding blocks back into an image (col2im), the adjoint of :func:`unfold`:
    (N, C * kh * kw, L) -> (N, C, *output_size); unbatched (C * kh * kw, L) too.

    Raises:
        RuntimeError: a block dimension not divisible by the kernel size, or L not the number
            of blocks that fit ``output_size``.

    Example:
        >>> import mpitensor as mt
        >>> fold(mt.ones(1, 4, 1), (2, 2), 2).flatten()
        tensor([1., 1., 1., 1.])
    """
    t = as_tensor(input, "input", "fold")
    t3, batched = _batched(t, 3, "fold")
    osz = _pair2(output_size, "output_size", "fold", 1)
    k, d, p, s = _block_geometry(kernel_size, dilation, padding, stride, "fold")
    n, ck, nblocks = t3.shape
    if ck % (k[0] * k[1]):
        raise RuntimeError(f"fold(): the block dimension ({ck}) must be divisible by the kernel "
                           f"size {k[0]} * {k[1]}")
    idx, (oh, ow), padded = _block_index(osz, k, d, p, s, "fold")
    if oh * ow != nblocks:
        raise RuntimeError(f"fold(): the input has {nblocks} blocks, but {oh} * {ow} = "
                           f"{oh * ow} fit output_size {osz}")
    xp = xp_of(t3)
    shape = (n, ck // (k[0] * k[1]), *osz)
    out = _Fold.apply(t3, shape, idx if xp is np else xp.asarray(idx), p, padded)
    return out if batched else out.squeeze(0)

