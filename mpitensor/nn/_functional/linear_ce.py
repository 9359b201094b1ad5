"""The chunking options of ``torch.nn.functional.linear_cross_entropy``
(:class:`LinearCrossEntropyOptions`) and its chunked path; the function itself, the cross
entropy of ``linear(input, weight, bias)`` against the targets, is in
:mod:`mpitensor.nn.functional`.

Without options it is exactly that composition (the logits are made in full). With options,
the batch is processed ``batch_chunk_size`` rows at a time inside one autograd function that
works out the input, weight and bias gradients as it goes, so the (batch, classes) logits
never exist at once: the memory-saving path for large vocabularies. That path takes 2-D
inputs, class-index targets, a (C,) bias and the 'mean' or 'sum' reduction; anything else
falls back to the composition with a warning, as torch's does.

Re-exported by :mod:`mpitensor.nn.functional`; import it from there.

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.nn.functional import linear_cross_entropy
    >>> x, w = mt.randn(6, 4), mt.randn(10, 4)
    >>> t = mt.tensor([1, 2, 3, 4, 5, 6])
    >>> a = linear_cross_entropy(x, w, t)
    >>> b = linear_cross_entropy(x, w, t, options=LinearCrossEntropyOptions(batch_chunk_size=4))
    >>> abs(float(a) - float(b)) < 1e-5
    True
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Optional

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

from .checks import as_tensor, xp_of

__all__ = ["LinearCrossEntropyOptions"]

_POLICIES = ("accurate", "balanced", "compact", "auto")
#: logits per chunk when the options leave the chunk size to us
_AUTO_LOGITS = 1 << 22


@dataclasses.dataclass
class LinearCrossEntropyOptions:
    """How :func:`linear_cross_entropy` chunks its batch.

    Args:
        allow_retain_graph: accepted for torch's signature (the gradients kept here may be
            backpropagated more than once either way).
        batch_chunk_size: rows per chunk; None picks one so a chunk's logits stay near 4 M
            values.
        chunking_method: ``'auto'``, None, or ``'batch'`` (only batch chunking exists here).
        acc_policy: ``'accurate'`` accumulates the weight gradient in float64;
            ``'balanced'``, ``'compact'`` and ``'auto'`` in the input's dtype.
        acc_dtype: the accumulation dtype, overriding ``acc_policy``.

    Raises:
        ValueError: an unknown policy or method, or a non-positive chunk size.

    Example:
        >>> LinearCrossEntropyOptions(batch_chunk_size=128).batch_chunk_size
        128
    """

    allow_retain_graph: bool = False
    batch_chunk_size: Optional[int] = None
    chunking_method: Optional[str] = "auto"
    acc_policy: str = "auto"
    acc_dtype: Any = None

    def __post_init__(self) -> None:
        if self.acc_policy not in _POLICIES:
            raise ValueError(f"LinearCrossEntropyOptions: acc_policy must be one of "
                             f"{list(_POLICIES)}, got {self.acc_policy!r}")
        if self.chunking_method not in (None, "auto", "batch"):
            raise ValueError(f"LinearCrossEntropyOptions: chunking_method must be 'auto', "
                             f"'batch' or None here (only the batch is chunked), got "
                             f"{self.chunking_method!r}")
        if self.batch_chunk_size is not None and (not isinstance(self.batch_chunk_size, int)
                                                  or self.batch_chunk_size < 1):
            raise ValueError(f"LinearCrossEntropyOptions: batch_chunk_size must be a positive "
                             f"int or None, got {self.batch_chunk_size!r}")


class _ChunkedLinearCE(Function):
    """The loss (a scalar) and, computed alongside, the gradients of x, W and b."""

    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, t: Any, cw: Any, ignore: int, smooth: float,
                reduction: str, chunk: int, acc: Any) -> Any:
        xp = xp_of(x)
        n, c = x.shape[0], w.shape[0]
        dx = xp.empty_like(x)
        dw = xp.zeros(w.shape, dtype=acc)
        db = xp.zeros(c, dtype=acc) if b is not None else None
        total = xp.zeros((), dtype=acc)
        denom = xp.zeros((), dtype=acc)
        wsum = None if cw is None else cw.sum()
        for lo in range(0, n, chunk):
            xs, ts = x[lo:lo + chunk], t[lo:lo + chunk]
            z = xs @ w.T
            if b is not None:
                z = z + b
            z = z - z.max(axis=1, keepdims=True)
            lse = xp.log(xp.exp(z).sum(axis=1, keepdims=True))
            logp = z - lse
            p = xp.exp(logp)
            keep = ts != ignore
            safe = xp.where(keep, ts, 0)
            rows = xp.arange(xs.shape[0])
            wy = xp.ones(xs.shape[0], dtype=x.dtype) if cw is None else cw[safe]
            wy = xp.where(keep, wy, 0).astype(x.dtype)
            nll = -logp[rows, safe] * wy
            smooth_row = -(logp.sum(axis=1) if cw is None else logp @ cw) * keep
            total += ((1 - smooth) * nll.sum() + smooth / c * smooth_row.sum()).astype(acc)
            denom += wy.sum().astype(acc)
            # d loss_row / d logits
            scale = (1 - smooth) * wy + (smooth / c) * (c if cw is None else wsum) * keep
            g = p * scale[:, None]
            g[rows, safe] -= (1 - smooth) * wy
            if smooth:
                g -= (smooth / c) * (keep[:, None] if cw is None else cw[None] * keep[:, None])
            dx[lo:lo + chunk] = g @ w
            dw += (g.T @ xs).astype(acc)
            if db is not None:
                db += g.sum(axis=0).astype(acc)
        div = denom if reduction == "mean" else xp.ones((), dtype=acc)
        ctx.grads = (dx / div.astype(x.dtype), (dw / div).astype(w.dtype),
                     None if db is None else (db / div).astype(b.dtype))
        return (total / div).astype(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        dx, dw, db = ctx.grads
        return (dx * g, dw * g, None if db is None else db * g, None, None, None, None, None,
                None, None)


def _chunk_size(options: LinearCrossEntropyOptions, n: int, c: int) -> int:
    if options.batch_chunk_size is not None:
        return int(options.batch_chunk_size)
    return max(1, min(n, _AUTO_LOGITS // max(c, 1)))


def chunked_linear_cross_entropy(fname: str, x: Tensor, w: Tensor, linear_bias: Any,
                                 t: Tensor, weight: Any, red: str, ignore: int,
                                 label_smoothing: float,
                                 options: LinearCrossEntropyOptions) -> Optional[Tensor]:
    """The chunked path, or None (after a warning) where it does not apply."""
    ok = (x.ndim == 2 and w.ndim == 2 and red in ("mean", "sum")
          and _dt.kind_of(t.dtype) in "iu" and t.ndim == 1
          and (linear_bias is None or as_tensor(linear_bias, "linear_bias", fname).ndim == 1))
    if not ok:
        warnings.warn(f"{fname}(): the chunked path takes 2-D inputs, (C, in) weights, "
                      f"(C,) biases, class-index targets and the 'mean' or 'sum' "
                      f"reduction; computing the logits in full instead", stacklevel=3)
        return None
    b = None if linear_bias is None else as_tensor(linear_bias, "linear_bias", fname)
    cw = None if weight is None else as_tensor(weight, "weight", fname)._data
    acc = options.acc_dtype
    acc = np.dtype(np.float64) if acc is None and options.acc_policy == "accurate" else (
        x._data.dtype if acc is None else _dt.to_dtype(acc))
    tv = t._data
    if tv.shape[0] != x.shape[0]:
        raise ValueError(f"{fname}(): expected {x.shape[0]} targets, got {tv.shape[0]}")
    return _ChunkedLinearCE.apply(x, w, b, tv.astype(np.int64, copy=False), cw, ignore,
                                  float(label_smoothing), red,
                                  _chunk_size(options, x.shape[0], w.shape[0]), acc)
