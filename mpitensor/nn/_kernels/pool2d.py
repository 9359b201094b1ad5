"""2-D pooling kernels behind ``max_pool2d`` and ``avg_pool2d`` (raw NumPy or CuPy arrays).

2x2/stride-2 max pooling, the common case, is two pairwise ``maximum`` passes on strided views
(in C where :mod:`.native` is built); it keeps a small code array (which of the 4 positions
won, the first one on ties, as torch) and its backward is one broadcast multiply into the 4
planes of the input gradient. Other geometries use a strided window copy, ``argmax`` and a
``bincount`` scatter.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor._base import determinism as _determinism
from mpitensor._base.parallel import split_pass
from mpitensor._base.workspace import empty, memory_order, xp_of
from mpitensor.nn._kernels import native as _native


def _as_strided(xp: Any, x: Any, shape: tuple, strides: tuple) -> Any:
    return xp.lib.stride_tricks.as_strided(x, shape=shape, strides=strides)



def pool_out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """Output length of a pooling window sweep, as torch computes it (ceil_mode included)."""
    eff = d * (k - 1) + 1
    num = size + 2 * p - eff
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1  # the last window must start inside the input or the left padding
    return out


def maxpool2x2_forward(x: Any, oh: int, ow: int) -> tuple:
    """2x2/stride-2 max pool of NCHW ``x``; return ``(out_nchw, code)``.

    Works on the (C, H, W, N) view, whose stride-2 slices keep the batch as a long contiguous
    inner loop when ``x`` comes from conv2d/relu. ``code`` (C, oh, ow, N) uint8 says which of
    the window's 4 elements won (row-major index, the first one on ties, as torch). The output
    is C-contiguous NCHW so that ``view`` works on it as on torch's. Big inputs are shared out
    across threads by channel (:func:`split_pass`).
    """
    xp = xp_of(x)
    N, C = x.shape[0], x.shape[1]
    xc = x.transpose(1, 2, 3, 0)[:, :2 * oh, :2 * ow]
    out = empty(xp, (N, C, oh, ow), x.dtype)
    oc = out.transpose(1, 2, 3, 0)
    code = empty(xp, (C, oh, ow, N), xp.uint8)

    def channels(span: tuple) -> None:
        xs = xc[span[0]:span[1]]
        a, b = xs[:, :, 0::2], xs[:, :, 1::2]
        mw = xp.maximum(a, b)
        cw = b > a  # right column wins only when strictly greater: first max on ties
        top, bot = mw[:, 0::2], mw[:, 1::2]
        xp.maximum(top, bot, out=oc[span[0]:span[1]])
        ch = bot > top  # bottom row wins only when strictly greater
        cw_top, cw_bot = cw[:, 0::2], cw[:, 1::2]
        dj = cw_top ^ (ch & (cw_top ^ cw_bot))  # the winning row's column choice (no slow where)
        cc = code[span[0]:span[1]]
        xp.left_shift(ch.view(xp.uint8), 1, out=cc)
        cc |= dj.view(xp.uint8)

    mod = _native.module(x.dtype) if xp is np and x.dtype == np.float32 else None
    if mod is not None and x.transpose(1, 2, 3, 0).flags.c_contiguous:
        src = x.transpose(1, 2, 3, 0)  # the whole (C, H, W, N) array, odd edges included
        dims = (C, src.shape[1], src.shape[2], N, oh, ow)
        it = x.itemsize
        strides = tuple(st // it for st in out.strides)
        split_pass(lambda s: mod.maxpool2x2(src, out, code, dims, strides, s[0], s[1], it),
                   C, x.size)
        return out, code
    if xp is np:
        split_pass(channels, C, x.size)
    else:
        channels((0, C))
    return out, code


_PLANES = np.arange(4, dtype=np.uint8).reshape(2, 2, 1, 1, 1, 1)


def maxpool2x2_backward(gout: Any, code: Any, xshape: tuple) -> Any:
    """Input gradient, laid out (C, H, W, N), of :func:`maxpool2x2_forward`: one broadcast write.

    The input gradient is viewed as 4 planes (one per window position, each shaped like the
    output); ``code == plane`` broadcasts the winner mask over them and one multiply writes
    every plane, with long contiguous inner loops (no scatter, no window-sized temporaries).
    Big gradients are shared out across threads by channel (:func:`split_pass`).
    """
    xp = xp_of(gout)
    N, C, H, W = xshape
    oh, ow = code.shape[1], code.shape[2]
    gin = empty(xp, (C, H, W, N), gout.dtype)
    if H != 2 * oh:
        gin[:, 2 * oh:] = 0
    if W != 2 * ow:
        gin[:, :, 2 * ow:] = 0
    planes = gin[:, :2 * oh, :2 * ow].reshape(C, oh, 2, ow, 2, N).transpose(2, 4, 0, 1, 3, 5)
    ref = _PLANES if xp is np else xp.asarray(_PLANES)
    gc = gout.transpose(1, 2, 3, 0)

    def channels(span: tuple) -> None:
        c0, c1 = span
        xp.multiply(xp.ascontiguousarray(gc[c0:c1]), code[c0:c1] == ref,
                    out=planes[:, :, c0:c1])

    mod = _native.module(gout.dtype) if xp is np else None
    if mod is not None and gout.dtype == gin.dtype:
        base = _contiguous_base(gout)
        if base is not None:
            it = gout.itemsize
            strides = tuple(st // it for st in gout.strides)
            dims = (C, H, W, N, oh, ow)
            split_pass(lambda s: mod.maxpool2x2_backward(base, strides, code, gin, dims, s[0],
                                                         s[1], it), C, 4 * gout.size)
            return gin
    if xp is np:
        split_pass(channels, C, 4 * gout.size)
    else:
        channels((0, C))
    return gin


def _contiguous_base(a: Any) -> Any:
    """``a`` laid out as one C-contiguous block in some axis order, as that block (a view to
    hand to C with ``a``'s own strides), or None."""
    if any(st < 0 for st in a.strides):
        return None
    t = a.transpose(memory_order(a))
    return t if t.flags.c_contiguous else None


def _lowest(dtype: Any) -> Any:
    return -np.inf if np.dtype(dtype).kind == "f" else np.iinfo(dtype).min


def pool_windows(x: Any, k: tuple, s: tuple, p: tuple, d: tuple, out_hw: tuple,
                 fill: Any) -> tuple:
    """Copy the pooling windows of NCHW ``x`` into (C, N, OH, OW, kh*kw); also the padded shape.

    The padded grid is extended (with ``fill``) far enough to hold every window, ceil_mode's
    partial last windows included.
    """
    xp = xp_of(x)
    N, C, H, W = x.shape
    oh, ow = out_hw
    hp = max(H + 2 * p[0], (oh - 1) * s[0] + d[0] * (k[0] - 1) + 1)
    wp = max(W + 2 * p[1], (ow - 1) * s[1] + d[1] * (k[1] - 1) + 1)
    src = xp.full((C, N, hp, wp), fill, dtype=x.dtype)
    src[:, :, p[0]:p[0] + H, p[1]:p[1] + W] = x.transpose(1, 0, 2, 3)
    sC, sN, sH, sW = src.strides
    win = _as_strided(xp, src, (C, N, oh, ow, k[0], k[1]),
                      (sC, sN, sH * s[0], sW * s[1], sH * d[0], sW * d[1]))
    return win.reshape(C, N, oh, ow, k[0] * k[1]), (hp, wp)


def window_flat_index(shape_cnhw: tuple, k: tuple, s: tuple, d: tuple, hpwp: tuple,
                      tap: Any, xp: Any) -> Any:
    """Flat index into the padded (C, N, hp, wp) grid of window element ``tap`` (kh*kw code)."""
    C, N, oh, ow = shape_cnhw
    hp, wp = hpwp
    base_c = xp.arange(C * N, dtype=xp.int64).reshape(C, N, 1, 1) * (hp * wp)
    base_h = (xp.arange(oh, dtype=xp.int64) * (s[0] * wp)).reshape(1, 1, oh, 1)
    base_w = (xp.arange(ow, dtype=xp.int64) * s[1]).reshape(1, 1, 1, ow)
    tap = tap.astype(xp.int64, copy=False)
    return base_c + base_h + base_w + (tap // k[1]) * (d[0] * wp) + (tap % k[1]) * d[1]


def maxpool_generic_forward(x: Any, k: tuple, s: tuple, p: tuple, d: tuple,
                            out_hw: tuple) -> tuple:
    """Any-geometry max pool of NCHW ``x``: ``(out_nchw, flat_idx_cnhw, padded_hw)``."""
    xp = xp_of(x)
    win, hpwp = pool_windows(x, k, s, p, d, out_hw, _lowest(x.dtype))
    arg = win.argmax(axis=-1)  # first maximum on ties, as torch
    val = xp.take_along_axis(win, arg[..., None], axis=-1)[..., 0]
    out = xp.ascontiguousarray(val.transpose(1, 0, 2, 3))
    idx = window_flat_index(val.shape, k, s, d, hpwp, arg, xp)
    return out, idx, hpwp


def scatter_to_input(gvals: Any, idx: Any, xshape: tuple, p: tuple, hpwp: tuple) -> Any:
    """Sum ``gvals`` into a padded (C, N, hp, wp) grid at ``idx``; return the (C, N, H, W) crop."""
    xp = xp_of(gvals)
    N, C, H, W = xshape
    hp, wp = hpwp
    size = C * N * hp * wp
    if _determinism.in_force_on(gvals):  # a weighted bincount adds with atomics on a GPU
        acc = xp.zeros(size, dtype=gvals.dtype)
        _determinism.add_at(acc, idx.ravel(), gvals.ravel())
    else:
        acc = xp.bincount(idx.ravel(), weights=gvals.ravel(), minlength=size)
    grid = acc.astype(gvals.dtype, copy=False).reshape(C, N, hp, wp)
    return grid[:, :, p[0]:p[0] + H, p[1]:p[1] + W]


def indices_from_flat(idx: Any, hpwp: tuple, p: tuple, W: int) -> Any:
    """Torch's ``return_indices``: per-plane flat index ``h * W + w`` in the unpadded input."""
    hp, wp = hpwp
    rem = idx % (hp * wp)
    h = rem // wp - p[0]
    w = rem % wp - p[1]
    return (h * W + w).transpose(1, 0, 2, 3)
