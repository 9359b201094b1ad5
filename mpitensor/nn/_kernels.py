"""Array-level kernels behind ``mpitensor.nn.functional``: convolution, pooling, softmax, losses.

Everything here works on raw NumPy or CuPy arrays (the module is taken from the inputs) and
knows nothing about Tensors or autograd. The layout choices are what make these fast on one CPU
core, so they are stated once here:

- **Convolutions keep activations channel-major in memory.** ``conv2d`` computes
  ``W (C_out, C_in*kh*kw) @ cols (C_in*kh*kw, N*OH*OW)`` with ONE BLAS call, so its result is
  laid out ``(C, N, H, W)``; it is returned as ``out.transpose(1, 0, 2, 3)``, a view with the
  NCHW shape every caller expects (values, indexing, ``reshape`` and ``flatten`` behave exactly as
  for a contiguous NCHW array). The next ``relu`` keeps that layout (ufuncs use ``order='K'``), the
  next pooling reads it through the same free transpose, and the gradient flowing back arrives in
  it, so the backward matmuls need no transposing copies either.
- **im2col is one strided copy.** ``cols`` is filled from an ``as_strided`` window view of the
  (padded) input; with the channel-major layout every copied run is a full output row.
- **The bias rides in the matmul**: ``cols`` gets a row of ones and the weight matrix a bias
  column, so the forward adds the bias and the weight-gradient matmul yields the bias gradient.
- **col2im has no loop**: the input gradient is computed on the full padded grid
  (``Y = W^T @ g_full``, ``g_full`` being the output gradient scattered onto that grid) and reduced
  with one ``sum`` over an ``as_strided`` view whose kernel axes step back by the kernel offsets.
  Reads that fall before an image's first row land, by construction, on zero entries of
  ``g_full`` (the grid rows/columns no output window starts on), so no bounds masks are needed.
- **2x2/stride-2 max pooling** (the common case) is two pairwise ``maximum`` passes on
  reshape-views; it keeps a small code array (which of the 4 positions won, first one on ties, as
  torch) and its backward is one broadcast multiply into the input-shaped gradient. Other
  pooling geometries use a strided window copy, ``argmax`` and a ``bincount`` scatter.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any, Optional

import numpy as np

from mpitensor import backend as _backend

__all__: list = []  # private module: used by mpitensor.nn.functional


class _Workspace:
    """Recycles large NumPy arrays once nothing but this cache refers to them.

    A training step allocates the same big arrays (im2col matrices, full-grid gradients,
    activations) every iteration. Fresh multi-megabyte allocations are page-faulted in again
    each time glibc has handed the previous ones back to the OS, which on one core costs about as
    much as the arithmetic. Buffers handed out here are views of cached 1-D byte arrays; a
    buffer is reused only when its reference count shows that no view of it is alive anywhere
    (saved for backward, wrapped in a Tensor, ...). CuPy arrays are never cached (CuPy has its
    own memory pool).
    """

    MIN_BYTES = 1 << 18  # small arrays come from NumPy's own cache just fine
    MAX_BUFFERS = 24

    def __init__(self) -> None:
        self._bufs: list = []
        self._lock = threading.Lock()
        probe = np.empty(1, np.uint8)
        self._bufs.append(probe)
        self._free_refs = self._count(0)  # the count of a buffer that only the cache holds
        self._bufs.clear()

    def _count(self, i: int) -> int:
        return sys.getrefcount(self._bufs[i])

    def empty(self, shape: tuple, dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array, recycled when a free one of that size exists."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.MIN_BYTES:
            return np.empty(shape, dtype)
        with self._lock:
            bufs = self._bufs
            for i in range(len(bufs)):
                if bufs[i].nbytes == nbytes and self._count(i) == self._free_refs:
                    return bufs[i].view(dtype).reshape(shape)
            if len(bufs) >= self.MAX_BUFFERS:  # forget the oldest free buffer
                for i in range(len(bufs)):
                    if self._count(i) == self._free_refs:
                        del bufs[i]
                        break
            buf = np.empty(nbytes, np.uint8)
            bufs.append(buf)
            return buf.view(dtype).reshape(shape)


_workspace = _Workspace()


def empty(xp: Any, shape: tuple, dtype: Any) -> Any:
    """``xp.empty`` that recycles large NumPy buffers (see :class:`_Workspace`)."""
    if xp is np:
        return _workspace.empty(tuple(shape), dtype)
    return xp.empty(shape, dtype=dtype)


def zeros(xp: Any, shape: tuple, dtype: Any) -> Any:
    """``xp.zeros`` on a recycled buffer."""
    out = empty(xp, shape, dtype)
    out.fill(0)
    return out


def empty_like(x: Any) -> Any:
    """An uninitialised array shaped like ``x`` with the same axis order in memory."""
    xp = xp_of(x)
    if x.flags.c_contiguous:
        return empty(xp, x.shape, x.dtype)
    order = sorted(range(x.ndim), key=lambda a: -abs(x.strides[a]))
    buf = empty(xp, tuple(x.shape[a] for a in order), x.dtype)
    return buf.transpose(tuple(int(i) for i in np.argsort(order)))


def xp_of(x: Any) -> Any:
    """The array module (numpy or cupy) of ``x``."""
    return np if isinstance(x, np.ndarray) else _backend.array_module(x)


def _as_strided(xp: Any, x: Any, shape: tuple, strides: tuple) -> Any:
    return xp.lib.stride_tricks.as_strided(x, shape=shape, strides=strides)


# --------------------------------------------------------------------------------------------
# conv2d


class ConvGeom:
    """Sizes of one conv2d call (input, kernel, stride, dilation, padding, groups, output)."""

    __slots__ = ("N", "C", "H", "W", "O", "kh", "kw", "sh", "sw", "dh", "dw",
                 "pt", "pb", "pl", "pr", "G", "OH", "OW", "Hp", "Wp")

    def __init__(self, xshape: tuple, wshape: tuple, stride: tuple, padding: tuple,
                 dilation: tuple, groups: int) -> None:
        self.N, self.C, self.H, self.W = xshape
        self.O, _, self.kh, self.kw = wshape
        self.sh, self.sw = stride
        self.dh, self.dw = dilation
        self.pt, self.pb, self.pl, self.pr = padding
        self.G = groups
        self.Hp = self.H + self.pt + self.pb
        self.Wp = self.W + self.pl + self.pr
        self.OH = (self.Hp - self.dh * (self.kh - 1) - 1) // self.sh + 1
        self.OW = (self.Wp - self.dw * (self.kw - 1) - 1) // self.sw + 1


def _padded_cnhw(xp: Any, xc: Any, g: ConvGeom, fill: float = 0.0) -> Any:
    """``xc`` (C, N, H, W) padded to (C, N, Hp, Wp) with ``fill`` (no copy when no padding)."""
    if not (g.pt or g.pb or g.pl or g.pr):
        return xc
    out = empty(xp, (xc.shape[0], xc.shape[1], g.Hp, g.Wp), xc.dtype)
    out.fill(fill)  # a full memset is cheaper than four border slices for small images
    out[:, :, g.pt:g.pt + g.H, g.pl:g.pl + g.W] = xc
    return out


def conv2d_forward(x: Any, w: Any, b: Optional[Any], g: ConvGeom) -> tuple:
    """Convolve NCHW ``x`` with OIHW ``w``; return ``(out_cnhw, cols, wmat)``.

    ``out_cnhw`` has shape (O, N, OH, OW) (transpose(1, 0, 2, 3) gives NCHW); ``cols`` is the
    (G, Kg[+1], N*OH*OW) im2col matrix (last row ones when there is a bias), ``wmat`` the
    (G, Og, Kg) weight matrix, both kept for the backward pass.
    """
    xp = xp_of(x)
    G, Cg, Og = g.G, g.C // g.G, g.O // g.G
    Kg = Cg * g.kh * g.kw
    M = g.N * g.OH * g.OW
    src = _padded_cnhw(xp, x.transpose(1, 0, 2, 3), g)
    sC, sN, sH, sW = src.strides
    win = _as_strided(xp, src, (g.C, g.kh, g.kw, g.N, g.OH, g.OW),
                      (sC, sH * g.dh, sW * g.dw, sN, sH * g.sh, sW * g.sw))
    rows = Kg + 1 if b is not None else Kg
    cols = empty(xp, (G, rows, M), x.dtype)
    xp.copyto(cols[:, :Kg].reshape(G, Cg, g.kh, g.kw, g.N, g.OH, g.OW),
              win.reshape(G, Cg, g.kh, g.kw, g.N, g.OH, g.OW))
    wmat = w.reshape(G, Og, Kg)
    if b is not None:
        cols[:, Kg] = 1
        wext = xp.concatenate([wmat, b.reshape(G, Og, 1).astype(w.dtype, copy=False)], axis=2)
    else:
        wext = wmat
    out = empty(xp, (G, Og, M), x.dtype)
    xp.matmul(wext, cols, out=out)
    return out.reshape(g.O, g.N, g.OH, g.OW), cols, wmat


def conv2d_backward_weight(gc: Any, cols: Any, g: ConvGeom, has_bias: bool) -> tuple:
    """Weight (and bias) gradient from the output gradient ``gc`` laid out (O, N, OH, OW)."""
    xp = xp_of(gc)
    G, Og = g.G, g.O // g.G
    Kg = (g.C // G) * g.kh * g.kw
    g2 = xp.ascontiguousarray(gc).reshape(G, Og, -1)
    if G == 1:
        dwe = (g2[0] @ cols[0].T)[None]
    else:
        dwe = xp.matmul(g2, cols.transpose(0, 2, 1))
    dw = dwe[:, :, :Kg].reshape(g.O, g.C // G, g.kh, g.kw)
    db = dwe[:, :, Kg].reshape(g.O) if has_bias else None
    return dw, db


def conv2d_backward_bias(gc: Any) -> Any:
    """Bias gradient alone: the output gradient summed over batch and space."""
    return gc.sum(axis=(1, 2, 3))


def conv2d_backward_input(gc: Any, wmat: Any, g: ConvGeom) -> Any:
    """Input gradient (C, N, H, W) from ``gc`` (O, N, OH, OW), without a loop (see module doc)."""
    xp = xp_of(gc)
    G, Og = g.G, g.O // g.G
    Kg = (g.C // G) * g.kh * g.kw
    Q = g.N * g.Hp * g.Wp
    gfull = zeros(xp, (g.O, g.N, g.Hp, g.Wp), gc.dtype)
    gfull[:, :, 0:(g.OH - 1) * g.sh + 1:g.sh, 0:(g.OW - 1) * g.sw + 1:g.sw] = gc
    gq = gfull.reshape(G, Og, Q)
    y = empty(xp, (G, Kg, Q), gc.dtype)
    xp.matmul(wmat.transpose(0, 2, 1), gq, out=y)
    y = y.reshape(G * Kg, Q)
    it = y.itemsize
    kk = g.kh * g.kw
    # y[(c, i, j), q] holds the contribution of the output at grid position q to the input at
    # q + i*dh*Wp + j*dw; reading row (c, i, j) shifted back by that offset lines all 25 (or
    # kh*kw) contributions of one input position up on the same column.
    r = _as_strided(xp, y, (g.C, g.kh, g.kw, Q),
                    (kk * Q * it, (g.kw * Q - g.dh * g.Wp) * it, (Q - g.dw) * it, it))
    z = r.sum(axis=(1, 2)).reshape(g.C, g.N, g.Hp, g.Wp)
    return z[:, :, g.pt:g.pt + g.H, g.pl:g.pl + g.W]


# --------------------------------------------------------------------------------------------
# max_pool2d / avg_pool2d


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

    ``code`` (C, N, oh, ow) uint8 says which of the window's 4 elements won (row-major index,
    the first one on ties, as torch). The output is C-contiguous NCHW so that ``view`` works.
    """
    xp = xp_of(x)
    N, C = x.shape[0], x.shape[1]
    xc = x.transpose(1, 0, 2, 3)[:, :, :2 * oh, :2 * ow]
    a, b = xc[:, :, :, 0::2], xc[:, :, :, 1::2]
    mw = xp.maximum(a, b)
    cw = b > a  # right column wins only when strictly greater: first max on ties
    top, bot = mw[:, :, 0::2], mw[:, :, 1::2]
    out = empty(xp, (N, C, oh, ow), x.dtype)
    xp.maximum(top, bot, out=out.transpose(1, 0, 2, 3))
    ch = bot > top  # bottom row wins only when strictly greater
    cw_top, cw_bot = cw[:, :, 0::2], cw[:, :, 1::2]
    dj = cw_top ^ (ch & (cw_top ^ cw_bot))  # the winning row's column choice (no slow where)
    code = ch.view(xp.uint8) << 1
    code |= dj.view(xp.uint8)
    return out, code


