"""The connectionist temporal classification loss of ``torch.nn.functional``: ``ctc_loss``.

The forward (alpha) and backward (beta) recursions run in log space over the time steps,
each step one vectorised update of every sample's extended label sequence (blanks between
the labels) at once; samples of different input lengths are read at their own last step.
The gradient with respect to ``log_probs`` is torch's: it assumes ``log_probs`` come from a
``log_softmax`` (``exp(log_probs)`` minus the label posteriors), so that the gradient that
reaches the logits through that ``log_softmax`` is the exact one.

Re-exported by :mod:`mpitensor.nn.functional`; import it from there.

Example:
    >>> import mpitensor as mt
    >>> lp = mt.randn(6, 2, 4).log_softmax(2)
    >>> ctc_loss(lp, mt.tensor([[1, 2], [3, 3]]), (6, 5), (2, 2)).shape
    mpitensor.Size([])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._base import determinism as _determinism
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor, _new

from .checks import as_tensor, check_float, reduction_of, shape_str, xp_of

__all__ = ["ctc_loss"]


def _lengths(v: Any, name: str, batch: int, xp: Any) -> np.ndarray:
    if isinstance(v, Tensor):
        arr = v._data
        if _dt.kind_of(arr.dtype) not in "iu":
            raise RuntimeError(f"ctc_loss(): {name} must hold integers, got {arr.dtype}")
        arr = np.asarray(arr.get() if xp is not np and hasattr(arr, "get") else arr)
    else:
        vals = list(v) if isinstance(v, (tuple, list)) else [v]
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in vals):
            raise TypeError(f"ctc_loss(): {name} must be a Tensor or a tuple of ints, got {v!r}")
        arr = np.asarray(vals, dtype=np.int64)
    arr = arr.reshape(-1).astype(np.int64)
    if arr.size != batch:
        raise RuntimeError(f"ctc_loss(): {name} must have one entry per sample ({batch}), got "
                           f"{arr.size}")
    if arr.size and int(arr.min()) < 0:
        raise RuntimeError(f"ctc_loss(): {name} must be non-negative, got {arr.tolist()}")
    return arr


def _lse3(xp: Any, a: Any, b: Any, c: Any) -> Any:
    m = xp.maximum(xp.maximum(a, b), c)
    safe = xp.where(xp.isfinite(m), m, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = xp.exp(a - safe) + xp.exp(b - safe) + xp.exp(c - safe)
        return xp.where(xp.isfinite(m), xp.log(s) + safe, m)


def _shift(xp: Any, a: Any, k: int, fill: float) -> Any:
    """``a`` moved ``k`` places along its last axis (right for k > 0), filled with ``fill``."""
    out = xp.full_like(a, fill)
    if k > 0:
        out[..., k:] = a[..., :-k]
    else:
        out[..., :k] = a[..., -k:]
    return out


class _CTC(Function):
    """Per-sample negative log likelihoods (N,) of the (T, N, C) log-probabilities."""

    @staticmethod
    def forward(ctx: Any, lp: Any, ext: Any, skip: Any, in_len: Any, tgt_len: Any,
                zero_infinity: bool) -> Any:
        xp = xp_of(lp)
        T, N, _ = lp.shape
        L = ext.shape[1]
        ninf = -xp.inf
        # emissions of each sample's extended labels; past the sample's own 2S+1: -inf
        em = xp.take_along_axis(lp, xp.broadcast_to(ext[None], (T, N, L)), axis=2)
        live = xp.arange(L)[None, :] < (2 * tgt_len + 1)[:, None]
        em = xp.where(live[None], em, ninf)
        alpha = xp.full((T, N, L), ninf, dtype=lp.dtype)
        if T:
            alpha[0, :, :2] = em[0, :, :2]
        for t in range(1, T):
            prev = alpha[t - 1]
            two = xp.where(skip, _shift(xp, prev, 2, ninf), ninf)
            alpha[t] = _lse3(xp, prev, _shift(xp, prev, 1, ninf), two) + em[t]
        rows = xp.arange(N)
        last_t = xp.maximum(in_len - 1, 0)
        end = alpha[last_t, rows]  # (N, L): each sample at its own last step
        a_end = xp.take_along_axis(end, (2 * tgt_len)[:, None], axis=1)[:, 0]
        a_pre = xp.where(tgt_len > 0, xp.take_along_axis(
            end, xp.maximum(2 * tgt_len - 1, 0)[:, None], axis=1)[:, 0], ninf)
        with np.errstate(invalid="ignore"):
            nll = -xp.logaddexp(a_end, a_pre)
        nll = xp.where(in_len > 0, nll, xp.where(tgt_len > 0, xp.inf, 0)).astype(lp.dtype)
        bad = xp.isinf(nll)
        if zero_infinity:
            nll = xp.where(bad, 0, nll).astype(lp.dtype)
        ctx.save_for_backward(lp, ext, skip, in_len, tgt_len, em, alpha, nll, bad)
        ctx.zero_infinity = zero_infinity
        return nll

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        lp, ext, skip, in_len, tgt_len, em, alpha, nll, bad = ctx.saved_tensors
        xp = xp_of(lp)
        T, N, C = lp.shape
        L = ext.shape[1]
        ninf = -xp.inf
        s_idx = xp.arange(L)[None, :]
        init = xp.where((s_idx == (2 * tgt_len)[:, None])
                        | ((s_idx == (2 * tgt_len - 1)[:, None]) & (tgt_len > 0)[:, None]),
                        0.0, ninf)
        skip_up = _shift(xp, skip, -2, False)  # may s jump to s + 2
        beta = xp.full((T, N, L), ninf, dtype=lp.dtype)
        nxt = xp.full((N, L), ninf, dtype=lp.dtype)
        for t in range(T - 1, -1, -1):
            step = _lse3(xp, nxt, _shift(xp, nxt, -1, ninf),
                         xp.where(skip_up, _shift(xp, nxt, -2, ninf), ninf)) + em[t]
            here = xp.where((t == in_len - 1)[:, None], init + em[t], step)
            here = xp.where((t < in_len)[:, None], here, ninf)
            beta[t] = here
            nxt = here
        ab = alpha + beta  # (T, N, L)
        m = ab.max(axis=2, keepdims=True)
        m = xp.where(xp.isfinite(m), m, 0)
        w = xp.exp(ab - m)
        # per class: the posteriors summed over the extended positions carrying that class
        pos = (xp.arange(T * N).reshape(T, N, 1) * C + ext[None]).reshape(-1)
        acc = xp.zeros(T * N * C, dtype=lp.dtype)
        if xp is np:
            acc = np.bincount(pos, weights=w.reshape(-1), minlength=T * N * C).astype(lp.dtype)
        elif not _determinism.add_at(acc, pos, w.reshape(-1)):  # atomics unless deterministic
            import cupyx  # noqa: PLC0415 - only on GPUs

            cupyx.scatter_add(acc, pos, w.reshape(-1))
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            lcab = xp.log(acc.reshape(T, N, C)) + m
            grad = xp.exp(lp) - xp.exp(lcab + nll[None, :, None] - lp)
        keep = (xp.arange(T)[:, None] < in_len[None, :])[..., None]
        if ctx.zero_infinity:
            keep = keep & ~bad[None, :, None]
        grad = xp.where(keep, grad, 0) * g[None, :, None]
        return grad.astype(lp.dtype, copy=False), None, None, None, None, None



def _padded_targets(tg: Any, unbatched: bool, tgt_len: Any, N: int, C: int, blank: int,
                    xp: Any) -> Any:
    """The targets as an (N, S) int64 host array, given concatenated (1-D) or padded (2-D),
    each row filled with ``blank`` past its length; labels checked to lie in [0, C)."""
    fname = "ctc_loss"
    tg_host = np.asarray(tg.get() if xp is not np and hasattr(tg, "get") else tg)
    if unbatched:
        tg_host = tg_host.reshape(1, -1)
    smax = int(tgt_len.max()) if tgt_len.size else 0
    if tg_host.ndim == 1:  # concatenated
        if tg_host.size != int(tgt_len.sum()):
            raise RuntimeError(f"{fname}(): concatenated targets have {tg_host.size} labels "
                               f"but target_lengths sum to {int(tgt_len.sum())}")
        starts = np.concatenate([[0], np.cumsum(tgt_len)[:-1]])
        cols = np.minimum(starts[:, None] + np.arange(smax)[None, :], max(tg_host.size - 1, 0))
        padded = tg_host[cols] if tg_host.size else np.zeros((N, smax), np.int64)
    elif tg_host.ndim == 2:
        if tg_host.shape[0] != N or tg_host.shape[1] < smax:
            raise RuntimeError(f"{fname}(): padded targets must be (N={N}, S >= {smax}), got "
                               f"shape {shape_str(tg_host.shape)}")
        padded = tg_host[:, :smax]
    else:
        raise RuntimeError(f"{fname}(): targets must be 1-D or 2-D, got shape "
                           f"{shape_str(tg_host.shape)}")
    padded = padded.astype(np.int64)
    valid = np.arange(smax)[None, :] < tgt_len[:, None]
    if valid.any() and (padded[valid].min() < 0 or padded[valid].max() >= C):
        raise RuntimeError(f"{fname}(): a target label is outside [0, {C})")
    padded = np.where(valid, padded, blank)
    return padded


def ctc_loss(log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any,
             blank: int = 0, reduction: str = "mean", zero_infinity: bool = False) -> Tensor:
    """The connectionist temporal classification loss of label sequences given per-step
    class log-probabilities.

    Args:
        log_probs: (T, N, C) or unbatched (T, C) log-probabilities (a ``log_softmax``).
        targets: (N, S) padded label sequences, their concatenation (sum(target_lengths),),
            or unbatched (S,); no label may be ``blank``.
        input_lengths, target_lengths: (N,) tensors or tuples of ints.
        blank: the blank class.
        reduction: ``'none'`` (per sample), ``'sum'``, or ``'mean'`` (each sample's loss
            divided by its target length, then averaged over the batch).
        zero_infinity: give impossible alignments a loss and gradient of 0 instead of inf.

    Raises:
        RuntimeError: lengths of the wrong count or beyond the inputs, a blank out of range,
            targets too short for their lengths.

    Example:
        >>> import mpitensor as mt
        >>> lp = mt.zeros(3, 1, 2)  # every class has log-probability 0
        >>> round(float(ctc_loss(lp, mt.tensor([[1]]), (3,), (1,), reduction="sum")), 4)
        -1.7918
    """
    fname = "ctc_loss"
    red = reduction_of(reduction, None, None, fname)
    lp_t = as_tensor(log_probs, "log_probs", fname)
    check_float(lp_t, "log_probs", fname)
    tg = as_tensor(targets, "targets", fname)._data
    if _dt.kind_of(tg.dtype) not in "iu":
        raise RuntimeError(f"{fname}(): targets must hold integers, got {tg.dtype}")
    unbatched = lp_t.ndim == 2
    if lp_t.ndim not in (2, 3):
        raise RuntimeError(f"{fname}(): log_probs must be (T, N, C) or (T, C), got shape "
                           f"{shape_str(lp_t.shape)}")
    lp3 = lp_t.unsqueeze(1) if unbatched else lp_t
    T, N, C = lp3.shape
    if not 0 <= int(blank) < C:
        raise RuntimeError(f"{fname}(): blank must be in [0, {C}), got {blank}")
    xp = xp_of(lp_t)
    in_len = _lengths(input_lengths, "input_lengths", N, xp)
    tgt_len = _lengths(target_lengths, "target_lengths", N, xp)
    if in_len.size and int(in_len.max()) > T:
        raise RuntimeError(f"{fname}(): input_lengths must be at most T={T}, got "
                           f"{in_len.tolist()}")
    padded = _padded_targets(tg, unbatched, tgt_len, N, C, int(blank), xp)
    smax = padded.shape[1]
    L = 2 * smax + 1
    ext = np.full((N, L), int(blank), dtype=np.int64)
    ext[:, 1::2] = padded
    skip = np.zeros((N, L), dtype=bool)
    skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
    if xp is not np:
        ext, skip, in_dev, tl_dev = (xp.asarray(a) for a in (ext, skip, in_len, tgt_len))
    else:
        in_dev, tl_dev = in_len, tgt_len
    nll = _CTC.apply(lp3, ext, skip, in_dev, tl_dev, bool(zero_infinity))
    if red == "none":
        return nll[0] if unbatched else nll
    if red == "sum":
        return nll.sum()
    div = np.maximum(tgt_len, 1).astype(lp_t._data.dtype)
    return (nll / _new(div if xp is np else xp.asarray(div))).mean()
