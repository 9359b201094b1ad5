"""Array-level kernels behind ``mpitensor.nn.functional``: convolution, pooling, softmax, losses.

Everything here works on raw NumPy or CuPy arrays (the module is taken from the inputs) and
knows nothing about Tensors or autograd. The layout choices are what make these fast on one CPU
core, so they are stated once here:

- **conv2d keeps activations batch-innermost in memory.** It computes
  ``W (C_out, C_in*kh*kw) @ cols (C_in*kh*kw, OH*OW*N)`` as one matrix product (in bands and
  blocks, below), so its result is laid out ``(C, H, W, N)``; it is returned as
  ``out.transpose(3, 0, 1, 2)``, a view with the NCHW shape every caller expects (values,
  indexing, ``reshape`` and ``flatten`` behave exactly as for a contiguous NCHW array, like
  torch's ``channels_last`` tensors do). The next ``relu`` keeps that layout, the next pooling
  reads it through the same free transpose, and the gradient flowing back arrives in it, so
  the backward matmuls need no transposing copies.
- **im2col is one strided copy with long runs** (per band, below). ``cols`` is filled from an
  ``as_strided`` window view of the (padded) ``(C, Hp, Wp, N)`` input; with the batch
  innermost, each copied run is a stretch of ``N`` or more floats (a whole ``OW * N`` one in a
  band of whole rows: 640 floats for LeNet's conv2 at batch 64, against 10 in NCHW).
- **The bias rides in the matmul**: ``cols`` gets a row of ones and the weight matrix a bias
  column, so the forward adds the bias and the weight-gradient matmul yields the bias gradient.
- **The input gradient is col2im, band by band** (NumPy): ``D = W^T @ g`` for a band of output
  pixels, then each of D's kh*kw kernel-offset slices is added into the padded input gradient,
  shifted by its offset, with one strided ``+=`` (in a band of one output row, the kh offsets of
  a kernel column land on different input rows and go in one add). On CuPy, where a few big
  kernels beat many small ones, it has no loop: the gradient is computed on the full padded
  grid (``Y = W^T @ g_full``, ``g_full`` being the output gradient scattered onto that grid) and
  reduced with one ``sum`` over an ``as_strided`` view whose kernel axes step back by the kernel
  offsets; reads that fall before a row of the grid land, by construction, on zero entries of
  ``g_full``, so no bounds masks are needed. On the CPU that does twice the multiply-adds and
  sums a padded grid 4x the size of D: LeNet's conv2 input gradient took 1.5x (batch 64) to
  2.5x (batch 256) longer.
- **Big im2col matrices are never written out whole** (NumPy): past :data:`BAND_BYTES`
  (1 MiB), conv2d builds the matrix a band of output pixels at a time (whole rows, or part of
  a row; at most :data:`BAND_COLUMNS` columns) in one cache-sized buffer, multiplies each band
  at once, and the weight gradient rebuilds the bands from the small padded source, instead of
  4-20 MB matrices written to memory and read back later. LeNet at batch 64
  (``benchmarks/conv_bands.py``): a training step 5-20 % faster alone and 15-20 % faster with
  two processes training at once, which share the memory bus and the last-level cache.
- **Thin products go to the BLAS in small blocks** (NumPy): a band's ``W @ cols`` (16 x 151 by
  1 280 columns, say) is one batched ``matmul`` over column blocks of at most
  :data:`SMALL_GEMM` multiply-adds, which OpenBLAS runs with its small-matrix kernels (no
  packing: about 1.5x the speed of one call on these shapes; they also run on one thread, where
  a threaded call on so little work cost more than it saved). The weight gradient is taken as
  ``cols @ g^T`` (1.6x faster than ``g @ cols^T`` in OpenBLAS), in blocks too.
- **Wide 3x3 stride-1 layers use Winograd's F(2x2, 3x3)** (NumPy, both channel counts at
  least :data:`WINOGRAD_MIN_CHANNELS`): 16 products ``U[k] @ V[k]`` of transformed filters and
  inputs replace the im2col product, 2.25x fewer multiply-adds; the input gradient is the same
  computation on the output gradient (the flipped filter's transform is ``U`` reindexed) and
  the weight gradient 16 products with the kept ``V``. ResNet-18 (CIFAR, batch 32) trained
  1.45x faster on one core: its convolutions had cost 1.5x torch's (oneDNN's kernels run at
  110-140 GFLOP/s here, OpenBLAS's at 60-100), they now cost slightly less. Results agree with
  the im2col ones to rounding (float32 relative errors of a few 1e-7).
- **Big layers share their work out over the BLAS threads themselves**
  (``_parallel.run_split``): bands of Winograd tiles or of im2col output pixels, input or output
  channels, one share per thread, each on a one-thread BLAS, so that the copies and transforms
  around the products run in parallel too and the threads meet once per call (see
  ``mpitensor._base.parallel``).
- **The banded loops run in C where they can** (``_cpu_kernels.c``, see
  :mod:`mpitensor.nn._kernels.native`): the same bands, the same products (CBLAS ``?gemm`` from the
  BLAS NumPy loaded), but each thread's share is one call that releases the interpreter lock
  for all of it. Written as NumPy calls, the bands handed the lock between the threads at
  every call, and LeNet's convolutions ran slower on two threads than on one; in C its
  training step gained 1.2x (batch 64) and 1.5x (batch 256) from the second thread, and
  10-15 % on one thread (no Python per band). The NumPy loops remain for everything else
  (groups, CuPy, no compiler at install, ``MPITENSOR_NATIVE=0``).
- **2x2/stride-2 max pooling** (the common case) is two pairwise ``maximum`` passes on strided
  views; it keeps a small code array (which of the 4 positions won, the first one on ties, as
  torch) and its backward is one broadcast multiply into the 4 planes of the input gradient.
  Other pooling geometries use a strided window copy, ``argmax`` and a ``bincount`` scatter.
- **Big buffers are recycled** (``mpitensor._base.workspace``, NumPy only): a training step
  allocates the same multi-megabyte arrays every iteration, and page-faulting them in again
  cost as much as the arithmetic.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import numpy as np

from mpitensor._base import config as _config
from mpitensor._base.parallel import blas_threads, run_split, split_ranges
from mpitensor._base.workspace import (  # noqa: F401 - relu_into and zeros are nn.functional's
    _inverse,
    empty,
    empty_like,
    memory_order,
    relu_into,
    xp_of,
    zeros,
)
from mpitensor.nn._kernels import native as _native

from .pool2d import (  # noqa: F401 - nn.functional calls them as K.<name>
    _as_strided,
    indices_from_flat,
    maxpool2x2_backward,
    maxpool2x2_forward,
    maxpool_generic_forward,
    pool_out_size,
    pool_windows,
    scatter_to_input,
    window_flat_index,
)

__all__: list = []  # private module: used by mpitensor.nn.functional


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


def _chwn_source(xp: Any, x: Any, g: ConvGeom) -> Any:
    """NCHW ``x`` as a (C, Hp, Wp, N) array: zero-padded, batch innermost.

    No copy when ``x`` already is such an array without padding (the output of conv2d/relu);
    otherwise one copy, which also turns an NCHW-contiguous input around so that every im2col
    run below is a whole ``OW * N`` stretch of memory.
    """
    xc = x.transpose(1, 2, 3, 0)
    if not (g.pt or g.pb or g.pl or g.pr) and xc.flags.c_contiguous:
        return xc
    src = empty(xp, (g.C, g.Hp, g.Wp, g.N), x.dtype)
    if g.pt or g.pb or g.pl or g.pr:
        src.fill(0)  # one memset is cheaper than four border slices for small images
    src[:, g.pt:g.pt + g.H, g.pl:g.pl + g.W] = xc
    return src


#: im2col matrices larger than this are built band by band (pieces of the output), each band
#: multiplied as soon as it is built and rebuilt for the weight gradient (see conv2d_forward)
#: (``MPITENSOR_CONV_BAND_BYTES`` overrides it; a size near the per-core L2 cache is best)
BAND_BYTES = _config.conv_band_bytes()

#: ... and an im2col band is at most this many columns wide: a band and the BLAS's work on it
#: stay in the core's cache (LeNet's conv1, whose 26-row matrix makes 1 MiB bands 10 000 columns
#: wide, ran its forward and weight gradient 1.25x faster in bands of 1 792 columns)
BAND_COLUMNS = 2048

#: products of at most this many multiply-adds (M*N*K) take OpenBLAS's small-matrix kernels,
#: which skip packing the operands: conv2d's thin products ran 1.5x faster (about 52 against
#: 35 GMAC/s on one core) cut into blocks of this size than in one call
SMALL_GEMM = 1 << 20


@functools.lru_cache(maxsize=256)
def _block_width(width: int, mk: int) -> int:
    """Columns per block when ``(m, k) @ (k, width)`` is cut into equal blocks (``mk = m*k``):
    the largest divisor of ``width`` that keeps a block within :data:`SMALL_GEMM` (and within
    128..2048 columns), or ``width`` itself (one call) when no divisor comes close."""
    target = min(2048, max(128, SMALL_GEMM // max(1, mk)))
    if width <= target:
        return width
    for n in range(target, target // 2, -1):
        if width % n == 0:
            return n
    return width


def _col_blocks(a: Any, n: int) -> Any:
    """(rows, nb*n) with unit column stride -> (nb, rows, n) view, one block per column slab."""
    it = a.itemsize
    return _as_strided(np, a, (a.shape[1] // n, a.shape[0], n), (n * it, a.strides[0], it))


def _matmul_cols(a: Any, b: Any, out: Any) -> None:
    """``out = a @ b`` on NumPy 2-D arrays, as one batched call over blocks of b's columns."""
    n = _block_width(b.shape[1], a.shape[0] * a.shape[1])
    if n == b.shape[1]:
        np.matmul(a, b, out=out)
    else:
        np.matmul(a, _col_blocks(b, n), out=_col_blocks(out, n))


