"""Array-level kernels behind the normalisation layers and adaptive pooling of ``nn.functional``.

Raw NumPy or CuPy arrays in and out (the module is taken from the inputs); nothing here knows
Tensors or autograd. The choices that make these fast on one CPU core:

- **Batch norm keeps its input's memory layout.** conv2d returns NCHW tensors laid out
  (C, H, W, N) in memory (see ``_kernels``). :func:`channel_layout` finds, without copying, a
  C-contiguous 3-D view ``(A, C, B)`` of any input whose memory is dense in some axis order
  (A = the axes outside the channel in memory, B = those inside), so every statistic is a
  reduction over long contiguous runs and the output (and the input gradient) is written in
  the same layout, which the next conv2d reads without a transposing copy.
- **Reductions are BLAS products**: a sum is a product with a vector of ones (gemv), a sum of
  products one dot product per row (``matmul`` of (1, B) by (B, 1) blocks): 2-4x faster than
  NumPy's ``sum`` or ``einsum`` on one core, and no temporary.
- **Group norm works on planes** (one per sample and channel) in the input's own layout
  (NCHW rows, or conv2d's batch-innermost columns), so it needs no transposing copy either.
- **The affine step is folded into one scale and one shift per channel** (``y = x * s + t``),
  and the input gradient into ``(g - x * k + c) * a`` with per-channel ``k, c, a``: three or
  four elementwise passes, without saving the normalised input for backward.
- **Variance is two-pass** (mean, then the mean of squared deviations), as accurate in
  float32 as torch's, not ``E[x^2] - E[x]^2``, which cancels badly when the mean is large.
- **Adaptive average pooling is two matrix products** with averaging matrices whose rows hold
  torch's bins ``[floor(i*n/m), ceil((i+1)*n/m))`` (divisible or not), taken over the whole
  batch in the input's own layout (a global pool is one product with an averaging vector).
  Window reshapes with NumPy's ``sum`` ran 2-15x slower on these short inner axes.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

import numpy as np

from mpitensor._base.parallel import blas_threads, run_split, split_ranges
from mpitensor._base.workspace import _inverse, empty, memory_order, xp_of

__all__: list = []  # private module: used by mpitensor.nn.functional and SyncBatchNorm


# --------------------------------------------------------------------------------------------
# reductions as BLAS products


@functools.lru_cache(maxsize=64)
def _ones_np(n: int, dtype: np.dtype) -> np.ndarray:
    v = np.ones(n, dtype)
    v.flags.writeable = False  # shared by every call with this size
    return v


def _ones(xp: Any, n: int, dtype: Any) -> Any:
    """A vector of ``n`` ones: sums are products with it (gemv), 2-4x faster than ``sum``."""
    return _ones_np(int(n), np.dtype(dtype)) if xp is np else xp.ones(n, dtype=dtype)


def row_sum(a2: Any) -> Any:
    """Sum of every row of a C-contiguous 2-D array."""
    return a2 @ _ones(xp_of(a2), a2.shape[1], a2.dtype)


def row_dot(a2: Any, b2: Any) -> Any:
    """``sum(a * b)`` of every row of two C-contiguous 2-D arrays: one dot product per row."""
    return xp_of(a2).matmul(a2[:, None, :], b2[:, :, None])[:, 0, 0]


# --------------------------------------------------------------------------------------------
# layouts


class ChannelLayout:
    """How an (N, C, *S) array maps onto a C-contiguous (A, C, B) array: an axis order."""

    __slots__ = ("order", "shape", "A", "C", "B")

    def __init__(self, order: tuple, shape: tuple) -> None:
        self.order = order  # the array's axes, outermost in memory first
        self.shape = shape
        k = order.index(1)
        self.A = math.prod(shape[a] for a in order[:k])
        self.C = shape[1]
        self.B = math.prod(shape[a] for a in order[k + 1:])

    def view(self, x: Any) -> Any:
        """``x`` as (A, C, B): a view when ``x`` is laid out in this order, else a copy."""
        xt = x.transpose(self.order)
        if not xt.flags.c_contiguous:
            xt = xp_of(x).ascontiguousarray(xt)
        return xt.reshape(self.A, self.C, self.B)

    def empty(self, xp: Any, dtype: Any) -> tuple:
        """A new array laid out in this order: ``(as (N, C, *S), as (A, C, B))``."""
        buf = empty(xp, (self.A, self.C, self.B), dtype)
        full = buf.reshape(tuple(self.shape[a] for a in self.order)).transpose(
            _inverse(self.order))
        return full, buf


def channel_layout(x: Any) -> ChannelLayout:
    """The layout of ``x`` (N, C, *S) if its memory is dense in some axis order, else NCHW's.

    A non-dense input (a slice, say) is read through one contiguous copy in NCHW order.
    """
    order = memory_order(x)
    if not x.transpose(order).flags.c_contiguous:
        order = tuple(range(x.ndim))
    return ChannelLayout(order, tuple(x.shape))


def channel_sum(a3: Any) -> Any:
    """Per-channel sum of a C-contiguous (A, C, B) array."""
    xp = xp_of(a3)
    A, C, B = a3.shape
    if B == 1:
        return _ones(xp, A, a3.dtype) @ a3.reshape(A, C)
    return row_sum(a3.reshape(A * C, B)).reshape(A, C).sum(axis=0)


def channel_dot(a3: Any, b3: Any) -> Any:
    """Per-channel ``sum(a * b)`` of two C-contiguous (A, C, B) arrays."""
    xp = xp_of(a3)
    A, C, B = a3.shape
    if B == 1:
        return _ones(xp, A, a3.dtype) @ (a3.reshape(A, C) * b3.reshape(A, C))
    return row_dot(a3.reshape(A * C, B), b3.reshape(A * C, B)).reshape(A, C).sum(axis=0)


def _col(v: Any) -> Any:
    """A per-channel vector shaped to broadcast over (A, C, B)."""
    return v.reshape(1, -1, 1)


class PlaneLayout:
    """(N, C, *S) arrays as their N*C planes of S positions, in one of two C-contiguous forms:
    ``rows`` (N*C, S) for NCHW memory, or ``cols`` (C, S, N) for conv2d's batch-innermost
    memory; any other input is read through one NCHW copy."""

    __slots__ = ("N", "C", "S", "cols")

    def __init__(self, x: Any) -> None:
        self.N, self.C = x.shape[0], x.shape[1]
        self.S = math.prod(x.shape[2:])
        back = (*range(1, x.ndim), 0)
        self.cols = (not x.flags.c_contiguous and self.N > 1
                     and x.transpose(back).flags.c_contiguous)

    def view(self, a: Any) -> Any:
        """``a`` in this layout's 2-D (rows) or 3-D (cols) form, copied when laid out otherwise."""
        xp = xp_of(a)
        if self.cols:
            at = a.transpose((*range(1, a.ndim), 0))
            if not at.flags.c_contiguous:
                at = xp.ascontiguousarray(at)
            return at.reshape(self.C, self.S, self.N)
        return xp.ascontiguousarray(a).reshape(self.N * self.C, self.S)

    def empty(self, xp: Any, dtype: Any, shape: tuple) -> tuple:
        """A new array of ``shape`` in this layout: ``(full, as the view)``."""
        if self.cols:
            buf = empty(xp, (self.C, self.S, self.N), dtype)
            full = buf.reshape((*shape[1:], shape[0])).transpose(
                (len(shape) - 1, *range(len(shape) - 1)))
            return full, buf
        buf = empty(xp, (self.N * self.C, self.S), dtype)
        return buf.reshape(shape), buf

    def sum(self, a: Any) -> Any:
        """Per-plane sums, (N, C)."""
        if self.cols:
            return (_ones(xp_of(a), self.S, a.dtype) @ a).T
        return row_sum(a).reshape(self.N, self.C)

    def dot(self, a: Any, b: Any) -> Any:
        """Per-plane ``sum(a * b)``, (N, C)."""
        if self.cols:
            return xp_of(a).einsum("csn,csn->cn", a, b).T
        return row_dot(a, b).reshape(self.N, self.C)

    def per_plane(self, v: Any) -> Any:
        """An (N, C) array shaped to broadcast over the view."""
        if self.cols:
            return xp_of(v).ascontiguousarray(v.T).reshape(self.C, 1, self.N)
        return v.reshape(self.N * self.C, 1)


