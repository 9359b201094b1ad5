"""Batch norm whose statistics cover the batches of every rank of a process group.

The autograd function behind :class:`~mpitensor.nn.SyncBatchNorm` in training mode. Like DDP,
it is a place where autograd meets communication: it calls ``mpitensor.distributed``'s
collectives on raw arrays, never MPI itself. Per call:

- **forward, one all_gather** of each rank's ``(count, mean, M2)`` per channel (M2: the sum of
  squared deviations from that rank's mean), in float64. Both are two-pass, as in
  :func:`~mpitensor.nn.functional.batch_norm`, and corrected by the deviations' own sum, which
  removes the rounding of the first-pass mean. Every rank then combines the gathered triples
  in the same order (Chan's parallel formula, ``M2 = sum M2_r + sum n_r (mean_r - mean)^2``),
  which adds only non-negative terms, so all ranks hold bitwise the same global statistics
  and nothing cancels. (An all_reduce of ``sum x`` and ``sum x^2`` would be smaller on very
  large worlds, but ``E[x^2] - E[x]^2`` cancels: in float32 it misses the variance by percents
  once the mean is a few hundred standard deviations away from 0.)
- **backward, one all_reduce** of the two per-channel sums the input gradient needs,
  ``sum g`` and ``sum g * (x - mean)``, in float64. The weight and bias gradients stay this
  rank's own (DDP reduces them, as it does every parameter's), as in torch.

A rank with no samples takes part in both collectives with zeros. Arguments are checked
before any traffic, in the group's guarded path: a rank whose input is wrong raises there, and
its peers hear of it (PeerFailedError) instead of waiting for it.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

import mpitensor.distributed as dist
from mpitensor._base.workspace import xp_of
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

from .._kernels import norm as NK
from .checks import _arr, _as_input, _check_float, _check_same_device, _check_same_dtype
from .norm import _check_per_channel

__all__: list = []  # private module: used by mpitensor.nn.modules.normalization


def _col(v: Any, dtype: Any) -> Any:
    """A per-channel vector in ``dtype``, shaped to broadcast over (A, C, B)."""
    return v.astype(dtype, copy=False).reshape(1, -1, 1)


def _combine(gathered: Any, C: int) -> tuple:
    """Global ``(count, mean, biased_var)`` from the ranks' rows of ``(n, mean, M2)``.

    ``mean`` and ``var`` are float64 (C,) arrays, None when no rank had a sample.
    """
    counts = gathered[:, :1]
    count = float(counts.sum())
    if count == 0:
        return 0.0, None, None
    means = gathered[:, 1:C + 1]
    mean = (counts * means).sum(axis=0) / count
    m2 = gathered[:, C + 1:].sum(axis=0) + (counts * (means - mean) ** 2).sum(axis=0)
    return count, mean, m2 / count


class _SyncBatchNorm(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, rm: Any, rv: Any, momentum: float, eps: float,
                group: Any) -> Any:
        xp = xp_of(x)
        C = x.shape[1]
        local = xp.zeros(2 * C + 1, dtype=np.float64)
        lay = x3 = y = y3 = None
        if x.size:
            lay = NK.channel_layout(x)
            x3 = lay.view(x)
            y, y3 = lay.empty(xp, x.dtype)
            n = lay.A * lay.B
            mean_r = NK.channel_sum(x3) / n
            xp.subtract(x3, _col(mean_r, x.dtype), out=y3)  # y3 as scratch for the deviations
            # The deviations' own sum corrects the mean for its rounding (float32's, 1e-3
            # at 1e4): the combination weighs each rank's mean, so its error would show.
            shift = NK.channel_sum(y3).astype(np.float64)
            local[0] = n
            local[1:C + 1] = mean_r + shift / n
            local[C + 1:] = NK.channel_dot(y3, y3) - shift * shift / n
        size = dist.get_world_size(group)
        gathered = xp.empty(size * (2 * C + 1), dtype=np.float64)
        dist.all_gather_into_tensor(gathered, local, group=group)
        count, mean, var = _combine(gathered.reshape(size, 2 * C + 1), C)
        ctx.layout, ctx.count, ctx.group = lay, count, group
        ctx.shape, ctx.channels = x.shape, C
        if count == 0:  # an empty global batch: no statistics, and none to update (as batch_norm)
            return xp.empty(x.shape, dtype=x.dtype)
        if count == 1:  # the same count on every rank: they all raise here, after the gather
            raise ValueError(
                f"SyncBatchNorm: training needs more than 1 value per channel over the whole "
                f"group to take a variance, but its {size} ranks hold 1 in all (this rank's "
                f"input has shape {list(x.shape)}); use bigger batches or eval mode")
        invstd = 1.0 / xp.sqrt(var + eps)
        NK.update_running_stats(rm, rv, mean, var, count, momentum)
        if x3 is None:
            y = xp.empty(x.shape, dtype=x.dtype)
        else:
            scale = invstd if w is None else invstd * w
            xp.subtract(x3, _col(mean, x.dtype), out=y3)
            xp.multiply(y3, _col(scale, x.dtype), out=y3)
            if b is not None:
                xp.add(y3, _col(b, x.dtype), out=y3)
        ctx.save_for_backward(x3, mean, invstd, w)
        return y

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        xp = xp_of(g)
        C = ctx.channels
        if ctx.layout is None:  # no sample here (or anywhere): zeros, but join the all_reduce
            if need_x and ctx.count:
                dist.all_reduce(xp.zeros(2 * C, dtype=np.float64), group=ctx.group)
            zero = xp.zeros(C, dtype=g.dtype)
            return (xp.zeros(ctx.shape, dtype=g.dtype) if need_x else None,
                    zero if need_w else None, zero.copy() if need_b else None,
                    None, None, None, None, None)
        x3, mean, invstd, w = ctx.saved_tensors
        lay = ctx.layout
        dt = g.dtype
        g3 = lay.view(g)
        dx = None
        if need_x:
            dx, xmu3 = lay.empty(xp, dt)  # x - mean now, the input gradient in the end
        else:
            _, xmu3 = lay.empty(xp, dt)
        xp.subtract(x3, _col(mean, dt), out=xmu3)
        sums = xp.empty(2 * C, dtype=np.float64)
        sums[:C] = NK.channel_sum(g3)
        sums[C:] = NK.channel_dot(g3, xmu3)
        dw = (invstd * sums[C:]).astype(dt) if need_w else None  # this rank's sum g * x_hat
        db = sums[:C].astype(dt) if need_b else None
        if need_x:
            dist.all_reduce(sums, group=ctx.group)
            n = ctx.count
            # dx = invstd * w * (g - sum g / n - (x - mean) * invstd^2 * sum g (x - mean) / n)
            k = invstd * invstd * sums[C:] / n
            a = invstd if w is None else invstd * w
            xp.multiply(xmu3, _col(k, dt), out=xmu3)
            xp.subtract(g3, xmu3, out=xmu3)
            xp.subtract(xmu3, _col(sums[:C] / n, dt), out=xmu3)
            xp.multiply(xmu3, _col(a, dt), out=xmu3)
        return dx, dw, db, None, None, None, None, None


def sync_batch_norm(input: Any, running_mean: Optional[Tensor],  # noqa: A002 - torch's name
                    running_var: Optional[Tensor], weight: Optional[Tensor],
                    bias: Optional[Tensor], momentum: float, eps: float, group: Any) -> Tensor:
    """Batch norm in training mode with the statistics of the whole group's batch.

    Every member of ``group`` (a ProcessGroup of two or more ranks, this rank among them) must
    call it with the same channel count and dtype; batch sizes may differ, and be 0. The
    running statistics, if given, are updated in place with the global mean and unbiased
    variance (the same values on every rank).

    Raises:
        TypeError, ValueError, RuntimeError: as :func:`~mpitensor.nn.functional.batch_norm`,
            for this rank's arguments, before any traffic (its peers get PeerFailedError);
            ValueError on every rank when the group holds one value per channel in all.
    """
    fname = "SyncBatchNorm"

    def check() -> None:
        _as_input(input, "input", fname)
        x = _arr(input)
        if x.ndim < 2:
            raise ValueError(f"{fname}: expected an input of at least 2 dimensions (N, C, ...), "
                             f"got shape {list(x.shape)}")
        _check_float(input, "input", fname)
        extras = {"weight": weight, "bias": bias, "running_mean": running_mean,
                  "running_var": running_var}
        for name, v in extras.items():
            if v is not None:
                _check_per_channel(fname, name, v, x.shape[1], x.shape)
        _check_same_dtype(fname, input=input, **extras)
        _check_same_device(fname, input=input, **extras)

    group.call_guarded(fname, check)
    rm = _arr(running_mean) if running_mean is not None else None
    rv = _arr(running_var) if running_var is not None else None
    return _SyncBatchNorm.apply(input, weight, bias, rm, rv, float(momentum), float(eps), group)