class Banded:
    """What conv2d keeps for the backward pass when it works band by band: the padded
    (C, Hp, Wp, N) source, from which each band's im2col block is rebuilt, and the bands."""

    __slots__ = ("src", "plan", "rows")

    def __init__(self, src: Any, plan: list, rows: int) -> None:
        self.src, self.plan, self.rows = src, plan, rows


def _window(xp: Any, src: Any, g: ConvGeom) -> Any:
    sC, sH, sW, sN = src.strides
    return _as_strided(xp, src, (g.C, g.kh, g.kw, g.OH, g.OW, g.N),
                       (sC, sH * g.dh, sW * g.dw, sH * g.sh, sW * g.sw, sN))


def _band_plan(g: ConvGeom, pixel_bytes: int, budget: int, columns: Optional[int]) -> list:
    """Split the output into bands of at most ``budget`` bytes and ``columns`` columns.

    ``pixel_bytes`` is the size of one output pixel's columns (all its ``N`` samples). A band
    is ``(y0, y1, x0, x1)``: whole output rows ``y0:y1`` (``x0, x1 = 0, OW``) or, when one row
    is already too big, columns ``x0:x1`` of row ``y0`` (the row split into equal parts).
    Either way its columns are one contiguous range of the (OH, OW, N) output. At least one
    pixel per band, whatever the limits.
    """
    per = budget // pixel_bytes
    if columns is not None:
        per = min(per, -(-columns // g.N))
    per = max(1, per)  # output pixels per band
    if per >= g.OW:
        rb = per // g.OW
        return [(y, min(g.OH, y + rb), 0, g.OW) for y in range(0, g.OH, rb)]
    parts = -(-g.OW // per)
    nx = -(-g.OW // parts)
    return [(y, y + 1, x, min(g.OW, x + nx)) for y in range(g.OH) for x in range(0, g.OW, nx)]


def _band_span(g: ConvGeom, band: tuple) -> tuple:
    """The band's column range ``(m0, m1)`` in the flattened (OH, OW, N) output."""
    y0, y1, x0, x1 = band
    return (y0 * g.OW + x0) * g.N, ((y1 - 1) * g.OW + x1) * g.N


def _band_cols(buf: Any, win: Any, g: ConvGeom, band: tuple, K: int) -> Any:
    """im2col block of ``band`` into ``buf`` (rows beyond ``K`` left as they are)."""
    y0, y1, x0, x1 = band
    cb = buf[:, :(y1 - y0) * (x1 - x0) * g.N]
    np.copyto(cb[:K].reshape(g.C, g.kh, g.kw, y1 - y0, x1 - x0, g.N),
              win[:, :, :, y0:y1, x0:x1])
    return cb


def _band_buffer(rows: int, plan: list, g: ConvGeom, dtype: Any, ones_row: int) -> Any:
    """An im2col buffer for the widest band, its bias row (``ones_row`` < ``rows``) all ones."""
    widest = max((y1 - y0) * (x1 - x0) for y0, y1, x0, x1 in plan) * g.N
    buf = empty(np, (rows, widest), dtype)
    if rows > ones_row:
        buf[ones_row] = 1
    return buf


def _native_geom(g: ConvGeom, rows: int) -> tuple:
    """The sizes the compiled loops take (:mod:`mpitensor.nn._kernels.native`), ``rows`` being the
    im2col rows (``C*kh*kw``, plus one for a bias)."""
    return (g.C, g.Hp, g.Wp, g.N, g.O, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.OH, g.OW, rows)


def _banded(g: ConvGeom, rows: int, itemsize: int) -> bool:
    """Whether conv2d's im2col matrix (``rows`` by the output's pixels) is built in bands."""
    return rows * g.N * itemsize * g.OH * g.OW > BAND_BYTES


def native_applies(x: Any, g: ConvGeom, has_bias: bool) -> bool:
    """Whether conv2d of ``x`` with geometry ``g`` runs its bands in the compiled loops
    (:func:`conv2d_forward`'s banded path, with :mod:`mpitensor.nn._kernels.native` available)."""
    return (type(x) is np.ndarray and g.G == 1 and not winograd_applies(x, g)
            and _native.get(x.dtype) is not None
            and _banded(g, g.C * g.kh * g.kw + has_bias, x.itemsize))


def conv2d_forward(x: Any, w: Any, b: Optional[Any], g: ConvGeom) -> tuple:
    """Convolve NCHW ``x`` with OIHW ``w``; return ``(out_chwn, cols, wmat)``.

    ``out_chwn`` has shape (O, OH, OW, N) (``transpose(3, 0, 1, 2)`` gives NCHW); ``cols`` is
    the (G, Kg[+1], OH*OW*N) im2col matrix (last row ones when there is a bias), ``wmat`` the
    (G, Og, Kg) weight matrix, both kept for the backward pass.

    On the CPU, an im2col matrix over :data:`BAND_BYTES` is not built whole: it is built for
    a band of the output at a time (:func:`_band_plan`) into a small buffer that stays in the
    core's cache, each band multiplied at once into its columns of the output (in blocks,
    :func:`_matmul_cols`), and ``cols`` is a :class:`Banded` record from which the weight
    gradient rebuilds the bands. Rebuilding costs a strided copy; writing the whole matrix to
    memory and reading it back later cost more, alone and when several processes share the
    memory bus (two data-parallel ranks on one machine).
    """
    if winograd_applies(x, g):
        out, rec = winograd_forward(x, w, b, g)
        return out, rec, rec
    xp = xp_of(x)
    G, Cg, Og = g.G, g.C // g.G, g.O // g.G
    Kg = Cg * g.kh * g.kw
    src = _chwn_source(xp, x, g)
    win = _window(xp, src, g)
    rows = Kg + 1 if b is not None else Kg
    pixel_bytes = rows * g.N * x.dtype.itemsize
    if xp is np and G == 1 and _banded(g, rows, x.dtype.itemsize):
        wmat = w.reshape(1, g.O, Kg)
        wext = wmat[0]
        if b is not None:
            wext = np.concatenate([wext, b.reshape(g.O, 1).astype(w.dtype, copy=False)], axis=1)
        out = empty(xp, (g.O, g.OH, g.OW, g.N), x.dtype)
        out2 = out.reshape(g.O, -1)
        plan = _band_plan(g, pixel_bytes, BAND_BYTES, BAND_COLUMNS)
        nat = _native.get(x.dtype)
        if nat is not None and src.flags.c_contiguous:  # the same bands, in C (_native)
            mod, gemm = nat
            wext = np.ascontiguousarray(wext)
            geom, bands_arr, it = _native_geom(g, rows), np.array(plan, np.int64), x.itemsize

            def native(span: tuple) -> None:
                buf = _band_buffer(rows, plan[span[0]:span[1]], g, x.dtype, Kg)
                mod.forward(src, wext, out2, geom, bands_arr, span[0], span[1], buf, gemm, it)

            run_split(native, split_ranges(len(plan), blas_threads()))
            return out, Banded(src, plan, rows), wmat

        def bands(span: tuple) -> None:  # a share of the bands, with its own im2col buffer
            mine = plan[span[0]:span[1]]
            buf = _band_buffer(rows, mine, g, x.dtype, Kg)
            for band in mine:
                m0, m1 = _band_span(g, band)
                _matmul_cols(wext, _band_cols(buf, win, g, band, Kg), out2[:, m0:m1])

        run_split(bands, split_ranges(len(plan), blas_threads()))
        return out, Banded(src, plan, rows), wmat
    M = g.OH * g.OW * g.N
    cols = empty(xp, (G, rows, M), x.dtype)
    xp.copyto(cols[:, :Kg].reshape(G, Cg, g.kh, g.kw, g.OH, g.OW, g.N),
              win.reshape(G, Cg, g.kh, g.kw, g.OH, g.OW, g.N))
    wmat = w.reshape(G, Og, Kg)
    if b is not None:
        cols[:, Kg] = 1
        wext = xp.concatenate([wmat, b.reshape(G, Og, 1).astype(w.dtype, copy=False)], axis=2)
    else:
        wext = wmat
    out = empty(xp, (G, Og, M), x.dtype)
    if xp is np and G == 1:  # several BLAS threads: a share of the columns each
        run_split(lambda s: np.matmul(wext[0], cols[0, :, s[0]:s[1]], out=out[0, :, s[0]:s[1]]),
                  split_ranges(M, blas_threads()))
    else:
        xp.matmul(wext, cols, out=out)
    return out.reshape(g.O, g.OH, g.OW, g.N), cols, wmat


def conv2d_backward(gc: Any, cols: Any, wmat: Any, g: ConvGeom, need: tuple,
                    has_bias: bool) -> tuple:
    """``(dx, dw, db)`` from the output gradient ``gc`` laid out (O, OH, OW, N).

    ``need`` says which of the input, weight and bias gradients to compute (the others are
    None); ``dx`` is laid out (C, H, W, N). ``cols`` and ``wmat`` are what
    :func:`conv2d_forward` returned.
    """
    need_x, need_w, need_b = need
    dx = dw = db = None
    if need_w:
        dw, db = conv2d_weight_grad(gc, cols, g, has_bias)
        db = db if need_b else None
    elif need_b:
        db = gc.sum(axis=(1, 2, 3))  # the output gradient summed over space and batch
    if need_x:
        dx = conv2d_input_grad(gc, wmat, g)
    return dx, dw, db


def conv2d_weight_grad(gc: Any, cols: Any, g: ConvGeom, has_bias: bool) -> tuple:
    """``(dw, db)`` (db None without a bias) from the output gradient and the saved ``cols``."""
    if isinstance(cols, Winograd):
        return _winograd_weight_grad(gc, cols, g, has_bias)
    if isinstance(cols, Banded):
        return _banded_weight_grad(gc, cols, g)
    return _weight_grad_whole(gc, cols, g, has_bias)


def conv2d_input_grad(gc: Any, wmat: Any, g: ConvGeom) -> Any:
    """The input gradient, laid out (C, H, W, N), from the output gradient and ``wmat``."""
    if isinstance(wmat, Winograd):
        return _winograd_input_grad(gc, wmat, g)
    if xp_of(gc) is np:
        return _input_grad_col2im(gc, wmat, g)
    return _input_grad_full_grid(gc, wmat, g)


def _weight_grad_whole(gc: Any, cols: Any, g: ConvGeom, has_bias: bool) -> tuple:
    """Weight (and bias) gradient from a whole im2col matrix: one (batched) product."""
    xp = xp_of(gc)
    G, Og = g.G, g.O // g.G
    Kg = (g.C // G) * g.kh * g.kw
    g2 = xp.ascontiguousarray(gc).reshape(G, Og, -1)
    if G == 1 and xp is np:  # several BLAS threads: a share of the output channels each
        dwe = np.empty((1, Og, cols.shape[1]), gc.dtype)
        run_split(lambda s: np.matmul(g2[0, s[0]:s[1]], cols[0].T, out=dwe[0, s[0]:s[1]]),
                  split_ranges(Og, blas_threads()))
    elif G == 1:
        dwe = (g2[0] @ cols[0].T)[None]
    else:
        dwe = xp.matmul(g2, cols.transpose(0, 2, 1))
    dw = dwe[:, :, :Kg].reshape(g.O, g.C // G, g.kh, g.kw)
    db = dwe[:, :, Kg].reshape(g.O) if has_bias else None
    return dw, db


def _banded_weight_grad(gc: Any, cols: Banded, g: ConvGeom) -> tuple:
    """``g2 @ cols.T`` band by band, each band of ``cols`` rebuilt from the padded source.

    Each band's product is taken as ``band @ g2_band.T`` (rows, O), a batch of products over
    blocks of its columns (:func:`_block_width`) whose results are summed: OpenBLAS runs that
    orientation of this long, thin product 1.6x faster than ``g2_band @ band.T``, and 1.5x
    faster again in small blocks when ``g2.T`` is a contiguous copy (only worth making for the
    bigger weight matrices: about 0.1 ms at LeNet's conv2, batch 256). With several BLAS
    threads, each sums a share of the bands (:func:`run_split`) and the shares are added.
    """
    Kg, rows = g.C * g.kh * g.kw, cols.rows
    g2 = np.ascontiguousarray(gc).reshape(g.O, -1)
    nat = _native.get(gc.dtype)
    if nat is not None and cols.src.flags.c_contiguous and cols.src.dtype == gc.dtype:
        return _native_weight_grad(nat, g2, cols, g)
    gt = np.ascontiguousarray(g2.T) if g.O * rows >= 1024 else g2.T
    win = _window(np, cols.src, g)

    def bands(span: tuple) -> Any:
        mine = cols.plan[span[0]:span[1]]
        buf = _band_buffer(rows, mine, g, gc.dtype, Kg)
        acc = np.zeros((rows, g.O), gc.dtype)
        part = np.empty((max(1, buf.shape[1] // _block_width(buf.shape[1], rows * g.O)), rows,
                         g.O), gc.dtype)
        for band in mine:
            m0, m1 = _band_span(g, band)
            cb = _band_cols(buf, win, g, band, Kg)
            n = _block_width(m1 - m0, rows * g.O)
            nb = (m1 - m0) // n
            if nb == 1 or nb > len(part):
                np.matmul(cb, gt[m0:m1], out=part[0])
                acc += part[0]
            else:
                np.matmul(_col_blocks(cb, n), gt[m0:m1].reshape(nb, n, g.O), out=part[:nb])
                acc += part[:nb].sum(axis=0)
        return acc

    accs = run_split(bands, split_ranges(len(cols.plan), blas_threads()))
    acc = accs[0]
    for more in accs[1:]:
        acc += more
    dwe = acc.T
    return dwe[:, :Kg].reshape(g.O, g.C, g.kh, g.kw), (dwe[:, Kg].copy() if rows > Kg else None)


def _native_weight_grad(nat: tuple, g2: Any, cols: Banded, g: ConvGeom) -> tuple:
    """:func:`_banded_weight_grad` in the compiled loops: each thread's share of the bands
    adds ``g2_band @ band.T`` into an (O, rows) sum of its own, and the sums are added."""
    mod, gemm = nat
    Kg, rows, plan = g.C * g.kh * g.kw, cols.rows, cols.plan
    geom, bands_arr, it = _native_geom(g, rows), np.array(plan, np.int64), g2.itemsize

    def native(span: tuple) -> Any:
        buf = _band_buffer(rows, plan[span[0]:span[1]], g, g2.dtype, Kg)
        acc = np.zeros((g.O, rows), g2.dtype)
        mod.weight_grad(cols.src, g2, acc, geom, bands_arr, span[0], span[1], buf, gemm, it)
        return acc

    accs = run_split(native, split_ranges(len(plan), blas_threads()))
    acc = accs[0]
    for more in accs[1:]:
        acc += more
    return acc[:, :Kg].reshape(g.O, g.C, g.kh, g.kw), (acc[:, Kg].copy() if rows > Kg else None)


def _input_grad_col2im(gc: Any, wmat: Any, g: ConvGeom) -> Any:
    """NumPy input gradient: per band, ``D = W.T @ g_band``, then D's kh*kw slices added in place.

    ``D[(c, i, j), pixel]`` is what an output pixel sends to the input pixel at kernel offset
    (i, j): each (i, j) slice of D is added to the (padded) input gradient, shifted by that
    offset, with one strided ``+=`` (:func:`_col2im_band`). The product and the adds only touch
    ``C*kh*kw`` numbers per output pixel, half what the full-grid method (CuPy) multiplies and
    sums, and a band of D is added while it is still in cache. The bands are of whole output
    rows where they fit in ``2 * BAND_BYTES`` (LeNet's conv2 at batch 256: one row, 1.5 MB,
    was the fastest band; narrower ones cost more in calls than they save in cache misses).
    With several BLAS threads (and one group), each takes a share of the input channels, whose
    rows of D and of the input gradient are its own (:func:`run_split`).
    """
    G = g.G
    g3 = np.ascontiguousarray(gc).reshape(G, g.O // G, -1)
    wt = wmat.transpose(0, 2, 1)  # (G, Kg, Og)
    kk = g.kh * g.kw
    plan = _band_plan(g, g.C * kk * g.N * gc.itemsize, 2 * BAND_BYTES, None)
    widest = max((y1 - y0) * (x1 - x0) for y0, y1, x0, x1 in plan) * g.N
    dx = zeros(np, (g.C, g.Hp, g.Wp, g.N), gc.dtype)
    nat = _native.get(gc.dtype) if G == 1 and wmat.dtype == gc.dtype else None
    if nat is not None:  # the same bands, in C (_native): a share of the channels each
        mod, gemm = nat
        w2 = np.ascontiguousarray(wmat[0])
        geom, bands_arr, it = _native_geom(g, w2.shape[1]), np.array(plan, np.int64), gc.itemsize

        def native(span: tuple) -> None:
            dbuf = empty(np, ((span[1] - span[0]) * kk, widest), gc.dtype)
            mod.input_grad(g3[0], w2, dx, geom, bands_arr, span[0], span[1], dbuf, gemm, it)

        run_split(native, split_ranges(g.C, blas_threads()))
        return dx[:, g.pt:g.pt + g.H, g.pl:g.pl + g.W]

    def channels(span: tuple) -> None:
        c0, c1 = span
        dbuf = empty(np, (G, (c1 - c0) * kk if G == 1 else wt.shape[1], widest), gc.dtype)
        for band in plan:
            m0, m1 = _band_span(g, band)
            d = dbuf[:, :, :m1 - m0]
            if G == 1:
                _matmul_cols(wt[0, c0 * kk:c1 * kk], g3[0, :, m0:m1], d[0])
            else:
                np.matmul(wt, g3[:, :, m0:m1], out=d)
            _col2im_band(dx[c0:c1], d, g, band)

    run_split(channels, split_ranges(g.C, blas_threads() if G == 1 else 1))
    return dx[:, g.pt:g.pt + g.H, g.pl:g.pl + g.W]


def _col2im_band(dx: Any, d: Any, g: ConvGeom, band: tuple) -> None:
    """Add a band's ``D`` (C*kh*kw rows) into the padded (C, Hp, Wp, N) input gradient ``dx``
    (or into some of its channels, ``D`` then holding their rows).

    In a band of one output row, the kh kernel rows of a kernel column j land on kh different
    input rows, so they are added at once (kw adds); a band of several rows takes kh*kw adds.
    """
    y0, y1, x0, x1 = band
    d = d.reshape(dx.shape[0], g.kh, g.kw, y1 - y0, x1 - x0, g.N)
    xs = slice(x0 * g.sw, (x1 - 1) * g.sw + 1, g.sw)
    if y1 - y0 == 1:
        top = y0 * g.sh
        rows = dx[:, top:top + (g.kh - 1) * g.dh + 1:g.dh]
        for j in range(g.kw):
            t = rows[:, :, _shift(xs, j * g.dw)]
            np.add(t, d[:, :, j, 0], out=t)
        return
    ys = slice(y0 * g.sh, (y1 - 1) * g.sh + 1, g.sh)
    for i in range(g.kh):
        rows = dx[:, _shift(ys, i * g.dh)]
        for j in range(g.kw):
            t = rows[:, :, _shift(xs, j * g.dw)]
            np.add(t, d[:, i, j], out=t)


def _shift(s: slice, by: int) -> slice:
    return slice(s.start + by, s.stop + by, s.step)


def _input_grad_full_grid(gc: Any, wmat: Any, g: ConvGeom) -> Any:
    """Input gradient (C, H, W, N) without a loop (CuPy; see the module docstring)."""
    xp = xp_of(gc)
    G, Og = g.G, g.O // g.G
    Kg = (g.C // G) * g.kh * g.kw
    N = g.N
    Q = g.Hp * g.Wp * N
    gfull = zeros(xp, (g.O, g.Hp, g.Wp, N), gc.dtype)
    gfull[:, 0:(g.OH - 1) * g.sh + 1:g.sh, 0:(g.OW - 1) * g.sw + 1:g.sw] = gc
    kk = g.kh * g.kw
    it = gc.itemsize
    y = empty(xp, (G, Kg, Q), gc.dtype)
    xp.matmul(wmat.transpose(0, 2, 1), gfull.reshape(G, Og, Q), out=y)
    y = y.reshape(G * Kg, Q)
    # y[(c, i, j), q] holds what the output at grid position q sends to the input at
    # q + (i*dh*Wp + j*dw)*N; reading row (c, i, j) shifted back by that offset lines all kh*kw
    # contributions to one input position up on the same column of a strided view.
    r = _as_strided(xp, y, (g.C, g.kh, g.kw, Q),
                    (kk * Q * it, (g.kw * Q - g.dh * g.Wp * N) * it, (Q - g.dw * N) * it, it))
    z = r.sum(axis=(1, 2)).reshape(g.C, g.Hp, g.Wp, N)
    return z[:, g.pt:g.pt + g.H, g.pl:g.pl + g.W]


# --------------------------------------------------------------------------------------------
# conv2d by Winograd's minimal filtering F(2x2, 3x3) (NumPy, 3x3 stride 1, many channels)
#
# Each 2x2 output tile is ``A^T [U ⊙ (B^T d B)] A`` for its 4x4 input patch ``d`` and the
# filter's 4x4 transform ``U = G w G^T``: 16 products per tile and channel pair where direct
# convolution takes 36. Summed over input channels, the 16 elementwise products become 16
# matrix products ``M[k] = U[k] (O x C) @ V[k] (C x tiles)``, so a layer's multiply-adds drop
# 2.25x for the price of the (memory-bound) transforms of its input (4x its size) and output.
# The backward pass is done the same way: the input gradient is the convolution of the padded
# output gradient with the flipped, transposed filter, whose transform is ``U`` with the tile
# indices 0 and 3 swapped and each (O, C) block transposed (no new filter transform), and the
# weight gradient is ``G^T dU G`` with ``dU[k] = (A g A^T)[k] @ V[k]^T``, V kept from the
# forward pass. The transforms work on blocks of channels that stay in the core's cache.


#: Winograd's filter transform G for F(2, 3); B^T and A^T are the adds written out below
_WINO_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
#: ``U[(xi, nu)] = sum over (i, j) of G[xi, i] G[nu, j] w[i, j]``: one (16, 9) matrix
_WINO_GG = np.einsum("ai,bj->abij", _WINO_G, _WINO_G).reshape(16, 9)
#: the weight gradient's back transform ``G^T dU G`` as a (16, 9) matrix; the sign of A's last
#: row, folded out of the output-gradient transform (which then only adds), comes back here
_WINO_S = np.array([1.0, 1.0, 1.0, -1.0])
_WINO_GG_GRAD = np.outer(_WINO_S, _WINO_S).reshape(16, 1) * _WINO_GG
#: tile index -> slot of the flipped filter's transform (0 and 3 trade places)
_WINO_SWAP = (3, 1, 2, 0)
_WINO_KEEP = (0, 1, 2, 3)

#: Winograd is taken when both channel counts reach this (below it the transforms, which grow
#: with the channels while the saving grows with their product, cost more than they save)
WINOGRAD_MIN_CHANNELS = 64

#: channel blocks of the transforms: about this many bytes of input (or output) at a time
WINOGRAD_BLOCK_BYTES = 1 << 20

#: ... and the convolution works on bands of tile rows whose transformed input and products
#: take about this many bytes (see _wino_conv), but at least this many columns: narrower
#: products repack the filter too often (ResNet's 128-channel layer: a fifth slower at 256)
WINOGRAD_BAND_BYTES = 4 << 20
WINOGRAD_BAND_COLUMNS = 512


class Winograd:
    """What a Winograd conv2d keeps for backward: the transformed input ``V`` (16, C, T),
    the transformed filter ``U`` (16, O, C), and the output tile grid ``th`` x ``tw``."""

    __slots__ = ("V", "U", "th", "tw")

    def __init__(self, V: Any, U: Any, th: int, tw: int) -> None:
        self.V, self.U, self.th, self.tw = V, U, th, tw


def winograd_applies(x: Any, g: ConvGeom) -> bool:
    """Whether conv2d of ``x`` with geometry ``g`` takes the Winograd path (see above)."""
    return (type(x) is np.ndarray and x.dtype in (np.float32, np.float64) and g.G == 1
            and g.kh == 3 and g.kw == 3 and g.sh == 1 and g.sw == 1 and g.dh == 1
            and g.dw == 1 and max(g.pt, g.pb, g.pl, g.pr) <= 2
            and min(g.C, g.O) >= WINOGRAD_MIN_CHANNELS)


def _wino_filter(w: Any, threads: int) -> Any:
    """``U`` (16, O, C) of an (O, C, 3, 3) filter: a product with the (16, 9) transform."""
    O, C = w.shape[0], w.shape[1]
    U = empty(np, (16, O, C), w.dtype)
    gg = _WINO_GG.astype(w.dtype)

    def part(span: tuple) -> None:
        o0, o1 = span
        np.matmul(gg, w[o0:o1].reshape((o1 - o0) * C, 9).T,
                  out=U[:, o0:o1].reshape(16, (o1 - o0) * C))

    run_split(part, split_ranges(O, threads))
    return U


def _wino_block(channels: int, per_channel_bytes: int) -> int:
    return max(1, min(channels, WINOGRAD_BLOCK_BYTES // max(1, per_channel_bytes)))


def _wino_source(a: Any, t0: int, t1: int, tw: int, top: int, left: int) -> Any:
    """Rows ``2*t0 : 2*t1 + 2`` of the zero-padded grid that tile rows ``t0:t1`` read:
    (C, 2(t1-t0)+2, 2tw+2, N), with ``a`` (C, H, W, N) placed at (top, left) in the grid."""
    C, H, W, N = a.shape
    rows, r0 = 2 * (t1 - t0) + 2, 2 * t0
    src = empty(np, (C, rows, 2 * tw + 2, N), a.dtype)
    src.fill(0)
    i0, i1 = max(0, r0 - top), min(H, r0 + rows - top)
    w = min(W, 2 * tw + 2 - left)
    if i1 > i0 and w > 0:
        src[:, i0 + top - r0:i1 + top - r0, left:left + w] = a[:, i0:i1, :w]
    return src


def _wino_input(src: Any, V: Any, slots: tuple) -> None:
    """``V[slots[a], slots[b]] = (B^T d B)[a, b]`` for every 4x4 patch ``d`` (stride 2) of
    ``src`` (C, 2th+2, 2tw+2, N); ``V`` is (4, 4, C, th, tw, N) (or a view of such)."""
    C, Hq, Wq, N = src.shape
    th, tw = V.shape[3], V.shape[4]
    e, f = 2 * th, 2 * tw
    cb = _wino_block(C, Hq * Wq * N * src.itemsize)
    R = empty(np, (4, cb, th, Wq, N), src.dtype)
    sub, add = np.subtract, np.add
    for c0 in range(0, C, cb):
        c1 = min(C, c0 + cb)
        x, r = src[c0:c1], R[:, :c1 - c0]
        x0, x1, x2, x3 = x[:, 0:e:2], x[:, 1:e + 1:2], x[:, 2:e + 2:2], x[:, 3:e + 3:2]
        sub(x0, x2, out=r[0])
        add(x1, x2, out=r[1])
        sub(x2, x1, out=r[2])
        sub(x1, x3, out=r[3])
        for a in range(4):
            ra, v = r[a], V[slots[a], :, c0:c1]
            y0, y1 = ra[:, :, 0:f:2], ra[:, :, 1:f + 1:2]
            y2, y3 = ra[:, :, 2:f + 2:2], ra[:, :, 3:f + 3:2]
            sub(y0, y2, out=v[slots[0]])
            add(y1, y2, out=v[slots[1]])
            sub(y2, y1, out=v[slots[2]])
            sub(y1, y3, out=v[slots[3]])


def _wino_output(M: Any, Y: Any, slots: tuple) -> None:
    """``Y`` (O, 2th, 2tw, N) from the tile products ``M`` (4, 4, O, th, tw, N) (or views):
    each 2x2 tile is ``A^T m A`` with ``m[xi, nu] = M[slots[xi], slots[nu]]``."""
    O, th, tw, N = M.shape[2:]
    ob = _wino_block(O, 4 * th * tw * N * M.itemsize)
    P = empty(np, (2, 4, ob, th, tw, N), M.dtype)
    s0, s1, s2, s3 = slots
    for o0 in range(0, O, ob):
        o1 = min(O, o0 + ob)
        m, p = M[:, :, o0:o1], P[:, :, :o1 - o0]
        # rows: p[0] = m0 + m1 + m2, p[1] = m1 - m2 - m3 (A^T's two rows)
        np.add(m[s0], m[s1], out=p[0])
        p[0] += m[s2]
        np.subtract(m[s1], m[s2], out=p[1])
        p[1] -= m[s3]
        for a in range(2):
            pa, y = p[a], Y[o0:o1, a::2]
            t0, t1 = y[:, :, 0::2], y[:, :, 1::2]
            np.add(pa[s0], pa[s1], out=t0)
            t0 += pa[s2]
            np.subtract(pa[s1], pa[s2], out=t1)
            t1 -= pa[s3]


def _wino_conv(a: Any, top: int, left: int, U: Any, th: int, tw: int, slots: tuple,
               transpose_u: bool, keep_v: bool, threads: int) -> tuple:
    """Winograd convolution of ``a`` (C, H, W, N) placed at (top, left) in a zero grid:
    ``(Y, V)``, ``Y`` on the whole (O, 2th, 2tw, N) tile grid, ``V`` the transformed input
    (None unless kept).

    The tile grid is cut into bands of tile rows (:data:`WINOGRAD_BAND_BYTES`), each taken
    through all three steps before the next: its padded input rows, their transform, its
    columns of the 16 products, its output rows. A band's transformed input and products stay
    in cache between the steps (the products never reach memory, nor the transformed input
    unless it is kept), and with several BLAS threads each thread takes a share of the bands
    (:func:`run_split`), so that they meet once.
    """
    C, N = a.shape[0], a.shape[3]
    Ut = U.transpose(0, 2, 1) if transpose_u else U
    O = Ut.shape[1]
    T, row = th * tw * N, tw * N  # columns in all, per tile row
    rb = max(-(-WINOGRAD_BAND_COLUMNS // row),
             WINOGRAD_BAND_BYTES // (16 * (C + O) * row * a.itemsize))
    rb = max(1, min(rb, -(-th // threads)))  # at least one band per thread
    bands = [(t, min(th, t + rb)) for t in range(0, th, rb)]
    V = empty(np, (16, C, T), a.dtype) if keep_v else None
    Y = empty(np, (O, 2 * th, 2 * tw, N), a.dtype)

    def share(span: tuple) -> None:
        Mb = empty(np, (16, O, rb * row), a.dtype)
        Vb = None if keep_v else empty(np, (16, C, rb * row), a.dtype)
        for t0, t1 in bands[span[0]:span[1]]:
            n = (t1 - t0) * row
            v = V[:, :, t0 * row:t1 * row] if V is not None else Vb[:, :, :n]
            _wino_input(_wino_source(a, t0, t1, tw, top, left),
                        v.reshape(4, 4, C, t1 - t0, tw, N), slots)
            m = Mb[:, :, :n]
            np.matmul(Ut, v, out=m)
            _wino_output(m.reshape(4, 4, O, t1 - t0, tw, N), Y[:, 2 * t0:2 * t1], slots)

    run_split(share, split_ranges(len(bands), threads))
    return Y, V


def _crop(Y: Any, h: int, w: int) -> Any:
    """``Y[:, :h, :w]`` as a C-contiguous array (``Y`` itself when nothing is cut)."""
    if Y.shape[1] == h and Y.shape[2] == w:
        return Y
    out = empty(np, (Y.shape[0], h, w, Y.shape[3]), Y.dtype)
    np.copyto(out, Y[:, :h, :w])
    return out


def winograd_forward(x: Any, w: Any, b: Optional[Any], g: ConvGeom) -> tuple:
    """conv2d of NCHW ``x`` (3x3, stride 1): ``(out (O, OH, OW, N), Winograd record)``."""
    threads = blas_threads()
    th, tw = -(-g.OH // 2), -(-g.OW // 2)
    U = _wino_filter(w, threads)
    Y, V = _wino_conv(x.transpose(1, 2, 3, 0), g.pt, g.pl, U, th, tw, _WINO_KEEP, False, True,
                      threads)
    out = _crop(Y, g.OH, g.OW)
    if b is not None:
        out += b.astype(out.dtype, copy=False).reshape(g.O, 1, 1, 1)
    return out, Winograd(V, U, th, tw)


def _winograd_input_grad(gc: Any, rec: Winograd, g: ConvGeom) -> Any:
    """Input gradient (C, H, W, N): the padded output gradient convolved with the flipped,
    transposed filter, whose transform is ``U`` with tile indices 0 and 3 swapped."""
    th, tw = -(-g.H // 2), -(-g.W // 2)
    Y, _ = _wino_conv(gc, 2 - g.pt, 2 - g.pl, rec.U, th, tw, _WINO_SWAP, True, False,
                      blas_threads())
    return _crop(Y, g.H, g.W)


def _winograd_weight_grad(gc: Any, rec: Winograd, g: ConvGeom, has_bias: bool) -> tuple:
    """``(dw, db)``: ``dU[k] = (A g A^T)[k] @ V[k]^T`` over the forward's tiles, then G^T dU G.

    The output gradient's transform is made one tile position ``k`` at a time (its row pass
    once per kernel row ``xi``) into a buffer that stays in cache for its product; with
    several BLAS threads, each takes a share of the four kernel rows.
    """
    th, tw, O, C, N = rec.th, rec.tw, g.O, g.C, g.N
    T = th * tw * N
    if (2 * th, 2 * tw) == (g.OH, g.OW):
        gp = gc
    else:  # odd output sizes: the last tiles' missing row/column count as zeros
        gp = zeros(np, (O, 2 * th, 2 * tw, N), gc.dtype)
        gp[:, :g.OH, :g.OW] = gc
    dU = empty(np, (16, O, C), gc.dtype)
    V = rec.V

    def kernel_rows(span: tuple) -> None:
        S = empty(np, (O, th, 2 * tw, N), gc.dtype)
        mk = empty(np, (O, th, tw, N), gc.dtype)
        m2 = mk.reshape(O, T)
        g0, g1 = gp[:, 0::2], gp[:, 1::2]
        for xi in range(*span):
            # A' = [[1, 0], [1, 1], [1, -1], [0, 1]]: rows g0, g0 + g1, g0 - g1, g1
            row = g0 if xi == 0 else g1 if xi == 3 else S
            if xi == 1:
                np.add(g0, g1, out=S)
            elif xi == 2:
                np.subtract(g0, g1, out=S)
            r0, r1 = row[:, :, 0::2], row[:, :, 1::2]
            for nu in range(4):
                if nu == 0:
                    np.copyto(mk, r0)
                elif nu == 1:
                    np.add(r0, r1, out=mk)
                elif nu == 2:
                    np.subtract(r0, r1, out=mk)
                else:
                    np.copyto(mk, r1)
                k = 4 * xi + nu
                np.matmul(m2, V[k].T, out=dU[k])

    threads = blas_threads()
    run_split(kernel_rows, split_ranges(4, threads))
    dw = np.empty((O, C, 3, 3), gc.dtype)
    back = _WINO_GG_GRAD.astype(gc.dtype)

    def channels(span: tuple) -> None:
        o0, o1 = span
        np.matmul(dU[:, o0:o1].reshape(16, (o1 - o0) * C).T, back,
                  out=dw[o0:o1].reshape((o1 - o0) * C, 9))

    run_split(channels, split_ranges(O, threads))
    db = gc.sum(axis=(1, 2, 3)) if has_bias else None
    return dw, db


# --------------------------------------------------------------------------------------------
# softmax family


def log_softmax(x: Any, dim: int) -> Any:
    """Numerically stable log-softmax along ``dim`` (same dtype as ``x``)."""
    xp = xp_of(x)
    z = x - x.max(axis=dim, keepdims=True)  # as torch: a row of -inf gives nan
    z -= xp.log(xp.exp(z).sum(axis=dim, keepdims=True))
    return z


def softmax(x: Any, dim: int) -> Any:
    """Numerically stable softmax along ``dim``."""
    xp = xp_of(x)
    e = xp.exp(x - x.max(axis=dim, keepdims=True))
    e /= e.sum(axis=dim, keepdims=True)
    return e