def _axpby(xp: Any, a: Any, ka: Any, b: Any, kb: Any, kc: Any, out: Any) -> Any:
    """``out = a * ka + b * kb + kc`` (broadcast coefficients) with one temporary."""
    xp.multiply(b, kb, out=out)
    xp.add(out, kc, out=out)
    t = empty(xp, out.shape, out.dtype)
    xp.multiply(a, ka, out=t)
    xp.add(out, t, out=out)
    return out


# --------------------------------------------------------------------------------------------
# batch norm


#: batch norm shares the channels of a (1, C, B) input (conv2d's layout) out over the BLAS
#: threads (``_parallel.run_split``) from this many elements on
SPLIT_ELEMENTS = 1 << 18


def _channel_parts(x3: Any) -> list:
    """Channel ranges for the BLAS threads: several only for big NumPy (1, C, B) arrays, whose
    channel slices are contiguous (``[(0, C)]`` otherwise)."""
    C = x3.shape[1]
    if xp_of(x3) is not np or x3.shape[0] != 1 or x3.size < SPLIT_ELEMENTS:
        return [(0, C)]
    return split_ranges(C, blas_threads())


def _cut(v: Optional[Any], span: tuple) -> Optional[Any]:
    return None if v is None else v[span[0]:span[1]]


def _joined(parts: list) -> tuple:
    """Per-part tuples of per-channel vectors (or None) -> one tuple of whole vectors."""
    return tuple(None if vs[0] is None else np.concatenate(vs) for vs in zip(*parts))


