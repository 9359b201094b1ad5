"""Reductions over dimensions (``sum``, ``prod``, ``mean``, ``var``, ``std``, ``max``, ``min``,
``argmax``, ``argmin``, ``all``, ``any``), ordering along one (``sort``, ``argsort``, ``topk``)
and the gradients of the differentiable ones.

``dim`` is None (every element), an int, or a tuple of ints, as in torch. Integer and bool
tensors sum and multiply in int64; ``mean`` wants a float or complex dtype. ``max``/``min``
with a ``dim`` return ``(values, indices)`` named tuples; ``var`` records through ``mean`` and
the operators rather than an op of its own. ``sort`` and ``topk`` also return
``(values, indices)``; their values take their gradient back to the positions they came from.
NaN sorts above every number, as in torch.

Example:
    >>> import mpitensor as mt
    >>> mt.tensor([[1, 5], [7, 2]]).max(dim=1)
    mpitensor.return_types.max(
    values=tensor([5, 7]),
    indices=tensor([1, 0]))
"""

from __future__ import annotations

import math
import operator
from collections import namedtuple
from typing import Any, Optional

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import dtypes as _dt
from mpitensor._core import autocast as _autocast
from mpitensor._core import half as _half
from mpitensor._core.devices import xp
from mpitensor._core.dims import axes, wrap_dim
from mpitensor._core.opkit import run, tensor_methods, wrap
from mpitensor._core.promotion import sum_dtype
from mpitensor._ops.operators import NOT_OPERAND, binary, operand
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

_INT64 = _dt.int64
_grad_mode = _autograd._mode

DTypeLike = Any


def _unreduce(g: Any, shape: tuple, axis: Any, keepdim: bool) -> Any:
    """Broadcast the gradient of a reduction back over the reduced axes (a read-only view)."""
    m = xp(g)
    if not keepdim and axis is not None and len(shape):
        g = m.expand_dims(g, axis)
    return m.broadcast_to(g, shape)


def _unreduced(ctx: Any, g: Any, axis: Any, keepdim: bool) -> tuple:
    """``(x, g, out)`` for a reduction over ``axis`` that saved its input ``x`` and output
    ``out``: ``g``, the output's gradient, and ``out`` broadcast back to ``x``'s shape."""
    x, out = ctx.saved_tensors
    return x, _unreduce(g, x.shape, axis, keepdim), _unreduce(out, x.shape, axis, keepdim)


class Sum(Function):
    """``x.sum(dim, keepdim, dtype)``: the gradient is broadcast back."""

    @staticmethod
    def forward(ctx: Any, x: Any, dim: Any, keepdim: bool, dtype: DTypeLike) -> Any:
        dt = _dt.to_dtype(dtype) if dtype is not None else sum_dtype(x.dtype)
        axis = axes(dim, x.ndim)
        ctx.meta = (x.shape, x.dtype, axis, keepdim)
        if (x.dtype if dt is None else dt) in _half.REDUCED:  # float32 accumulator, as torch
            return _half.sum(x, axis, keepdim, dt)
        return x.sum(axis=axis, dtype=dt, keepdims=keepdim)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, axis, keepdim = ctx.meta
        g = _unreduce(g, shape, axis, keepdim)
        return (g.astype(dtype) if g.dtype != dtype else g,)


