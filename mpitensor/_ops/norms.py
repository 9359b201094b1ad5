"""Norms and distances: ``vector_norm``, ``matrix_norm`` (Frobenius, nuclear, spectral and
the max/min row or column sums), ``norm``, ``dist``, ``cdist``, ``renorm``, with gradients.

Example:
    >>> import mpitensor as mt
    >>> mt.tensor([3.0, 4.0]).norm()
    tensor(5.)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core import autocast as _autocast
from mpitensor._core.devices import xp
from mpitensor._core.dims import wrap_dim
from mpitensor._core.half import computes_in_float32
from mpitensor._core.opkit import (
    Function,
    Tensor,
    assign_result,
    run,
    serve,
    tensor_methods,
)
from mpitensor._ops.linalg import tensor_arg
from mpitensor._ops.reductions import _unreduced


@computes_in_float32
class VectorNorm(Function):
    """The ``ord``-norm of the elements over ``dim``: ``sum(|x|^p)^(1/p)``, the largest
    (``inf``) or smallest (``-inf``) ``|x|``, or the number of non-zero elements (0). The
    gradient is torch's: 0 where the norm is 0, shared evenly between ties for ``+-inf``."""

    @staticmethod
    def forward(ctx: Any, x: Any, p: float, dim: Any, keepdim: bool) -> Any:
        m = xp(x)
        a = m.abs(x)
        if a.dtype != x.dtype and x.dtype.kind != "c":
            a = a.astype(x.dtype)
        axis = dim
        with np.errstate(all="ignore"):
            if p == math.inf:
                out = a.max(axis=axis, keepdims=keepdim)
            elif p == -math.inf:
                out = a.min(axis=axis, keepdims=keepdim)
            elif p == 0:
                out = (a != 0).sum(axis=axis, keepdims=keepdim).astype(a.dtype)
            elif p == 1:
                out = a.sum(axis=axis, keepdims=keepdim)
            elif p == 2:
                out = m.sqrt((a * a).sum(axis=axis, keepdims=keepdim))
            else:
                out = (a ** p).sum(axis=axis, keepdims=keepdim) ** (1.0 / p)
        out = m.asarray(out)
        ctx.meta = (p, axis, keepdim)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        p, axis, keepdim = ctx.meta
        x, g, out = _unreduced(ctx, g, axis, keepdim)
        shape = x.shape
        m = xp(g)
        a = m.abs(x)
        sgn = m.sign(x)
        with np.errstate(all="ignore"):
            if p == 0:
                gx = m.zeros(shape, dtype=g.dtype)
            elif p == 1:
                gx = g * sgn
            elif p == 2:
                gx = m.where(out == 0, 0, g * x / m.where(out == 0, 1, out))
            elif p in (math.inf, -math.inf):
                mask = a == out
                count = mask.sum(axis=axis, keepdims=True)
                gx = g * sgn * mask / count
            else:
                gx = g * x * a ** (p - 2) / out ** (p - 1)
                gx = m.where((x == 0) | (out == 0), 0, gx)
        return m.broadcast_to(gx, shape).astype(x.dtype, copy=False), None, None, None


def vector_norm(x: Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
                dtype: Any = None) -> Tensor:
    """Return the ``ord``-norm of ``x``'s elements over ``dim`` (all when None).

    Args:
        ord: a number, ``inf`` or ``-inf`` (default 2).
        dim: an int, a tuple of ints, or None.
        keepdim: keep the reduced dimensions with size 1.
        dtype: compute in this dtype.

    Raises:
        TypeError: an integer or bool tensor.

    Example:
        >>> import mpitensor as mt
        >>> vector_norm(mt.tensor([3.0, 4.0]))
        tensor(5.)
    """
    x = tensor_arg(x, "vector_norm()")
    if dtype is not None:
        x = x.to(dtype)
    d = x._data
    if _dt.kind_of(d.dtype) not in "fc":
        raise TypeError(f"vector_norm(): expected a floating point or complex tensor, got "
                        f"{_dt.dt_repr(d.dtype)}")
    if isinstance(ord, str):
        raise ValueError(f"vector_norm(): ord must be a number, got {ord!r}")
    axis = None
    if dim is not None:
        dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
        axis = tuple(sorted(wrap_dim(v, d.ndim) for v in dims)) if d.ndim else None
        if axis == ():
            axis = None
    if d.size == 0 and (ord < 0 or ord == math.inf):
        raise ValueError(f"vector_norm(): the norm of order {ord} of an empty tensor is not "
                         f"defined")
    return run(VectorNorm, x, float(ord), axis, bool(keepdim))


@computes_in_float32
class SvdNorm(Function):
    """Matrix norms of the singular values (``nuc``: their sum, 2: the largest, -2: the
    smallest): the gradient is ``U diag(w) V^T`` for the weights ``w`` of that choice."""

    @staticmethod
    def forward(ctx: Any, a: Any, kind: str) -> Any:
        m = xp(a)
        u, s, vh = m.linalg.svd(a, full_matrices=False)
        if kind == "nuc":
            out, w = s.sum(-1), m.ones_like(s)
        else:
            k = m.argmax(s, axis=-1) if kind == "max" else m.argmin(s, axis=-1)
            w = (m.arange(s.shape[-1]) == k[..., None]).astype(s.dtype)
            out = (s * w).sum(-1)
        ctx.save_for_backward(u, w, vh)
        return m.asarray(out)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        u, w, vh = ctx.saved_tensors
        return (g[..., None, None] * ((u * w[..., None, :]) @ vh)), None


