"""Array-level kernels of the convolution family: N-d convolution and transposed convolution.

Three primitives per geometry make the whole family (1-, 2- and 3-D, plain and transposed):

- :func:`conv_forward` ``y = W ⋆ x``: an im2col gather and one matrix product per group;
- :func:`conv_input_grad` ``dx = Wᵀ ⋆ᵀ dy``: one product per group, then col2im;
- :func:`conv_weight_grad` ``dW = dy · colsᵀ``.

A transposed convolution is the adjoint of the convolution with the same weight and geometry
(its input and output swapped), so it is built from the same three and no kernel of its own:
its forward is :func:`conv_input_grad` of its input, its input gradient is
:func:`conv_forward` of its output gradient, and its weight gradient is
:func:`conv_weight_grad` with the roles of input and output gradient exchanged.

Activations are laid out as conv2d's are (:mod:`mpitensor.nn._kernels`): channels first and
the batch innermost in memory, ``(C, *spatial, N)``, returned to callers as an NC... view.
One- and two-dimensional geometries run on conv2d's tuned kernels (bands, compiled loops,
Winograd; a 1-D convolution is a 2-D one of height 1); other dimensionalities on the generic
kernels here, whose gather is a strided window view of the zero-padded source (the index
arithmetic done by the strides, so there is no index array to build or cache), copied into
the ``cols`` matrix a slab of the first output dimension at a time (:data:`SLAB_BYTES`), each
slab multiplied while in cache. Everything takes its array module from its inputs (NumPy or
CuPy).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from typing import Any, Callable, Optional

import numpy as np

from mpitensor._base.workspace import empty, xp_of, zeros

from .. import _kernels as K
from . import native as _native

__all__: list = []  # private module: used by mpitensor.nn.functional


class Geom:
    """Sizes of one N-d convolution: input (N, C, *S), weight (O, C/G, *k), stride, padding
    ((before, after) per dimension), dilation, groups, and the padded and output sizes."""

    __slots__ = ("nd", "N", "C", "O", "G", "S", "k", "s", "p", "d", "Sp", "out", "k2")

    def __init__(self, xshape: tuple, wshape: tuple, stride: tuple, padding: tuple,
                 dilation: tuple, groups: int) -> None:
        self.nd = len(xshape) - 2
        self.N, self.C = xshape[0], xshape[1]
        self.S = tuple(xshape[2:])
        self.O = wshape[0]
        self.k = tuple(wshape[2:])
        self.s, self.p, self.d, self.G = tuple(stride), tuple(padding), tuple(dilation), groups
        self.Sp = tuple(n + lo + hi for n, (lo, hi) in zip(self.S, self.p))
        self.out = tuple((n - d * (k - 1) - 1) // s + 1
                         for n, k, s, d in zip(self.Sp, self.k, self.s, self.d))
        self.k2 = self._lift() if self.nd <= 2 else None

    def _lift(self) -> K.ConvGeom:
        """conv2d's geometry of this one (a 1-D convolution as height 1)."""
        one = 2 - self.nd
        S = (1,) * one + self.S
        k = (1,) * one + self.k
        p = ((0, 0),) * one + self.p
        return K.ConvGeom((self.N, self.C, *S), (self.O, self.C // self.G, *k),
                          (1,) * one + self.s, (*p[0], *p[1]), (1,) * one + self.d, self.G)


def _to4(a: Any, nd: int) -> Any:
    """An N C L array as N C 1 L (a view); 2-D arrays as they are."""
    return a if nd == 2 else a.reshape(a.shape[0], a.shape[1], 1, a.shape[2])


def _cs_n(a: Any, g: Geom) -> Any:
    """A (C, 1, L, N) array of conv2d's as (C, L, N) for a 1-D geometry."""
    return a if g.nd == 2 else a.reshape(a.shape[0], a.shape[2], a.shape[3])


def _source(xp: Any, x: Any, g: Geom) -> Any:
    """NC... ``x`` as its zero-padded (C, *Sp, N) copy."""
    nd = g.nd
    src = zeros(xp, (g.C, *g.Sp, g.N), x.dtype)
    inner = tuple(slice(lo, lo + n) for (lo, _), n in zip(g.p, g.S))
    src[(slice(None), *inner)] = x.transpose(1, *range(2, nd + 2), 0)
    return src


def _window(xp: Any, src: Any, g: Geom) -> Any:
    """The (C, *k, *out, N) view of ``src`` whose entry [c, i.., o.., n] is the input that
    kernel offset i meets at output position o."""
    st = src.strides
    sp = st[1:-1]
    shape = (g.C, *g.k, *g.out, g.N)
    strides = (st[0], *(s * d for s, d in zip(sp, g.d)), *(s * t for s, t in zip(sp, g.s)),
               st[-1])
    return xp.lib.stride_tricks.as_strided(src, shape=shape, strides=strides)


class Slabs:
    """What the generic forward keeps for the weight gradient when its im2col matrix was built a
    slab at a time: the padded source, from which the backward rebuilds the same slabs."""

    __slots__ = ("src", "step")

    def __init__(self, src: Any, step: int) -> None:
        self.src, self.step = src, step


def _slab_step(xp: Any, g: Geom, rows: int, itemsize: int) -> int:
    """Positions of the first output dimension per slab (all of them on CuPy, where a few big
    kernels beat many small ones)."""
    if xp is not np:
        return g.out[0]
    plane = math.prod(g.out[1:]) * g.N
    return max(1, SLAB_BYTES // max(1, rows * plane * itemsize))


def _slab_cols(xp: Any, win: Any, g: Geom, o0: int, o1: int, buf: Any) -> Any:
    """The (G, C/G * prod(k), columns) im2col matrix of output positions o0..o1 of the first
    dimension, copied from the window view into ``buf``."""
    plane = math.prod(g.out[1:]) * g.N
    cols = buf[:, :, :(o1 - o0) * plane]
    part = win[(slice(None),) * (1 + g.nd) + (slice(o0, o1),)]
    xp.copyto(cols.reshape(g.C, *g.k, o1 - o0, *g.out[1:], g.N), part)
    return cols


def _generic_forward(x: Any, w: Any, b: Optional[Any], g: Geom) -> tuple:
    """im2col and one product per group; past :data:`SLAB_BYTES` the matrix is built and
    multiplied a slab of the first output dimension at a time, in one cache-sized buffer, and
    the weight gradient rebuilds the slabs (:class:`Slabs`) instead of keeping a matrix
    ``prod(k)`` times the input's size."""
    xp = xp_of(x)
    G, Og = g.G, g.O // g.G
    Kg = (g.C // G) * math.prod(g.k)
    M = math.prod(g.out) * g.N
    plane = M // g.out[0]
    src = _source(xp, x, g)
    win = _window(xp, src, g)
    wmat = w.reshape(G, Og, Kg)
    out = empty(xp, (G, Og, M), x.dtype)
    step = _slab_step(xp, g, G * Kg, x.dtype.itemsize)
    buf = empty(xp, (G, Kg, min(step, g.out[0]) * plane), x.dtype)
    for o0 in range(0, g.out[0], step):
        o1 = min(o0 + step, g.out[0])
        xp.matmul(wmat, _slab_cols(xp, win, g, o0, o1, buf),
                  out=out[:, :, o0 * plane:o1 * plane])
    out = out.reshape(g.O, *g.out, g.N)
    if b is not None:
        out += b.reshape((g.O,) + (1,) * (g.nd + 1))
    saved = buf if step >= g.out[0] else Slabs(src, step)
    return out, (saved, wmat)


#: the generic input gradient's product is taken for a slab of the first output dimension at a
#: time, about this many bytes of it, so that its kernel-offset slices are added into the input
#: gradient while they are still in cache
SLAB_BYTES = 4 << 20


def _generic_input_grad(gc: Any, wmat: Any, g: Geom) -> Any:
    xp = xp_of(gc)
    G, Og = g.G, g.O // g.G
    kk = math.prod(g.k)
    Kg = (g.C // G) * kk
    plane = math.prod(g.out[1:]) * g.N  # columns per position of the first output dimension
    g3 = xp.ascontiguousarray(gc).reshape(G, Og, g.out[0], plane)
    wt = wmat.transpose(0, 2, 1)
    step = max(1, SLAB_BYTES // max(1, G * Kg * plane * gc.itemsize)) if xp is np else g.out[0]
    buf = empty(xp, (G, Kg, min(step, g.out[0]) * plane), gc.dtype)
    dx = zeros(xp, (g.C, *g.Sp, g.N), gc.dtype)
    offsets = list(itertools.product(*(range(k) for k in g.k)))
    for o0 in range(0, g.out[0], step):
        o1 = min(o0 + step, g.out[0])
        d = buf[:, :, :(o1 - o0) * plane]
        xp.matmul(wt, g3[:, :, o0:o1].reshape(G, Og, -1), out=d)
        d = d.reshape(g.C, kk, o1 - o0, *g.out[1:], g.N)
        for j, off in enumerate(offsets):
            first = slice(off[0] * g.d[0] + o0 * g.s[0],
                          off[0] * g.d[0] + (o1 - 1) * g.s[0] + 1, g.s[0])
            rest = tuple(slice(i * dd, i * dd + (o - 1) * s + 1, s)
                         for i, dd, o, s in zip(off[1:], g.d[1:], g.out[1:], g.s[1:]))
            t = dx[(slice(None), first, *rest)]
            xp.add(t, d[:, j], out=t)
    inner = tuple(slice(lo, lo + n) for (lo, _), n in zip(g.p, g.S))
    return dx[(slice(None), *inner)]


def _generic_weight_grad(gc: Any, cols: Any, g: Geom, has_bias: bool) -> tuple:
    xp = xp_of(gc)
    G, Og = g.G, g.O // g.G
    g3 = xp.ascontiguousarray(gc).reshape(G, Og, -1)
    if isinstance(cols, Slabs):
        plane = g3.shape[2] // g.out[0]
        win = _window(xp, cols.src, g)
        buf = empty(xp, (G, (g.C // G) * math.prod(g.k), cols.step * plane), gc.dtype)
        dw = xp.zeros((G, Og, buf.shape[1]), gc.dtype)
        for o0 in range(0, g.out[0], cols.step):
            o1 = min(o0 + cols.step, g.out[0])
            c = _slab_cols(xp, win, g, o0, o1, buf)
            dw += xp.matmul(g3[:, :, o0 * plane:o1 * plane], c.transpose(0, 2, 1))
        dw = dw.reshape(g.O, g.C // G, *g.k)
    else:
        dw = xp.matmul(g3, cols.transpose(0, 2, 1)).reshape(g.O, g.C // G, *g.k)
    db = g3.sum(axis=2).reshape(g.O) if has_bias else None
    return dw, db


def _compiled(a: Any, g: Geom) -> bool:
    """Whether conv2d's compiled loops can take this gradient's bands (they release the
    interpreter lock, so sharing them over threads pays sooner: ``Threads``)."""
    return type(a) is np.ndarray and g.G == 1 and _native.get(a.dtype) is not None


def _no_threads(geom: K.ConvGeom, compiled: bool) -> Any:
    return contextlib.nullcontext()


#: ``threads(geom2d, compiled)``: the thread context a call on conv2d's kernels runs in
#: (``nn._functional.conv._conv_threads``, handed in by the caller, which owns that policy)
Threads = Callable[[K.ConvGeom, bool], Any]


def conv_forward(x: Any, w: Any, b: Optional[Any], g: Geom,
                 threads: Threads = _no_threads) -> tuple:
    """Convolve NC... ``x`` with ``w``; return ``(out, saved)``, ``out`` laid out
    (O, *out, N) and ``saved`` what the two gradients below need."""
    if g.k2 is not None:
        x4, w4 = _to4(x, g.nd), _to4(w, g.nd)
        with threads(g.k2, K.native_applies(x4, g.k2, b is not None)):
            out, cols, wmat = K.conv2d_forward(x4, w4, b, g.k2)
        return _cs_n(out, g), (cols, wmat)
    return _generic_forward(x, w, b, g)


def conv_input_grad(gc: Any, saved: tuple, g: Geom, threads: Threads = _no_threads) -> Any:
    """The input gradient, laid out (C, *S, N), from the output gradient ``gc`` laid out
    (O, *out, N)."""
    wmat = saved[1]
    if g.k2 is not None:
        gc4 = gc if g.nd == 2 else gc.reshape(gc.shape[0], 1, *gc.shape[1:])
        with threads(g.k2, _compiled(gc, g) and not isinstance(wmat, K.Winograd)):
            return _cs_n(K.conv2d_input_grad(gc4, wmat, g.k2), g)
    return _generic_input_grad(gc, wmat, g)


def conv_weight_grad(gc: Any, saved: tuple, g: Geom, has_bias: bool,
                     threads: Threads = _no_threads) -> tuple:
    """``(dw, db)`` (db None without a bias) from the output gradient (O, *out, N)."""
    cols = saved[0]
    if g.k2 is not None:
        gc4 = gc if g.nd == 2 else gc.reshape(gc.shape[0], 1, *gc.shape[1:])
        with threads(g.k2, _compiled(gc, g) and isinstance(cols, K.Banded)):
            dw, db = K.conv2d_weight_grad(gc4, cols, g.k2, has_bias)
        if db is None and has_bias:
            db = gc.sum(axis=tuple(range(1, gc.ndim)))
        return dw.reshape(g.O, g.C // g.G, *g.k), db
    return _generic_weight_grad(gc, cols, g, has_bias)


def weight_matrix(w: Any, g: Geom) -> Any:
    """The (G, O/G, C/G * prod(k)) matrix of ``w`` that :func:`conv_input_grad` takes."""
    return w.reshape(g.G, g.O // g.G, -1)


def adjoint_geometry(xshape: tuple, wshape: tuple, stride: tuple, padding: tuple,
                     output_padding: tuple, dilation: tuple, groups: int) -> Geom:
    """The convolution whose input gradient is the transposed convolution of an input of
    shape ``xshape`` with weight ``wshape`` (C_in, C_out/G, *k).

    Its input is the transposed convolution's output, (N, C_out, *T), and its weight the same
    array read as (O = C_in, C/G = C_out/G, *k). Its output has the transposed input's sizes,
    or one more along a dimension whose ``output_padding`` reaches the stride (allowed when
    the dilation is bigger); that extra position meets zeros (:func:`pad_to`).
    """
    T = tuple((n - 1) * s - 2 * p + d * (k - 1) + op + 1
              for n, s, p, d, k, op in zip(xshape[2:], stride, padding, dilation, wshape[2:],
                                           output_padding))
    return Geom((xshape[0], wshape[1] * groups, *T), tuple(wshape), stride,
                tuple((p, p) for p in padding), dilation, groups)


def pad_to(a: Any, sizes: tuple) -> Any:
    """(C, *S, N) ``a`` zero-extended at the end of each spatial dimension to ``sizes``."""
    if tuple(a.shape[1:-1]) == tuple(sizes):
        return a
    xp = xp_of(a)
    out = xp.zeros((a.shape[0], *sizes, a.shape[-1]), a.dtype)
    out[(slice(None), *(slice(0, n) for n in a.shape[1:-1]))] = a
    return out


def contiguous(a: Any, add: Optional[Any] = None) -> Any:
    """``a`` (plus ``add``, broadcast) as a C-contiguous array in a recycled buffer; ``a``
    itself when it already is one and there is nothing to add."""
    if add is None and a.flags.c_contiguous:
        return a
    xp = xp_of(a)
    out = empty(xp, a.shape, a.dtype)
    if add is None:
        xp.copyto(out, a)
    else:
        xp.add(a, add, out=out)
    return out


def crop_to(a: Any, sizes: tuple) -> Any:
    """(C, *S, N) ``a`` cut down to its first ``sizes`` spatial positions (a view)."""
    return a[(slice(None), *(slice(0, n) for n in sizes))]


# --------------------------------------------------------------------------------------------
# padding modes (reflect, replicate, circular) of N-d convolutions


def pad_index(n: int, before: int, after: int, mode: str) -> np.ndarray:
    """For each padded position along one axis, the input position it copies."""
    idx = np.arange(-before, n + after)
    if mode == "replicate":
        return np.clip(idx, 0, n - 1)
    if mode == "circular":
        return idx % n
    period = 2 * (n - 1)
    m = idx % period if period else np.zeros_like(idx)
    return np.where(m >= n, period - m, m)


def pad_forward(x: Any, pads: tuple, mode: str) -> tuple:
    """Pad the last ``len(pads)`` axes of ``x`` ((before, after) each) by ``mode``; return the
    padded array and the index maps its backward takes."""
    xp = xp_of(x)
    maps = []
    first = x.ndim - len(pads)
    for ax, (lo, hi) in enumerate(pads, start=first):
        idx = pad_index(x.shape[ax], lo, hi, mode)
        idx = idx if xp is np else xp.asarray(idx)
        maps.append((ax, idx, x.shape[ax]))
        x = xp.take(x, idx, axis=ax)
    return x, maps


def pad_backward(g: Any, maps: list) -> Any:
    """The gradient of :func:`pad_forward`: each axis's copies summed back, one small one-hot
    product per axis (the same on NumPy and CuPy)."""
    xp = xp_of(g)
    for ax, idx, n in reversed(maps):
        onehot = (idx[:, None] == xp.arange(n)[None, :]).astype(g.dtype)
        g = xp.moveaxis(xp.tensordot(g, onehot, axes=([ax], [0])), -1, ax)
    return g
