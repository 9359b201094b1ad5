"""Spatial-transformer sampling of ``torch.nn.functional``: ``affine_grid`` (the sampling
grid of a batch of affine maps) and ``grid_sample`` (an input read at the grid's points).

Coordinates are normalised as torch's: -1 and 1 are the centres of the corner pixels with
``align_corners=True``, the outer edges of the corner pixels with ``align_corners=False``.
``grid_sample`` reads 4-D (N, C, H, W) inputs (bilinear, nearest or bicubic) and 5-D
(N, C, D, H, W) ones (bilinear, which is trilinear there, or nearest), with zeros, border or
reflection padding; it is differentiable in the input and, except for nearest, in the grid.
All points are gathered at once: no loop over the batch or the points.

Re-exported by :mod:`mpitensor.nn.functional`; import them from there.

Example:
    >>> import mpitensor as mt
    >>> theta = mt.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    >>> grid = affine_grid(theta, (1, 1, 2, 2), align_corners=True)
    >>> grid_sample(mt.arange(4.0).reshape(1, 1, 2, 2), grid, align_corners=True).flatten()
    tensor([0., 1., 2., 3.])
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import numpy as np

from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor, _new

from .checks import as_tensor, check_float, scatter_add_flat, shape_str, xp_of

__all__ = ["affine_grid", "grid_sample"]


def _align(align_corners: Optional[bool], fname: str) -> bool:
    if align_corners is None:
        warnings.warn(f"{fname}(): align_corners now defaults to False (it was True before "
                      f"torch 1.3.0); pass align_corners explicitly to silence this",
                      UserWarning, stacklevel=3)
        return False
    return bool(align_corners)


def _base(n: int, align: bool, dtype: Any) -> np.ndarray:
    line = np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(n)
    return (line if align else line * (n - 1) / n).astype(dtype)


def affine_grid(theta: Any, size: Any, align_corners: Optional[bool] = None) -> Tensor:
    """The (N, H, W, 2) (or (N, D, H, W, 3)) grid of normalised source coordinates that the
    affine maps ``theta`` (N, 2, 3) (or (N, 3, 4)) send an output of ``size`` to.

    Raises:
        ValueError: a theta that does not match ``size``, or a size of another rank than 4
            or 5. TypeError: an integer theta.

    Example:
        >>> import mpitensor as mt
        >>> affine_grid(mt.eye(2, 3).unsqueeze(0), (1, 1, 2, 2), align_corners=True).shape
        mpitensor.Size([1, 2, 2, 2])
    """
    fname = "affine_grid"
    th = as_tensor(theta, "theta", fname)
    if th._data.dtype.kind != "f":
        raise ValueError(f"{fname}(): theta must be a floating point tensor, got "
                         f"{th._data.dtype}")
    size = tuple(int(s) for s in size)
    if len(size) not in (4, 5):
        raise NotImplementedError(f"{fname}(): only 2-D (4-D size) and 3-D (5-D size) affine "
                                  f"grids exist, got size {size}")
    nd = len(size) - 2
    want = (size[0], nd, nd + 1)
    if tuple(th.shape) != want:
        raise ValueError(f"{fname}(): for size {size} theta must have shape {want}, got "
                         f"{tuple(th.shape)}")
    if min(size[2:]) <= 0:
        raise ValueError(f"{fname}(): size {size} must be positive")
    align = _align(align_corners, fname)
    if not align and min(size[2:]) == 1:
        warnings.warn(f"{fname}(): a dimension of size 1 with align_corners=False has no "
                      f"well-defined grid point", UserWarning, stacklevel=2)
    dt = th._data.dtype
    # the homogeneous base points, x (width) first as torch orders them
    axes = [_base(n, align, dt) for n in reversed(size[2:])]
    if nd == 2:
        xs, ys = np.meshgrid(axes[0], axes[1], indexing="xy")
        pts = np.stack([xs, ys, np.ones_like(xs)], axis=-1)
    else:
        zs, ys, xs = np.meshgrid(axes[2], axes[1], axes[0], indexing="ij")
        pts = np.stack([xs, ys, zs, np.ones_like(xs)], axis=-1)
    flat = pts.reshape(-1, nd + 1)
    xp = xp_of(th)
    base = _new(flat if xp is np else xp.asarray(flat))
    grid = base.matmul(th.transpose(1, 2))  # (N, P, nd)
    return grid.reshape((size[0], *size[2:], nd))


def _unnormalize(c: Tensor, n: int, align: bool) -> Tensor:
    return (c + 1) * ((n - 1) / 2) if align else ((c + 1) * n - 1) / 2


def _select(mask: Any, a: Tensor, b: Tensor) -> Tensor:
    """``a`` where ``mask`` (a raw boolean array) holds, else ``b`` (gradients follow)."""
    m = _new(mask.astype(a._data.dtype))
    return a * m + b * (1 - m)


def _reflect(x: Tensor, twice_low: int, twice_high: int) -> Tensor:
    """Fold coordinates into [low, high] by reflecting at the ends (bounds given doubled)."""
    if twice_low == twice_high:
        return x * 0
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    d = (x - low).abs()
    flips = np.floor(d._data / span)
    extra = d - _new(flips * span)
    return _select(flips % 2 == 0, extra + low, (extra * -1) + (span + low))


def _source(c: Tensor, n: int, align: bool, padding: str) -> Tensor:
    x = _unnormalize(c, n, align)
    if padding == "reflection":
        x = _reflect(x, 0, 2 * (n - 1)) if align else _reflect(x, -1, 2 * n - 1)
    if padding in ("border", "reflection"):
        x = x.clamp(0, n - 1)
    return x


class _Corners(Function):
    """``x`` (N, C, S) read at flat positions ``idx`` (N, P) of each sample (0 where not
    ``ok``) -> (N, C, P); backward scatters back."""

    @staticmethod
    def forward(ctx: Any, x: Any, idx: Any, ok: Any) -> Any:
        xp = xp_of(x)
        out = xp.take_along_axis(x, idx[:, None, :], axis=2) * ok[:, None, :]
        ctx.meta = (x.shape, idx, ok)
        return out.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, idx, ok = ctx.meta
        xp = xp_of(g)
        n, c, s = shape
        pos = (xp.arange(n * c, dtype=np.int64).reshape(n, c, 1) * s + idx[:, None, :])
        gx = scatter_add_flat(xp, n * c * s, xp.broadcast_to(pos, g.shape),
                              g * ok[:, None, :])
        return gx.reshape(shape), None, None


def grid_sample(input: Any, grid: Any, mode: str = "bilinear",  # noqa: A002 - torch's name
                padding_mode: str = "zeros", align_corners: Optional[bool] = None) -> Tensor:
    """Sample ``input`` at the normalised points of ``grid``.

    Args:
        input: (N, C, H, W) or (N, C, D, H, W).
        grid: (N, H_out, W_out, 2) or (N, D_out, H_out, W_out, 3), x (width) first.
        mode: ``'bilinear'``, ``'nearest'`` or (4-D only) ``'bicubic'``.
        padding_mode: ``'zeros'``, ``'border'`` or ``'reflection'``.
        align_corners: see the module docstring (None: False, with a warning).

    Raises:
        ValueError: an unknown mode or padding mode, bicubic on a 5-D input.
        RuntimeError: shapes that do not fit.

    Example:
        >>> import mpitensor as mt
        >>> grid = mt.zeros(1, 1, 1, 2)  # the centre
        >>> grid_sample(mt.arange(4.0).reshape(1, 1, 2, 2), grid, align_corners=False).item()
        1.5
    """
    fname = "grid_sample"
    x = as_tensor(input, "input", fname)
    g = as_tensor(grid, "grid", fname)
    check_float(x, "input", fname)
    if mode not in ("bilinear", "nearest", "bicubic"):
        raise ValueError(f"{fname}(): mode must be 'bilinear', 'nearest' or 'bicubic', got "
                         f"{mode!r}")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"{fname}(): padding_mode must be 'zeros', 'border' or 'reflection', "
                         f"got {padding_mode!r}")
    if x.ndim not in (4, 5) or g.ndim != x.ndim or g.shape[0] != x.shape[0] \
            or g.shape[-1] != x.ndim - 2:
        raise RuntimeError(f"{fname}(): expected a 4-D or 5-D input and a grid of the same "
                           f"rank ending in {x.ndim - 2}, with one batch size; got input "
                           f"{shape_str(x.shape)} and grid {shape_str(g.shape)}")
    if mode == "bicubic":
        if x.ndim == 5:
            raise ValueError(f"{fname}(): bicubic interpolation takes 4-D inputs only")
        raise NotImplementedError(f"{fname}(): mode='bicubic' is not implemented in mpitensor; "
                                  f"use 'bilinear' or 'nearest'")
    align = _align(align_corners, fname)
    nd = x.ndim - 2
    n, c, sp = x.shape[0], x.shape[1], tuple(x.shape[2:])
    out_sp = tuple(g.shape[1:-1])
    pts = g.reshape((n, -1, nd))
    # source coordinates per input dimension (outermost first); the grid lists x first
    coords = [_source(pts[:, :, nd - 1 - d], sp[d], align, padding_mode) for d in range(nd)]
    x3 = x.reshape((n, c, -1))
    strides = [int(np.prod(sp[d + 1:])) for d in range(nd)]
    xp = xp_of(x)

    def corner(ints: list) -> Tensor:
        ok = np.ones(ints[0].shape, dtype=bool) if xp is np else xp.ones(ints[0].shape, bool)
        flat = 0
        for d, i in enumerate(ints):
            ok = ok & (i >= 0) & (i < sp[d])
            flat = flat + xp.clip(i, 0, sp[d] - 1) * strides[d]
        return _Corners.apply(x3, flat.astype(np.int64), ok)

    if mode == "nearest":
        out = corner([xp.rint(cd._data).astype(np.int64) for cd in coords])
        # the grid gets a zero gradient (torch's), not none
        out = out + (pts.sum(-1) * 0).unsqueeze(1)
    else:
        lows = [xp.floor(cd._data) for cd in coords]
        fracs = [cd - _new(lo) for cd, lo in zip(coords, lows)]  # the weight of the high side
        lows = [lo.astype(np.int64) for lo in lows]
        out = None
        for bits in range(2 ** nd):
            ints, w = [], None
            for d in range(nd):
                high = (bits >> d) & 1
                ints.append(lows[d] + high)
                wd = fracs[d] if high else fracs[d] * -1 + 1
                w = wd if w is None else w * wd
            term = corner(ints) * w.unsqueeze(1)
            out = term if out is None else out + term
    return out.reshape((n, c, *out_sp))
