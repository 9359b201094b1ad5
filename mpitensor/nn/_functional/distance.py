"""Norms and distances of ``torch.nn.functional``: ``normalize``, ``cosine_similarity``,
``pairwise_distance``, ``pdist``, built on one differentiable vector p-norm.

The p-norm's gradient follows torch's conventions: 0 where the norm is 0 (rather than nan),
shared evenly among tied maxima for ``p = inf``, and 0 for ``p = 0``.

Re-exported by :mod:`mpitensor.nn.functional`; import them from there.

Example:
    >>> import mpitensor as mt
    >>> pairwise_distance(mt.tensor([[0.0, 0.0]]), mt.tensor([[3.0, 4.0]]), eps=0.0)
    tensor([5.])
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from mpitensor._core import half as _half
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

from .checks import (
    PassClamped,
    arr,
    as_tensor,
    check_float,
    is_number,
    quiet,
    shape_str,
    wrap_dim,
    xp_of,
)

__all__ = ["normalize", "cosine_similarity", "pairwise_distance", "pdist"]


def _p(p: Any, fname: str) -> float:
    if not is_number(p):
        raise TypeError(f"{fname}(): p must be a real number, got {p!r}")
    return float(p)


@_half.computes_in_float32
class _VectorNorm(Function):
    """``||x||_p`` over ``axes`` (a tuple), keeping them as size 1 when ``keepdim``."""

    @staticmethod
    def forward(ctx: Any, x: Any, p: float, axes: tuple, keepdim: bool) -> Any:
        xp = xp_of(x)
        a = abs(x)
        with quiet(xp):
            if p == 2:
                n = xp.sqrt((a * a).sum(axis=axes, keepdims=True))
            elif p == 1:
                n = a.sum(axis=axes, keepdims=True)
            elif p == math.inf:
                n = a.max(axis=axes, keepdims=True) if a.size else a.sum(axis=axes,
                                                                          keepdims=True)
            elif p == -math.inf:
                n = a.min(axis=axes, keepdims=True)
            elif p == 0:
                n = (a != 0).sum(axis=axes, keepdims=True).astype(x.dtype)
            else:
                n = ((a ** p).sum(axis=axes, keepdims=True)) ** (1.0 / p)
        n = n.astype(x.dtype, copy=False)
        ctx.save_for_backward(x, n)
        ctx.args = (p, axes, keepdim)
        return n if keepdim else n.reshape([s for i, s in enumerate(n.shape) if i not in axes])

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, n = ctx.saved_tensors
        p, axes, keepdim = ctx.args
        xp = xp_of(x)
        g = g.reshape(n.shape)
        zero = xp.zeros((), x.dtype)
        with quiet(xp):
            if p == 0:
                gx = xp.zeros_like(x)
            elif p == 1:
                gx = xp.sign(x) * g
            elif p in (math.inf, -math.inf):
                hit = (abs(x) == n)
                count = hit.sum(axis=axes, keepdims=True)
                gx = xp.sign(x) * hit * (g / count)
            elif p == 2:
                gx = xp.where(n == 0, zero, x * (g / n))
            else:
                scale = xp.where(n == 0, zero, g / n ** (p - 1))
                gx = x * abs(x) ** (p - 2) * scale
        return gx.astype(x.dtype, copy=False), None, None, None


def vector_norm(x: Tensor, p: float, dims: Any, keepdim: bool = False) -> Tensor:
    """The differentiable p-norm of ``x`` over ``dims`` (an int, a tuple, or None for all)."""
    nd = x.ndim
    if dims is None:
        axes = tuple(range(nd))
    elif isinstance(dims, (tuple, list)):
        axes = tuple(sorted(wrap_dim(d, nd, "norm") for d in dims))
    else:
        axes = (wrap_dim(dims, nd, "norm"),)
    if nd == 0:
        axes = ()
    return _VectorNorm.apply(x, float(p), axes, bool(keepdim))


def normalize(input: Any, p: float = 2.0, dim: int = 1, eps: float = 1e-12,  # noqa: A002
              out: Optional[Tensor] = None) -> Tensor:
    """Divide ``input`` by its p-norm along ``dim``, the norm floored at ``eps``.

    Args:
        input: a floating point tensor.
        p: the norm's exponent.
        dim: the dimension (or tuple of dimensions) normalised over.
        eps: the smallest divisor (a zero vector stays zero).
        out: a tensor to write the result into (not differentiable, as in torch).

    Example:
        >>> import mpitensor as mt
        >>> normalize(mt.tensor([[3.0, 4.0]]))
        tensor([[0.6000, 0.8000]])
    """
    t = as_tensor(input, "input", "normalize")
    check_float(t, "input", "normalize")
    n = vector_norm(t, _p(p, "normalize"), dim, keepdim=True)
    res = t / n.clamp(min=float(eps))
    if out is not None:
        from mpitensor.autograd import no_grad  # noqa: PLC0415 - light

        with no_grad():
            out.copy_(res)
        return out
    return res


def _broadcast_pair(fname: str, x1: Any, x2: Any) -> tuple:
    a, b = as_tensor(x1, "x1", fname), as_tensor(x2, "x2", fname)
    try:
        shape = tuple(np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
    except ValueError:
        raise RuntimeError(f"{fname}(): x1 of shape {shape_str(a.shape)} and x2 of shape "
                           f"{shape_str(b.shape)} do not broadcast together") from None
    check_float(a, "x1", fname)
    check_float(b, "x2", fname)
    if a.dtype != b.dtype:
        from mpitensor._core.promotion import promote  # noqa: PLC0415 - light

        dt = promote(arr(a).dtype, arr(b).dtype)
        a, b = a.to(dt), b.to(dt)
    return a, b, shape


def cosine_similarity(x1: Any, x2: Any, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """The cosine of the angle between ``x1`` and ``x2`` along ``dim`` (they broadcast).

    Each vector is divided by its 2-norm floored at ``eps`` (the floor passes the gradient as
    if absent, as torch's does), then the two are multiplied and summed.

    Example:
        >>> import mpitensor as mt
        >>> cosine_similarity(mt.tensor([[1.0, 0.0]]), mt.tensor([[1.0, 1.0]]))
        tensor([0.7071])
    """
    a, b, shape = _broadcast_pair("cosine_similarity", x1, x2)
    d = wrap_dim(dim, len(shape), "cosine_similarity")
    if a.ndim < len(shape):
        a = a.reshape((1,) * (len(shape) - a.ndim) + tuple(a.shape))
    if b.ndim < len(shape):
        b = b.reshape((1,) * (len(shape) - b.ndim) + tuple(b.shape))
    na = PassClamped.apply(vector_norm(a, 2.0, d, keepdim=True), float(eps))
    nb = PassClamped.apply(vector_norm(b, 2.0, d, keepdim=True), float(eps))
    return ((a / na) * (b / nb)).sum(d)


def pairwise_distance(x1: Any, x2: Any, p: float = 2.0, eps: float = 1e-6,
                      keepdim: bool = False) -> Tensor:
    """``||x1 - x2 + eps||_p`` over the last dimension (the inputs broadcast).

    Example:
        >>> import mpitensor as mt
        >>> pairwise_distance(mt.tensor([[1.0, 1.0]]), mt.tensor([[1.0, 1.0]]), eps=0.0)
        tensor([0.])
    """
    a, b, shape = _broadcast_pair("pairwise_distance", x1, x2)
    diff = a - b + float(eps)
    if diff.ndim == 0:
        n = vector_norm(diff, _p(p, "pairwise_distance"), None)
        return n.reshape((1,)) if keepdim else n
    return vector_norm(diff, _p(p, "pairwise_distance"), -1, keepdim=bool(keepdim))


def pdist(input: Any, p: float = 2.0) -> Tensor:  # noqa: A002 - torch's name
    """The p-norm distances between the rows of a (N, M) input, for every pair i < j (row-major
    order): N * (N - 1) / 2 values.

    Raises:
        RuntimeError: an input that is not 2-D, or a negative ``p``.

    Example:
        >>> import mpitensor as mt
        >>> pdist(mt.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]]))
        tensor([5.0000, 1.0000, 4.2426])
    """
    t = as_tensor(input, "input", "pdist")
    check_float(t, "input", "pdist")
    if t.ndim != 2:
        raise RuntimeError(f"pdist(): expected a 2-D input (N, M), got shape "
                           f"{shape_str(t.shape)}")
    pv = _p(p, "pdist")
    if pv < 0:
        raise RuntimeError(f"pdist(): p must be non-negative, got {pv}")
    n = t.shape[0]
    i, j = np.triu_indices(n, 1)
    xp = xp_of(t)
    if xp is not np:
        i, j = xp.asarray(i), xp.asarray(j)
    if i.size == 0:
        return (t.sum() * 0).reshape((1,))[:0]
    return vector_norm(t[i] - t[j], pv, 1)