def matrix_norm(a: Tensor, ord: Any = "fro", dim: Any = (-2, -1), keepdim: bool = False,  # noqa: A002
                *, dtype: Any = None) -> Tensor:
    """Return a matrix norm over the two dimensions ``dim``: ``"fro"``, ``"nuc"``, ``inf``,
    ``-inf``, 1, -1, 2 or -2, as ``torch.linalg.matrix_norm``.

    Raises:
        ValueError: an unknown ``ord``, or fewer than 2 dimensions.
    """
    a = tensor_arg(a, "matrix_norm()")
    if dtype is not None:
        a = a.to(dtype)
    x = a._data
    if x.ndim < 2:
        raise ValueError(f"matrix_norm(): the input must have at least 2 dimensions, got "
                         f"{x.ndim}")
    d0, d1 = (wrap_dim(d, x.ndim) for d in dim)
    if d0 == d1:
        raise ValueError("matrix_norm(): dim must name two different dimensions")
    if ord == "fro":
        return vector_norm(a, 2, (d0, d1), keepdim)
    if ord in ("nuc", 2, -2):
        moved = a.movedim((d0, d1), (-2, -1))
        out = run(SvdNorm, moved, {"nuc": "nuc", 2: "max", -2: "min"}[ord])
        if keepdim:
            for d in sorted((d0, d1)):
                out = out.unsqueeze(d)
        return out
    if ord in (1, -1, math.inf, -math.inf):
        # 1: the largest column sum of |a|; inf: the largest row sum
        sum_dim, pick_dim = (d0, d1) if ord in (1, -1) else (d1, d0)
        sums = a.abs().sum(sum_dim, keepdim=True)
        out = sums.amax(pick_dim, keepdim=True) if ord > 0 else sums.amin(pick_dim, keepdim=True)
        return out if keepdim else out.squeeze((d0, d1))
    raise ValueError(f"matrix_norm(): ord must be 'fro', 'nuc', inf, -inf, 1, -1, 2 or -2, "
                     f"got {ord!r}")


def norm(input: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False,  # noqa: A002
         dtype: Any = None) -> Tensor:
    """Return a norm of ``input``, as ``torch.norm``: ``"fro"`` (the 2-norm of the elements
    over ``dim``), ``"nuc"`` (a matrix norm), or a number ``p`` (a vector ``p``-norm over
    ``dim``, all elements when None).

    Raises:
        TypeError: an integer or bool tensor.
        ValueError: an unknown ``p``.
    """
    input = tensor_arg(input, "norm()")  # noqa: A001
    if p == "fro":
        return vector_norm(input, 2, dim, keepdim, dtype=dtype)
    if p == "nuc":
        return matrix_norm(input, "nuc", (-2, -1) if dim is None else dim, keepdim,
                           dtype=dtype)
    if isinstance(p, str):
        raise ValueError(f"norm(): p must be 'fro', 'nuc' or a number, got {p!r}")
    return vector_norm(input, 2 if p is None else p, dim, keepdim, dtype=dtype)



def dist(input: Tensor, other: Tensor, p: float = 2) -> Tensor:  # noqa: A002
    """Return the ``p``-norm of ``input - other`` (broadcast)."""
    return vector_norm(input - other, p)


@_autocast.op("cdist")
def cdist(x1: Tensor, x2: Tensor, p: float = 2.0, compute_mode: Any = None) -> Tensor:
    """Return the ``p``-norm distances between the rows of ``x1`` (``... x P x M``) and those
    of ``x2`` (``... x R x M``): a ``... x P x R`` tensor.

    Raises:
        ValueError: fewer than 2 dimensions, or rows of different lengths.
    """
    x1, x2 = tensor_arg(x1, "cdist()"), tensor_arg(x2, "cdist()")
    if x1.dim() < 2 or x2.dim() < 2 or x1.shape[-1] != x2.shape[-1]:
        raise ValueError(f"cdist(): expects ... x P x M and ... x R x M tensors, got "
                         f"{list(x1.shape)} and {list(x2.shape)}")
    return vector_norm(x1.unsqueeze(-2) - x2.unsqueeze(-3), p, -1)


@tensor_methods
class _NormMethods:
    def norm(self, p: Any = "fro", dim: Any = None, keepdim: bool = False,
             dtype: Any = None) -> Tensor:
        """Return a norm of self (see :func:`norm`)."""
        return norm(self, p, dim, keepdim, dtype)

    def dist(self, other: Tensor, p: float = 2) -> Tensor:
        """Return the ``p``-norm of ``self - other``."""
        return vector_norm(self - other, p)

    def renorm(self, p: float, dim: int, maxnorm: float) -> Tensor:
        """Return self with each slice along ``dim`` whose ``p``-norm exceeds ``maxnorm``
        scaled down to that norm."""
        n = self._data.ndim
        d = wrap_dim(dim, n)
        others = tuple(i for i in range(n) if i != d)
        norms = vector_norm(self, p, others, keepdim=True)
        from mpitensor._ops.combine import where  # noqa: PLC0415 - imported by now

        return self * where(norms > maxnorm, maxnorm / (norms + 1e-7), 1.0)

    def renorm_(self, p: float, dim: int, maxnorm: float) -> Tensor:
        """:meth:`renorm` in place; returns self."""
        # from a copy: the product saves its operand, which the write would change
        return assign_result(self, self.clone().renorm(p, dim, maxnorm), "renorm_()")


serve({"dist": dist, "cdist": cdist})