def batch_norm_train(x3: Any, y3: Any, w: Optional[Any], b: Optional[Any], eps: float) -> tuple:
    """Normalise (A, C, B) ``x3`` with its own per-channel statistics into ``y3``.

    Returns ``(mean, invstd, biased_var)``, each of shape (C,). Big conv2d outputs are done
    a share of the channels per BLAS thread.
    """
    parts = _channel_parts(x3)
    if len(parts) > 1:
        return _joined(run_split(
            lambda s: _batch_norm_train(x3[:, s[0]:s[1]], y3[:, s[0]:s[1]], _cut(w, s),
                                        _cut(b, s), eps), parts))
    return _batch_norm_train(x3, y3, w, b, eps)


def _batch_norm_train(x3: Any, y3: Any, w: Optional[Any], b: Optional[Any],
                      eps: float) -> tuple:
    xp = xp_of(x3)
    n = x3.shape[0] * x3.shape[2]
    mean = channel_sum(x3) / n
    xp.subtract(x3, _col(mean), out=y3)
    # the float32 sum rounds the mean by ~sqrt(n) * 6e-8 * |mean|, which is a large error in
    # x - mean where |mean| >> std: the centred values' own mean corrects it (as a two-pass
    # mean would), folded into the variance and into the final shift (no extra pass over y3)
    delta = channel_sum(y3) / n
    var = channel_dot(y3, y3) / n - delta * delta
    mean = mean + delta
    invstd = 1.0 / xp.sqrt(var + eps)
    scale = invstd if w is None else invstd * w
    xp.multiply(y3, _col(scale.astype(x3.dtype, copy=False)), out=y3)
    shift = -delta * scale if b is None else b - delta * scale
    xp.add(y3, _col(shift.astype(x3.dtype, copy=False)), out=y3)
    return mean, invstd, var


