"""Scans along one dimension: ``cumsum``, ``cumprod``, ``cummax``, ``cummin`` and
``logcumsumexp``, with their gradients.

Integers and bools scan in int64 (``cumsum``, ``cumprod``), as in torch; half tensors scan in
float32 and are rounded once. ``cumprod``'s gradient is exact where the input holds zeros (a
division by the input would give NaN there); ``cummax``/``cummin`` return ``(values,
indices)``, the index of the last element equal to the running extreme (NaN wins), as torch.

Example:
    >>> import mpitensor as mt
    >>> mt.tensor([1, 2, 3]).cumsum(0)
    tensor([1, 3, 6])
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core import autocast as _autocast
from mpitensor._core.devices import xp
from mpitensor._core.dims import wrap_dim
from mpitensor._core.half import computes_in_float32
from mpitensor._core.opkit import run, run_inplace, tensor_methods, wrap
from mpitensor._core.promotion import sum_dtype
from mpitensor._ops.gather_scatter import gather_along
from mpitensor._ops.reductions import return_types_repr
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

DTypeLike = Any
_INT64 = _dt.int64


def _flip_cumsum(g: Any, axis: int) -> Any:
    """The sums of ``g`` from each position to the end along ``axis``."""
    m = xp(g)
    return m.flip(m.cumsum(m.flip(g, axis), axis=axis), axis)


def _scan_axis(x: Any, dim: int) -> int:
    return wrap_dim(dim, x.ndim) if x.ndim else 0


@computes_in_float32
class Cumsum(Function):
    """``cumsum(x, dim, dtype)``: the gradient is the reversed cumulative sum."""

    @staticmethod
    def forward(ctx: Any, x: Any, axis: int, dtype: Any) -> Any:
        dt = _dt.to_dtype(dtype) if dtype is not None else sum_dtype(x.dtype)
        ctx.meta = (axis, x.dtype)
        if x.ndim == 0:
            return x.astype(dt) if dt is not None else x.copy()
        return xp(x).cumsum(x, axis=axis, dtype=dt)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        axis, dtype = ctx.meta
        gx = _flip_cumsum(g, axis) if g.ndim else g
        return gx.astype(dtype, copy=False), None, None


@computes_in_float32
class Cumprod(Function):
    """``cumprod(x, dim, dtype)``. Its gradient, ``sum over k >= i of g_k out_k / x_i``, is
    taken without dividing by zero: before a slice's first zero the division is safe; at the
    first zero it is the gradient of the products with that zero replaced by one; after it,
    zero."""

    @staticmethod
    def forward(ctx: Any, x: Any, axis: int, dtype: Any) -> Any:
        dt = _dt.to_dtype(dtype) if dtype is not None else sum_dtype(x.dtype)
        if x.ndim == 0:
            out = x.astype(dt) if dt is not None else x.copy()
        else:
            out = xp(x).cumprod(x, axis=axis, dtype=dt)
        ctx.meta = (axis, x.dtype)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        axis, dtype = ctx.meta
        x, out = ctx.saved_tensors
        if g.ndim == 0:
            return g.astype(dtype, copy=False), None, None
        m = xp(g)
        x = x.astype(g.dtype, copy=False)
        if x.dtype.kind == "c":  # holomorphic: the gradient takes the conjugate derivative
            x, out = x.conj(), out.conj()
        zero = x == 0
        with np.errstate(all="ignore"):
            plain = _flip_cumsum(g * out, axis) / m.where(zero, 1, x)
        if not zero.any():
            return plain.astype(dtype, copy=False), None, None
        n = x.shape[axis]
        pos = m.arange(n).reshape((n,) + (1,) * (x.ndim - axis - 1))
        first = m.where(zero.any(axis=axis, keepdims=True),
                        m.argmax(zero, axis=axis, keepdims=True), n)
        at_first = pos == first
        # the products with the first zero taken as one: their gradient there is exact
        out1 = m.cumprod(m.where(at_first, 1, x), axis=axis)
        g_first = _flip_cumsum(g * out1, axis)
        gx = m.where(pos < first, plain, m.where(at_first, g_first, 0))
        return gx.astype(dtype, copy=False), None, None


def _logcumsumexp(m: Any, a: Any, axis: int) -> Any:
    """``log(cumsum(exp(a)))`` along ``axis`` without overflow or loss of small terms."""
    acc = getattr(m.logaddexp, "accumulate", None)
    if acc is not None and m is np:
        return acc(a, axis=axis)
    # CuPy has no ufunc.accumulate: shift by the slice's maximum instead
    mx = m.max(a, axis=axis, keepdims=True)
    mx = m.where(m.isfinite(mx), mx, 0)
    return m.log(m.cumsum(m.exp(a - mx), axis=axis)) + mx


@computes_in_float32
class LogCumSumExp(Function):
    """``logcumsumexp(x, dim)``: d out_k / d x_i = exp(x_i - out_k) for i <= k; the sums of
    the gradient are taken in log space, positive and negative parts apart, as torch."""

    @staticmethod
    def forward(ctx: Any, x: Any, axis: int) -> Any:
        if _dt.kind_of(x.dtype) in "biu":
            x = x.astype(_dt.get_default_dtype())
        m = xp(x)
        with np.errstate(all="ignore"):
            out = x.copy() if x.ndim == 0 else _logcumsumexp(m, x, axis)
        ctx.meta = axis
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        axis = ctx.meta
        x, out = ctx.saved_tensors
        if g.ndim == 0:
            return g, None
        m = xp(g)
        with np.errstate(all="ignore"):
            def part(gg: Any) -> Any:
                a = m.log(gg) - out
                rev = m.flip(_logcumsumexp(m, m.flip(a, axis), axis), axis)
                return m.exp(rev + x)

            gx = part(m.where(g > 0, g, 0)) - part(m.where(g < 0, -g, 0))
        return gx, None


_CummaxResult = namedtuple("cummax", ["values", "indices"])
_CumminResult = namedtuple("cummin", ["values", "indices"])
_CummaxResult.__repr__ = return_types_repr
_CumminResult.__repr__ = return_types_repr


def _cum_extreme(t: Tensor, dim: int, largest: bool) -> Any:
    x = t._data
    result = _CummaxResult if largest else _CumminResult
    axis = _scan_axis(x, dim)
    m = xp(x)
    if x.ndim == 0:
        return result(t.clone(), wrap(m.zeros((), dtype=_INT64)))
    if x.dtype.kind == "c":
        raise TypeError("cummax()/cummin() are not defined for complex tensors")
    w = x.astype(_dt.float32) if _dt.kind_of(x.dtype) == "f" and x.dtype.itemsize == 2 else x
    if w.dtype.kind == "b":
        w = w.astype(np.int8)
    acc = (m.maximum if largest else m.minimum).accumulate
    run = acc(w, axis=axis)
    same = w == run
    if w.dtype.kind == "f":
        same |= m.isnan(w) & m.isnan(run)
    n = x.shape[axis]
    pos = m.arange(n).reshape((n,) + (1,) * (x.ndim - axis - 1))
    # the last position at or before each one that holds the running extreme
    idx = m.maximum.accumulate(m.where(same, pos, -1), axis=axis).astype(_INT64)
    return result(gather_along(t, axis, wrap(idx)), wrap(idx))


@tensor_methods
class _ScanMethods:
    def cumsum(self, dim: int, *, dtype: DTypeLike = None) -> Tensor:
        """Return the cumulative sums along ``dim`` (integers and bools in int64).

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([[1, 2], [3, 4]]).cumsum(1)
            tensor([[1, 3],
                    [3, 7]])
        """
        if _autocast.ON and _autocast.active():
            return _autocast.run("cumsum", Tensor.cumsum, self, dim, dtype=dtype)
        return run(Cumsum, self, _scan_axis(self._data, dim), dtype)

    def cumsum_(self, dim: int, *, dtype: DTypeLike = None) -> Tensor:
        """:meth:`cumsum` in place; returns self."""
        return run_inplace(self, Cumsum, "cumsum_()", _scan_axis(self._data, dim), dtype)

    def cumprod(self, dim: int, *, dtype: DTypeLike = None) -> Tensor:
        """Return the cumulative products along ``dim`` (integers and bools in int64)."""
        if _autocast.ON and _autocast.active():
            return _autocast.run("cumprod", Tensor.cumprod, self, dim, dtype=dtype)
        return run(Cumprod, self, _scan_axis(self._data, dim), dtype)

    def cumprod_(self, dim: int, *, dtype: DTypeLike = None) -> Tensor:
        """:meth:`cumprod` in place; returns self."""
        return run_inplace(self, Cumprod, "cumprod_()", _scan_axis(self._data, dim), dtype)

    def cummax(self, dim: int) -> Any:
        """Return ``(values, indices)``: the running maximum along ``dim`` and where it was
        last seen (NaN, once met, stays)."""
        return _cum_extreme(self, dim, True)

    def cummin(self, dim: int) -> Any:
        """Return ``(values, indices)``: the running minimum along ``dim`` (see cummax)."""
        return _cum_extreme(self, dim, False)

    def logcumsumexp(self, dim: int) -> Tensor:
        """Return ``log(cumsum(exp(self)))`` along ``dim``, computed without overflow."""
        return run(LogCumSumExp, self, _scan_axis(self._data, dim))