def maxpool2x2_backward(gout: Any, code: Any, xshape: tuple) -> Any:
    """Input gradient (C, N, H, W) of :func:`maxpool2x2_forward`.

    Each pooled gradient goes to one input element, so the flat position of every window's
    winner (its top-left corner plus the code's offset, via a 4-entry lookup table) takes a
    single scatter into a zeroed array; no window-shaped temporaries with tiny inner loops.
    """
    xp = xp_of(gout)
    N, C, H, W = xshape
    oh, ow = code.shape[2], code.shape[3]
    corner = ((xp.arange(C * N, dtype=xp.int64) * (H * W)).reshape(C * N, 1, 1)
              + (xp.arange(oh, dtype=xp.int64) * (2 * W)).reshape(1, oh, 1)
              + xp.arange(0, 2 * ow, 2, dtype=xp.int64).reshape(1, 1, ow))
    offset = xp.asarray(np.array([0, 1, W, W + 1], dtype=np.int64))
    flat = corner.reshape(code.shape) + offset[code]
    gin = zeros(xp, (C * N * H * W,), gout.dtype)
    gin[flat.ravel()] = gout.transpose(1, 0, 2, 3).ravel()
    return gin.reshape(C, N, H, W)


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


# --------------------------------------------------------------------------------------------
# softmax family


def log_softmax(x: Any, dim: int) -> Any:
    """Numerically stable log-softmax along ``dim`` (same dtype as ``x``)."""
    xp = xp_of(x)
    m = x.max(axis=dim, keepdims=True)
    if x.dtype.kind == "f":
        m = xp.where(xp.isfinite(m), m, 0)  # rows of -inf/inf must not turn into nan here
    z = x - m
    lse = xp.log(xp.exp(z).sum(axis=dim, keepdims=True))
    z -= lse
    return z


def softmax(x: Any, dim: int) -> Any:
    """Numerically stable softmax along ``dim``."""
    xp = xp_of(x)
    m = x.max(axis=dim, keepdims=True)
    if x.dtype.kind == "f":
        m = xp.where(xp.isfinite(m), m, 0)
    e = xp.exp(x - m)
    e /= e.sum(axis=dim, keepdims=True)
    return e


def prod(shape: tuple) -> int:
    """Number of elements of ``shape``."""
    return math.prod(shape)