def update_running_stats(rm: Optional[Any], rv: Optional[Any], mean: Any, var: Any, n: float,
                         momentum: float) -> None:
    """Move the running mean and variance (either may be None) toward a batch's ``mean`` and
    biased ``var`` over ``n`` values per channel, in place; the variance as the unbiased one,
    as torch does."""
    if rm is not None:
        rm *= 1.0 - momentum
        rm += momentum * mean
    if rv is not None:
        rv *= 1.0 - momentum
        rv += (momentum * n / (n - 1)) * var


def batch_norm_eval(x3: Any, y3: Any, mean: Any, var: Any, w: Optional[Any], b: Optional[Any],
                    eps: float) -> Any:
    """Normalise (A, C, B) ``x3`` with given statistics into ``y3``; return ``invstd``."""
    xp = xp_of(x3)
    invstd = 1.0 / xp.sqrt(var + eps)
    scale = invstd if w is None else invstd * w
    shift = -mean * scale
    if b is not None:
        shift = shift + b
    xp.multiply(x3, _col(scale.astype(x3.dtype, copy=False)), out=y3)
    xp.add(y3, _col(shift.astype(x3.dtype, copy=False)), out=y3)
    return invstd


def batch_norm_backward(g3: Any, x3: Any, mean: Any, invstd: Any, w: Optional[Any],
                        batch_stats: bool, need: tuple, dx3: Optional[Any]) -> tuple:
    """Gradients ``(dx3, dw, db)`` of batch norm from the (A, C, B) output gradient ``g3``.

    ``batch_stats`` says whether the statistics were the batch's own (training), so that
    they depend on the input; ``need`` = (input, weight, bias) flags; ``dx3`` receives the
    input gradient (C-contiguous (A, C, B), or None when it is not needed). Big conv2d
    outputs are done a share of the channels per BLAS thread.
    """
    parts = _channel_parts(g3) if x3.shape[0] == 1 else [(0, g3.shape[1])]
    if len(parts) > 1:
        dw, db = _joined([r[1:] for r in run_split(
            lambda s: _batch_norm_backward(
                g3[:, s[0]:s[1]], x3[:, s[0]:s[1]], mean[s[0]:s[1]], invstd[s[0]:s[1]],
                _cut(w, s), batch_stats, need, None if dx3 is None else dx3[:, s[0]:s[1]]),
            parts)])
        return dx3, dw, db
    return _batch_norm_backward(g3, x3, mean, invstd, w, batch_stats, need, dx3)


def _batch_norm_backward(g3: Any, x3: Any, mean: Any, invstd: Any, w: Optional[Any],
                         batch_stats: bool, need: tuple, dx3: Optional[Any]) -> tuple:
    xp = xp_of(g3)
    need_x, need_w, need_b = need
    sg = channel_sum(g3) if (need_b or need_w or (need_x and batch_stats)) else None
    sgxh = xc = None
    if need_w or (need_x and batch_stats):
        # sum of g * x_hat per channel, from the centred input x - mean (in dx3 when the input
        # gradient is wanted: it is computed from it). Expanded as sum(g x) - mean sum(g), two
        # large and nearly equal sums cancel when |mean| >> std: float32 lost ~(mean / std) *
        # 6e-8 relative (5e-5 seen), where torch, which centres too, stays at rounding level
        xc = dx3 if need_x else xp.empty_like(x3)
        xp.subtract(x3, _col(mean.astype(x3.dtype, copy=False)), out=xc)
        sgxh = invstd * channel_dot(g3, xc)
    dw = sgxh if need_w else None
    db = sg if need_b else None
    if need_x:
        a = invstd if w is None else invstd * w
        a = _col(a.astype(g3.dtype, copy=False))
        if batch_stats:
            n = g3.shape[0] * g3.shape[2]
            k = invstd * sgxh / n  # dx = a * (g - (x - mean) * k - sg / n), xc = x - mean
            xp.multiply(xc, _col(k.astype(g3.dtype, copy=False)), out=dx3)
            xp.subtract(g3, dx3, out=dx3)
            xp.subtract(dx3, _col((sg / n).astype(g3.dtype, copy=False)), out=dx3)
            xp.multiply(dx3, a, out=dx3)
        else:
            xp.multiply(g3, a, out=dx3)
    return dx3, dw, db