class Mean(Function):
    """``x.mean(dim, keepdim, dtype)``: the gradient is broadcast back and divided by the
    number of elements averaged.

    Raises:
        TypeError: an integer or bool tensor without a float ``dtype``.
    """

    @staticmethod
    def forward(ctx: Any, x: Any, dim: Any, keepdim: bool, dtype: DTypeLike) -> Any:
        dt = _dt.to_dtype(dtype) if dtype is not None else x.dtype
        if _dt.kind_of(dt) not in "fc":
            raise TypeError(
                f"mean(): could not infer output dtype. Input dtype must be either a floating "
                f"point or complex dtype. Got: {_dt.dt_repr(dt)}; pass dtype=mpitensor.float32 "
                f"or call .float() first"
            )
        axis = axes(dim, x.ndim)
        if dt in _half.REDUCED:  # float32 accumulator, as torch
            out = _half.mean(x, axis, keepdim, dt)
        else:
            out = x.mean(axis=axis, dtype=dt, keepdims=keepdim)
        ctx.meta = (x.shape, x.dtype, axis, keepdim, x.size // max(1, out.size))
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, axis, keepdim, count = ctx.meta
        g = _unreduce(g / count, shape, axis, keepdim)
        return (g.astype(dtype) if g.dtype != dtype else g,)


class MaxAll(Function):
    """``x.max()``: the largest element; elements that tie for it share the gradient evenly."""

    largest = True

    @classmethod
    def forward(cls, ctx: Any, x: Any) -> Any:
        out = xp(x).asarray(x.max() if cls.largest else x.min())
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, out = ctx.saved_tensors
        mask = x == out
        return ((g / mask.sum()) * mask).astype(x.dtype, copy=False),


class MinAll(MaxAll):
    """``x.min()`` (see :class:`MaxAll`)."""

    largest = False


class MaxDim(Function):
    """The values of ``x.max(dim)`` (``largest``) or ``x.min(dim)``, whose ``indices`` the
    caller found with ``argmax``/``argmin``: the gradient goes back to those positions."""

    @staticmethod
    def forward(ctx: Any, x: Any, indices: Any, axis: int, keepdim: bool, largest: bool) -> Any:
        ctx.meta = (x.shape, x.dtype, axis, keepdim)
        ctx.save_for_backward(indices)
        return (x.max if largest else x.min)(axis=axis, keepdims=keepdim)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, axis, keepdim = ctx.meta
        (idx,) = ctx.saved_tensors
        m = xp(g)
        if not keepdim:
            g = m.expand_dims(g, axis)
            idx = m.expand_dims(idx, axis)
        n = shape[axis]
        pos = m.arange(n).reshape((n,) + (1,) * (len(shape) - axis - 1))
        gx = g * (pos == idx)  # a one-hot mask along the axis, broadcast to the input's shape
        return (gx.astype(dtype, copy=False),)


class MinDim(MaxDim):
    """The values of ``x.min(dim)`` (see :class:`MaxDim`)."""


class Prod(Function):
    """``x.prod(dim, keepdim, dtype)``: d/dx_i = the product of the others, found without
    dividing by zero (one zero in a slice: only it gets a gradient; two: none does)."""

    @staticmethod
    def forward(ctx: Any, x: Any, dim: Any, keepdim: bool, dtype: DTypeLike) -> Any:
        dt = _dt.to_dtype(dtype) if dtype is not None else sum_dtype(x.dtype)
        axis = axes(dim, x.ndim)
        if (x.dtype if dt is None else dt) in _half.REDUCED:  # float32 accumulator
            out = x.prod(axis=axis, dtype=_dt.float32, keepdims=keepdim).astype(
                dt or x.dtype)
        else:
            out = x.prod(axis=axis, dtype=dt, keepdims=keepdim)
        ctx.meta = (x.shape, x.dtype, axis, keepdim)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, axis, keepdim = ctx.meta
        x, gf, of = _unreduced(ctx, g, axis, keepdim)
        m = xp(g)
        if x.dtype.kind == "c":  # the conjugate of the other factors' product, as torch
            x, of = m.conj(x), m.conj(of)
        zero = x == 0
        with np.errstate(all="ignore"):
            if not zero.any():
                return (gf * of / x).astype(dtype, copy=False), None, None, None
            zeros = _unreduce(zero.sum(axis=axis, keepdims=keepdim), shape, axis, keepdim)
            others = _unreduce(m.where(zero, 1, x).prod(axis=axis, keepdims=keepdim), shape,
                               axis, keepdim)
            gx = m.where(zeros == 0, gf * of / m.where(zero, 1, x),
                         m.where((zeros == 1) & zero, gf * others, 0))
        return gx.astype(dtype, copy=False), None, None, None


class AMax(Function):
    """``amax(x, dim, keepdim)`` (``largest``) or ``amin``: the elements equal to the result
    share its gradient evenly."""

    @staticmethod
    def forward(ctx: Any, x: Any, dim: Any, keepdim: bool, largest: bool) -> Any:
        axis = axes(dim, x.ndim)
        reduced = range(x.ndim) if axis is None else np.atleast_1d(axis)
        if x.size == 0 and (x.ndim == 0 or any(x.shape[a] == 0 for a in reduced)):
            # an empty dim that is kept gives an empty result; one that is reduced has no
            # extreme
            raise ValueError(f"{'amax' if largest else 'amin'}(): cannot reduce an empty "
                             f"dim of a tensor of shape {list(x.shape)}")
        out = (x.max if largest else x.min)(axis=axis, keepdims=keepdim)
        ctx.meta = (x.shape, x.dtype, axis, keepdim)
        ctx.save_for_backward(x, out)
        return xp(x).asarray(out)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, axis, keepdim = ctx.meta
        x, gf, of = _unreduced(ctx, g, axis, keepdim)
        mask = x == of
        count = _unreduce(mask.sum(axis=axis, keepdims=keepdim), shape, axis, keepdim)
        gx = gf * mask / count
        return gx.astype(dtype, copy=False), None, None, None


@_half.computes_in_float32
class LogSumExp(Function):
    """``log(sum(exp(x)))`` over ``dim``, shifted by the maximum so that nothing overflows:
    d/dx = exp(x - out)."""

    @staticmethod
    def forward(ctx: Any, x: Any, dim: Any, keepdim: bool) -> Any:
        if _dt.kind_of(x.dtype) in "biu":
            x = x.astype(_dt.get_default_dtype())
        m = xp(x)
        axis = axes(dim, x.ndim)
        with np.errstate(all="ignore"):
            if x.size == 0:
                out = m.log(m.exp(x).sum(axis=axis, keepdims=keepdim))
            else:
                mx = x.max(axis=axis, keepdims=True)
                mx = m.where(m.isinf(mx), 0, mx)
                out = m.log(m.exp(x - mx).sum(axis=axis, keepdims=True)) + mx
                if not keepdim:
                    out = out.reshape(()) if axis is None else m.squeeze(out, axis=axis)
        ctx.meta = (axis, keepdim)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        axis, keepdim = ctx.meta
        x, gf, of = _unreduced(ctx, g, axis, keepdim)
        with np.errstate(all="ignore"):
            gx = gf * xp(g).exp(x - of)
        return gx, None, None


class NanSum(Function):
    """``nansum`` (``mean`` True: ``nanmean``): NaN counted as zero (and not counted); the
    gradient passes where ``x`` is not NaN."""

    @staticmethod
    def forward(ctx: Any, x: Any, dim: Any, keepdim: bool, dtype: DTypeLike,
                mean: bool) -> Any:
        m = xp(x)
        dt = _dt.to_dtype(dtype) if dtype is not None else (
            x.dtype if mean else sum_dtype(x.dtype))
        if mean and _dt.kind_of(dt or x.dtype) not in "fc":
            raise TypeError(f"nanmean(): expected a floating point or complex tensor, got "
                            f"{_dt.dt_repr(x.dtype)}; call .float() first")
        axis = axes(dim, x.ndim)
        valid = ~m.isnan(x) if _dt.kind_of(x.dtype) in "fc" else None
        acc = _dt.float32 if (dt or x.dtype) in _half.REDUCED else dt
        z = x if valid is None else m.where(valid, x, 0)
        with np.errstate(all="ignore"):
            out = z.sum(axis=axis, dtype=acc, keepdims=keepdim)
            count = None
            if mean:
                count = (m.ones(x.shape, dtype=_INT64) if valid is None else valid).sum(
                    axis=axis, keepdims=keepdim)
                out = out / count
        ctx.meta = (x.shape, x.dtype, axis, keepdim, count)
        ctx.save_for_backward(valid)
        return xp(x).asarray(out).astype(dt or x.dtype, copy=False)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, axis, keepdim, count = ctx.meta
        (valid,) = ctx.saved_tensors
        if count is not None:
            g = g / count
        gx = _unreduce(g, shape, axis, keepdim)
        if valid is not None:
            gx = gx * valid
        return gx.astype(dtype, copy=False), None, None, None, None


_MaxResult = namedtuple("max", ["values", "indices"])
_MinResult = namedtuple("min", ["values", "indices"])


def return_types_repr(self: Any) -> str:
    return (
        f"mpitensor.return_types.{type(self).__name__}(\n"
        f"values={self.values!r},\nindices={self.indices!r})"
    )


_MaxResult.__repr__ = return_types_repr
_MinResult.__repr__ = return_types_repr
_SortResult = namedtuple("sort", ["values", "indices"])
_SortResult.__repr__ = return_types_repr
_TopkResult = namedtuple("topk", ["values", "indices"])
_TopkResult.__repr__ = return_types_repr
_AminmaxResult = namedtuple("aminmax", ["min", "max"])
_AminmaxResult.__repr__ = lambda self: (
    f"mpitensor.return_types.aminmax(\nmin={self.min!r},\nmax={self.max!r})")


def _along(idx: Any, axis: int, m: Any) -> tuple:
    """The index tuple that picks, in an array shaped like ``idx`` except along ``axis``, the
    elements ``idx`` names along ``axis`` (``take_along_axis`` as plain indexing, which CuPy
    also writes through)."""
    key = []
    for d, n in enumerate(idx.shape):
        if d == axis:
            key.append(idx)
        else:
            key.append(m.arange(n).reshape((n,) + (1,) * (idx.ndim - d - 1)))
    return tuple(key)


class TakeAlong(Function):
    """``x``'s elements at ``indices`` along ``axis`` (the values of ``sort`` and ``topk``):
    the gradient goes back to the positions they came from (each picked at most once)."""

    @staticmethod
    def forward(ctx: Any, x: Any, indices: Any, axis: int) -> Any:
        ctx.meta = (x.shape, x.dtype, axis)
        ctx.save_for_backward(indices)
        return x[_along(indices, axis, xp(x))]

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, axis = ctx.meta
        (idx,) = ctx.saved_tensors
        m = xp(g)
        gx = m.zeros(shape, dtype=dtype)
        gx[_along(idx, axis, m)] = g
        return gx, None, None


class Sort(TakeAlong):
    """The values of ``sort`` (see :class:`TakeAlong`)."""


class Topk(TakeAlong):
    """The values of ``topk`` (see :class:`TakeAlong`)."""


def _argsort(x: Any, axis: int, descending: bool, stable: bool) -> Any:
    """The int64 order of ``x`` along ``axis``, NaN above every number; equal elements keep
    their order when ``stable``."""
    m = xp(x)
    if x.dtype.kind == "c":
        raise TypeError("sorting is not defined for complex tensors; sort .real or .abs()")
    kw = {"kind": "stable"} if stable and m is np else {}
    if not descending:
        return m.argsort(x, axis=axis, **kw).astype(_INT64, copy=False)
    # Descending as the ascending order of the reversed array, read backwards: NaN comes
    # first, and equal elements end up in their original order (stable), which negating
    # the values could give neither for NaN nor for unsigned and bool dtypes.
    n = x.shape[axis]
    a = m.argsort(m.flip(x, axis), axis=axis, **kw)
    return ((n - 1) - m.flip(a, axis)).astype(_INT64, copy=False)


def _sort_dim(x: Any, dim: int) -> int:
    return wrap_dim(dim, max(x.ndim, 1))  # a 0-d tensor takes dim 0 or -1, as in torch


def _scalar_result(t: Tensor, result: Any) -> Any:
    """``sort``/``topk`` of a 0-d tensor: the element itself, at index 0."""
    return result(t.clone(), wrap(xp(t._data).zeros((), dtype=_INT64)))


_PARTITION_MIN = 512  # elements along dim: below, one full sort beats partition + sort


def _topk_indices(x: Any, k: int, axis: int, largest: bool, sort: bool) -> Any:
    """The int64 positions of the ``k`` largest (``largest``) or smallest elements along
    ``axis``, in sorted order when ``sort``."""
    m = xp(x)
    n = x.shape[axis]
    head = (slice(None),) * axis
    if k == 0:
        shape = list(x.shape)
        shape[axis] = 0
        return m.zeros(tuple(shape), dtype=_INT64)
    if k < n and n >= _PARTITION_MIN and (4 * k <= n or n >= 1 << 14):
        # O(n) selection, then a sort of the k picked only
        if largest:
            idx = m.argpartition(x, n - k, axis=axis)[(*head, slice(n - k, n))]
        else:
            idx = m.argpartition(x, k - 1, axis=axis)[(*head, slice(0, k))]
        if sort:
            order = _argsort(x[_along(idx, axis, m)], axis, largest, False)
            idx = idx[_along(order, axis, m)]
        return idx.astype(_INT64, copy=False)
    return _argsort(x, axis, largest, False)[(*head, slice(0, k))]


def _extreme(t: Tensor, dim: Any, keepdim: bool, largest: bool) -> Any:
    """``t.max(dim, keepdim)`` (``largest``) or ``t.min(...)``, in all three forms: of every
    element, along ``dim``, or element-wise against another tensor or number."""
    x = t._data
    name = "max" if largest else "min"
    if dim is not None and not isinstance(dim, (int, np.integer)):
        if operand(dim) is NOT_OPERAND:
            raise TypeError(f"{name}() takes an int dim or a tensor, got {dim!r}")
        return binary(t, dim, getattr(xp(x), "maximum" if largest else "minimum"))
    if x.size == 0 and (dim is None or x.ndim == 0 or x.shape[wrap_dim(dim, x.ndim)] == 0):
        raise ValueError(
            f"{name}(): cannot reduce an empty tensor of shape {list(x.shape)}; "
            f"it has no {name}imum"
        )
    if dim is None:
        return run(MaxAll if largest else MinAll, t)
    result = _MaxResult if largest else _MinResult
    if x.ndim == 0:  # the element itself, at index 0
        wrap_dim(dim, 0)
        return result(t.clone(), wrap(xp(x).zeros((), dtype=_INT64)))
    axis = wrap_dim(dim, x.ndim)
    indices = (x.argmax if largest else x.argmin)(axis=axis, keepdims=keepdim)
    indices = indices.astype(_INT64, copy=False)
    values = run(MaxDim if largest else MinDim, t, indices, axis, keepdim, largest)
    return result(values, wrap(indices))


@tensor_methods
class _ReductionMethods:
    def sum(self, dim: Any = None, keepdim: bool = False, *, dtype: DTypeLike = None) -> Tensor:
        """Return the sum over ``dim`` (an int, a tuple, or None for all elements).

        Integer and bool tensors sum to int64, as in torch.

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([[1, 2], [3, 4]]).sum(dim=0)
            tensor([4, 6])
        """
        if _autocast.ON and _autocast.active():
            return _autocast.run("sum", Tensor.sum, self, dim, keepdim, dtype=dtype)
        return run(Sum, self, dim, keepdim, dtype)

    @_autocast.op("prod")
    def prod(self, dim: Any = None, keepdim: bool = False, *, dtype: DTypeLike = None) -> Tensor:
        """Return the product over ``dim`` (integers and bools multiply in int64).

        Differentiable, also where elements are zero.
        """
        return run(Prod, self, dim, keepdim, dtype)

    def mean(self, dim: Any = None, keepdim: bool = False, *, dtype: DTypeLike = None) -> Tensor:
        """Return the mean over ``dim``; the tensor (or ``dtype``) must be float or complex.

        Raises:
            TypeError: an integer or bool tensor without a float ``dtype``.
        """
        return run(Mean, self, dim, keepdim, dtype)

    def var(self, dim: Any = None, unbiased: Optional[bool] = None, keepdim: bool = False, *,
            correction: Any = None) -> Tensor:
        """Return the variance over ``dim``, divided by ``N - correction`` (1 by default;
        ``unbiased=False`` means 0).

        Raises:
            TypeError: an integer or bool tensor.
        """
        dim, c = _correction(dim, unbiased, correction)
        x = self._data
        if _dt.kind_of(x.dtype) not in "fc":
            raise TypeError(
                f"std and var only support floating point and complex dtypes, got "
                f"{_dt.dt_repr(x.dtype)}"
            )
        if x.dtype in _half.REDUCED:  # in float32, rounded once, as torch
            return self.float().var(dim, correction=c, keepdim=keepdim).to(x.dtype)
        if self._requires_grad and _grad_mode.enabled:  # recorded through mean and operators
            ax = axes(dim, x.ndim)
            n = x.size if ax is None else math.prod(
                x.shape[a] for a in (ax if isinstance(ax, tuple) else (ax,)))
            d = self - self.mean(dim, keepdim=True)
            return (d * d).sum(dim, keepdim=keepdim) / max(0, n - c)
        with np.errstate(divide="ignore", invalid="ignore"):
            return wrap(xp(x).asarray(
                x.var(axis=axes(dim, x.ndim), ddof=c, keepdims=keepdim)))

    def std(self, dim: Any = None, unbiased: Optional[bool] = None, keepdim: bool = False, *,
            correction: Any = None) -> Tensor:
        """Return the standard deviation over ``dim`` (see :meth:`var`)."""
        dim, c = _correction(dim, unbiased, correction)
        return self.var(dim, correction=c, keepdim=keepdim).sqrt()

    def max(self, dim: Any = None, keepdim: bool = False) -> Any:
        """Return the maximum; with ``dim``, a ``(values, indices)`` named tuple.

        ``t.max(other_tensor)`` is the element-wise maximum, as in torch.

        Raises:
            ValueError: the tensor is empty and no ``dim`` is given.

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([[1, 5], [7, 2]]).max(dim=1).indices
            tensor([1, 0])
        """
        return _extreme(self, dim, keepdim, True)

    def min(self, dim: Any = None, keepdim: bool = False) -> Any:
        """Return the minimum; with ``dim``, a ``(values, indices)`` named tuple."""
        return _extreme(self, dim, keepdim, False)

    def sort(self, dim: int = -1, descending: bool = False, *, stable: bool = False) -> Any:
        """Return the elements sorted along ``dim`` and where they came from.

        NaN sorts above every number. The values are differentiable: their gradient goes back
        to the positions they came from.

        Args:
            dim: the dimension to sort along (the last by default).
            descending: largest first.
            stable: keep equal elements in their original order.

        Returns:
            A ``(values, indices)`` named tuple; ``indices`` is int64.

        Raises:
            IndexError: ``dim`` is out of range.
            TypeError: a complex tensor.

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([3, 1, 2]).sort()
            mpitensor.return_types.sort(
            values=tensor([1, 2, 3]),
            indices=tensor([1, 2, 0]))
        """
        x = self._data
        axis = _sort_dim(x, dim)
        if x.ndim == 0:
            return _scalar_result(self, _SortResult)
        idx = _argsort(x, axis, descending, stable)
        return _SortResult(run(Sort, self, idx, axis), wrap(idx))

    def argsort(self, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
        """Return the int64 positions that sort the elements along ``dim`` (see :meth:`sort`).

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([3.0, 1.0, 2.0]).argsort(descending=True)
            tensor([0, 2, 1])
        """
        x = self._data
        axis = _sort_dim(x, dim)
        if x.ndim == 0:
            return wrap(xp(x).zeros((), dtype=_INT64))
        return wrap(_argsort(x, axis, descending, stable))

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:  # noqa: A002
        """Return the ``k`` largest (or smallest) elements along ``dim`` and their positions.

        NaN counts as larger than every number. The values are differentiable: their gradient
        goes back to the positions they came from.

        Args:
            k: how many elements to return, 0 to the length of ``dim``.
            dim: the dimension to search along (the last by default).
            largest: the largest elements (False: the smallest).
            sorted: return them in order, largest (smallest) first; otherwise in no
                particular order.

        Returns:
            A ``(values, indices)`` named tuple, ``k`` long along ``dim``; ``indices`` is int64.

        Raises:
            ValueError: ``k`` is negative or larger than the length of ``dim``.
            IndexError: ``dim`` is out of range.
            TypeError: a complex tensor.

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([1.0, 5.0, 3.0, 4.0]).topk(2)
            mpitensor.return_types.topk(
            values=tensor([5., 4.]),
            indices=tensor([1, 3]))
        """
        x = self._data
        k = operator.index(k)
        axis = _sort_dim(x, dim)
        n = x.shape[axis] if x.ndim else 1
        if not 0 <= k <= n:
            raise ValueError(
                f"topk(): k={k} is out of range for a dimension of length {n}; pass 0 <= k <= {n}"
            )
        if x.dtype.kind == "c":
            raise TypeError("topk() is not defined for complex tensors; use .real or .abs()")
        if x.ndim == 0:
            return _scalar_result(self, _TopkResult)
        idx = _topk_indices(x, k, axis, bool(largest), bool(sorted))
        return _TopkResult(run(Topk, self, idx, axis), wrap(idx))

    def argmax(self, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
        """Return the index of the maximum (into the flattened tensor when ``dim`` is None)."""
        x = self._data
        ax = None if dim is None else axes(dim, x.ndim)
        return wrap(x.argmax(axis=ax, keepdims=keepdim).astype(_INT64, copy=False))

    def argmin(self, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:
        """Return the index of the minimum (into the flattened tensor when ``dim`` is None)."""
        x = self._data
        ax = None if dim is None else axes(dim, x.ndim)
        return wrap(x.argmin(axis=ax, keepdims=keepdim).astype(_INT64, copy=False))

    def all(self, dim: Any = None, keepdim: bool = False) -> Tensor:
        """Return whether all elements (over ``dim``) are non-zero, as a bool tensor."""
        x = self._data
        return wrap(x.all(axis=axes(dim, x.ndim), keepdims=keepdim))

    def any(self, dim: Any = None, keepdim: bool = False) -> Tensor:
        """Return whether any element (over ``dim``) is non-zero, as a bool tensor."""
        x = self._data
        return wrap(x.any(axis=axes(dim, x.ndim), keepdims=keepdim))

    def amax(self, dim: Any = (), keepdim: bool = False) -> Tensor:
        """Return the maximum over ``dim`` (an int, a tuple; ``()`` or None: every element).

        Elements that tie for the maximum share its gradient evenly.

        Raises:
            ValueError: a dim reduced over is empty (an empty dim kept gives an empty result).
        """
        return run(AMax, self, _all_dims(dim), keepdim, True)

    def amin(self, dim: Any = (), keepdim: bool = False) -> Tensor:
        """Return the minimum over ``dim`` (see :meth:`amax`)."""
        return run(AMax, self, _all_dims(dim), keepdim, False)

    def aminmax(self, *, dim: Optional[int] = None, keepdim: bool = False) -> Any:
        """Return ``(min, max)`` over ``dim`` (every element when None) as a named tuple."""
        d = None if dim is None else dim
        return _AminmaxResult(self.amin(d, keepdim), self.amax(d, keepdim))

    def logsumexp(self, dim: Any = (), keepdim: bool = False) -> Tensor:
        """Return ``log(sum(exp(self)))`` over ``dim``, computed without overflow (integers
        are promoted to the default float dtype)."""
        if _autocast.ON and _autocast.active():
            return _autocast.run("logsumexp", Tensor.logsumexp, self, dim, keepdim)
        return run(LogSumExp, self, _all_dims(dim), keepdim)

    def nansum(self, dim: Any = None, keepdim: bool = False, *,
               dtype: DTypeLike = None) -> Tensor:
        """Return the sum over ``dim`` with NaN counted as zero."""
        return run(NanSum, self, dim, keepdim, dtype, False)

    def nanmean(self, dim: Any = None, keepdim: bool = False, *,
                dtype: DTypeLike = None) -> Tensor:
        """Return the mean over ``dim`` of the elements that are not NaN.

        Raises:
            TypeError: an integer or bool tensor without a float ``dtype``.
        """
        return run(NanSum, self, dim, keepdim, dtype, True)

    def count_nonzero(self, dim: Any = None) -> Tensor:
        """Return the int64 number of non-zero elements over ``dim`` (all when None)."""
        x = self._data
        return wrap(xp(x).asarray(
            (x != 0).sum(axis=axes(dim, x.ndim))).astype(_INT64, copy=False))


def _all_dims(dim: Any) -> Any:
    """``amax``'s ``dim``: ``()`` and ``[]`` mean every dimension, as None does."""
    return None if dim is None or (isinstance(dim, (tuple, list)) and not dim) else dim


def _correction(dim: Any, unbiased: Optional[bool], correction: Any) -> tuple:
    """``(dim, correction)`` from ``var``'s signatures: ``var(unbiased)``,
    ``var(dim, unbiased, keepdim)`` and ``var(dim, *, correction)``.

    Raises:
        ValueError: both ``unbiased`` and ``correction`` are given.
    """
    if isinstance(dim, bool):  # var(False): the old form whose only argument is unbiased
        dim, unbiased = None, dim
    if correction is not None and unbiased is not None:
        raise ValueError("var()/std(): pass either unbiased or correction, not both")
    if correction is None:
        correction = 0 if unbiased is False else 1
    return dim, correction