# --------------------------------------------------------------------------------------------
# group norm


def group_norm_forward(x: Any, G: int, w: Optional[Any], b: Optional[Any], eps: float) -> tuple:
    """Group norm of (N, C, *S) ``x``: ``(y, x_view, layout, mean, invstd)``, the statistics
    (N, G); ``y`` keeps ``x``'s layout (NCHW or batch-innermost).

    Each plane's mean is taken first and its squared deviations summed around it; the group's
    variance combines them exactly (``sum q_c + S * sum (mu_c - m)^2``), so the two-pass
    accuracy costs no extra pass over the data.
    """
    xp = xp_of(x)
    lay = PlaneLayout(x)
    N, C, S = lay.N, lay.C, lay.S
    Cg = C // G
    x2 = lay.view(x)
    y, y2 = lay.empty(xp, x.dtype, x.shape)
    mu = lay.sum(x2) / S  # (N, C) plane means
    xp.subtract(x2, lay.per_plane(mu.astype(x.dtype, copy=False)), out=y2)
    q = lay.dot(y2, y2).reshape(N, G, Cg)  # squared deviations around each plane's mean
    mug = mu.reshape(N, G, Cg)
    mean = mug.mean(axis=2)
    var = (q.sum(axis=2) + S * ((mug - mean[:, :, None]) ** 2).sum(axis=2)) / (Cg * S)
    invstd = 1.0 / xp.sqrt(var + eps)
    a = xp.repeat(invstd, Cg, axis=1)  # (N, C)
    if w is not None:
        a = a * w
    shift = (mu - xp.repeat(mean, Cg, axis=1)) * a
    if b is not None:
        shift = shift + b
    xp.multiply(y2, lay.per_plane(a.astype(x.dtype, copy=False)), out=y2)
    xp.add(y2, lay.per_plane(shift.astype(x.dtype, copy=False)), out=y2)
    return y, x2, lay, mean, invstd


def group_norm_backward(g: Any, x2: Any, lay: PlaneLayout, G: int, mean: Any, invstd: Any,
                        w: Optional[Any], need: tuple) -> tuple:
    """``(dx, dw, db)`` of :func:`group_norm_forward` from the output gradient ``g``."""
    xp = xp_of(g)
    N, C, S = lay.N, lay.C, lay.S
    Cg = C // G
    g2 = lay.view(g)
    sg = lay.sum(g2)  # (N, C)
    sgx = lay.dot(g2, x2)
    m = xp.repeat(mean, Cg, axis=1)  # per (n, c)
    r = xp.repeat(invstd, Cg, axis=1)
    sgxh = r * (sgx - m * sg)  # sum over the plane of g * x_hat
    need_x, need_w, need_b = need
    dw = sgxh.sum(axis=0) if need_w else None
    db = sg.sum(axis=0) if need_b else None
    dx = None
    if need_x:
        wv = 1 if w is None else w
        n = Cg * S
        # means over each group of (w * g) and of (w * g * x_hat)
        mg = (sg * wv).reshape(N, G, Cg).sum(axis=2) / n
        mgxh = (sgxh * wv).reshape(N, G, Cg).sum(axis=2) / n
        # dx = invstd * (w g - mg - x_hat * mgxh) = A g + B x + D
        A = r * wv
        B = xp.repeat(-invstd * invstd * mgxh, Cg, axis=1)
        D = xp.repeat(invstd * (mean * invstd * mgxh - mg), Cg, axis=1)
        dx, dx2 = lay.empty(xp, g.dtype, g.shape)
        dt = g.dtype
        _axpby(xp, g2, lay.per_plane(A.astype(dt, copy=False)), x2,
               lay.per_plane(B.astype(dt, copy=False)), lay.per_plane(D.astype(dt, copy=False)),
               dx2)
    return dx, dw, db


# --------------------------------------------------------------------------------------------
# layer norm: the rows of (R, K), normalised along K


def layer_norm_forward(x2: Any, w: Optional[Any], b: Optional[Any], eps: float) -> tuple:
    """Layer norm of the rows of C-contiguous (R, K) ``x2``: ``(y2, mean, invstd)``."""
    xp = xp_of(x2)
    K = x2.shape[1]
    mean = row_sum(x2) / K
    y = empty(xp, x2.shape, x2.dtype)
    xp.subtract(x2, mean[:, None], out=y)
    invstd = 1.0 / xp.sqrt(row_dot(y, y) / K + eps)
    xp.multiply(y, invstd[:, None], out=y)
    if w is not None:
        xp.multiply(y, w.reshape(1, -1), out=y)
    if b is not None:
        xp.add(y, b.reshape(1, -1), out=y)
    return y, mean, invstd


def layer_norm_backward(g2: Any, x2: Any, mean: Any, invstd: Any, w: Optional[Any],
                        need: tuple) -> tuple:
    """``(dx2, dw, db)`` of :func:`layer_norm_forward` from the (R, K) output gradient."""
    xp = xp_of(g2)
    need_x, need_w, need_b = need
    K = x2.shape[1]
    dw = db = dx = None
    if need_w:
        # sum over rows of g * (x - mean) * invstd, as products with the row factors
        gx = g2 * x2
        dw = invstd @ gx - (invstd * mean) @ g2
    if need_b:
        db = _ones(xp, g2.shape[0], g2.dtype) @ g2
    if need_x:
        gw = g2 * w.reshape(1, -1) if w is not None else g2
        s1 = row_sum(gw)
        mgxh = invstd * (row_dot(gw, x2) - mean * s1) / K  # row mean of gw * x_hat
        B = (-invstd * invstd * mgxh)[:, None]
        D = (invstd * (mean * invstd * mgxh - s1 / K))[:, None]
        dx = _axpby(xp, gw, invstd[:, None], x2, B, D, empty(xp, x2.shape, x2.dtype))
    return dx, dw, db


# --------------------------------------------------------------------------------------------
# adaptive average pooling


def adaptive_bins(n: int, m: int) -> tuple:
    """torch's bins for pooling ``n`` positions into ``m``: arrays ``(start, end)``."""
    i = np.arange(m)
    start = (i * n) // m
    end = -((-(i + 1) * n) // m)  # ceil((i + 1) * n / m)
    return start, end


@functools.lru_cache(maxsize=64)
def _averaging_matrix_np(n: int, m: int, dtype: np.dtype) -> np.ndarray:
    start, end = adaptive_bins(n, m)
    pos = np.arange(n)
    inside = (pos[None, :] >= start[:, None]) & (pos[None, :] < end[:, None])
    mat = (inside / (end - start)[:, None]).astype(dtype)
    mat.flags.writeable = False  # shared by every call with these sizes
    return mat


def averaging_matrix(n: int, m: int, dtype: Any, xp: Any) -> Any:
    """(m, n) matrix whose row i averages bin i of :func:`adaptive_bins`."""
    mat = _averaging_matrix_np(int(n), int(m), np.dtype(dtype))
    return mat if xp is np else xp.asarray(mat)


def _batch_innermost(x: Any) -> bool:
    """True when (N, C, H, W) ``x`` is laid out (C, H, W, N) in memory (conv2d's outputs)."""
    return x.shape[0] > 1 and x.transpose(1, 2, 3, 0).flags.c_contiguous


def adaptive_avg_pool2d_forward(x: Any, oh: int, ow: int) -> Any:
    """Adaptive average pooling of (N, C, H, W) ``x`` to a C-contiguous (N, C, oh, ow).

    Two products with averaging matrices (``Ph @ x @ Pw.T`` per plane), taken over the
    whole batch at once in whichever of NCHW or batch-innermost order ``x`` is laid out; a
    global pool (1 x 1) is one product with an averaging vector over H*W.
    """
    xp = xp_of(x)
    N, C, H, W = x.shape
    if oh == 0 or ow == 0 or x.size == 0:
        return xp.zeros((N, C, oh, ow), dtype=x.dtype)
    if _batch_innermost(x):
        xc = x.transpose(1, 2, 3, 0)
        if oh == ow == 1:
            s = xp.matmul(averaging_matrix(H * W, 1, x.dtype, xp), xc.reshape(C, H * W, N))
        else:
            t = xp.matmul(averaging_matrix(W, ow, x.dtype, xp), xc.reshape(C * H, W, N))
            s = xp.matmul(averaging_matrix(H, oh, x.dtype, xp), t.reshape(C, H, ow * N))
        return xp.ascontiguousarray(s.reshape(C, oh, ow, N).transpose(3, 0, 1, 2))
    xn = xp.ascontiguousarray(x)
    if oh == ow == 1:
        s = xn.reshape(N * C, H * W) @ averaging_matrix(H * W, 1, x.dtype, xp)[0]
        return s.reshape(N, C, 1, 1)
    t = xn.reshape(N * C * H, W) @ averaging_matrix(W, ow, x.dtype, xp).T
    s = xp.matmul(averaging_matrix(H, oh, x.dtype, xp), t.reshape(N * C, H, ow))
    return s.reshape(N, C, oh, ow)


def adaptive_avg_pool2d_backward(g: Any, xshape: tuple, batch_innermost: bool) -> Any:
    """Input gradient of :func:`adaptive_avg_pool2d_forward` (``Ph.T @ g @ Pw`` per plane),
    laid out batch-innermost when the input was."""
    xp = xp_of(g)
    N, C, H, W = xshape
    oh, ow = g.shape[2], g.shape[3]
    if oh == 0 or ow == 0 or math.prod(xshape) == 0:
        return xp.zeros(xshape, dtype=g.dtype)
    if batch_innermost:
        gc = xp.ascontiguousarray(g.transpose(1, 2, 3, 0))  # (C, oh, ow, N)
        out = empty(xp, (C, H, W, N), g.dtype)
        if oh == ow == 1:  # a broadcast copy: BLAS is slow at these rank-1 products
            xp.copyto(out.reshape(C, H * W, N), gc.reshape(C, 1, N) * g.dtype.type(1 / (H * W)))
        else:
            t = xp.matmul(averaging_matrix(H, oh, g.dtype, xp).T, gc.reshape(C, oh, ow * N))
            xp.matmul(averaging_matrix(W, ow, g.dtype, xp).T, t.reshape(C * H, ow, N),
                      out=out.reshape(C * H, W, N))
        return out.transpose(3, 0, 1, 2)
    gn = xp.ascontiguousarray(g)
    out = empty(xp, xshape, g.dtype)
    if oh == ow == 1:
        xp.copyto(out.reshape(N * C, H * W), gn.reshape(N * C, 1) * g.dtype.type(1 / (H * W)))
        return out
    t = xp.matmul(averaging_matrix(H, oh, g.dtype, xp).T, gn.reshape(N * C, oh, ow))
    xp.matmul(t.reshape(N * C * H, ow), averaging_matrix(W, ow, g.dtype, xp),
              out=out.reshape(N * C * H, W))
    return out
