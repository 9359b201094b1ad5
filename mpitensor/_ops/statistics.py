"""Order statistics: ``median``, ``nanmedian``, ``kthvalue`` and ``mode``, with their
gradients.

Along a dimension each returns ``(values, indices)``; the values take their gradient back to
the index returned. ``median`` is the lower of the two middle elements for an even count, and
NaN wherever a slice holds NaN (its index that of the first NaN); ``nanmedian`` leaves NaN
out. Without a dimension, ``median`` and ``nanmedian`` return the value alone, and the elements
equal to it share its gradient evenly, as in torch. ``mode`` picks the most frequent value
(the smallest among ties) and the last position holding it.

Example:
    >>> import mpitensor as mt
    >>> mt.tensor([[3.0, 1.0, 2.0]]).median(1)
    mpitensor.return_types.median(
    values=tensor([2.]),
    indices=tensor([2]))
"""

from __future__ import annotations

import operator
from collections import namedtuple
from typing import Any

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core.devices import xp
from mpitensor._core.dims import wrap_dim
from mpitensor._core.opkit import given_value, run, tensor_methods, wrap
from mpitensor._ops.gather_scatter import gather_along
from mpitensor._ops.reductions import return_types_repr
from mpitensor.tensor import Tensor

_INT64 = _dt.int64


def _result(name: str) -> Any:
    r = namedtuple(name, ["values", "indices"])
    r.__repr__ = return_types_repr
    return r


_MedianResult, _NanMedianResult, _ModeResult, _KthvalueResult = map(
    _result, ("median", "nanmedian", "mode", "kthvalue"))


def _orderable(x: Any, what: str) -> Any:
    """``x`` in a dtype NumPy sorts with NaN last (half floats widened, bools as int8)."""
    if x.dtype.kind == "c":
        raise TypeError(f"{what}() is not defined for complex tensors")
    if _dt.kind_of(x.dtype) == "f" and x.dtype.itemsize == 2:
        return x.astype(_dt.float32)
    if x.dtype.kind == "b":
        return x.view(np.int8)
    return x


def _even_share(g: Any, x: Any, v: Any) -> Any:
    m = xp(g)
    mask = x == v
    if _dt.kind_of(x.dtype) == "f":
        mask = mask | (m.isnan(x) & m.isnan(v))
    return (mask * (g / mask.sum())).astype(x.dtype, copy=False)


EvenShare = given_value("EvenShare", _even_share, """The value ``v`` of a whole-tensor order
    statistic: the elements equal to it (NaN counting as equal to NaN) share its gradient
    evenly.""")


def _sorted_order(x: Any, axis: int) -> Any:
    """The stable ascending order along ``axis``, NaN last."""
    return xp(x).argsort(x, axis=axis, kind="stable") if xp(x) is np else xp(x).argsort(
        x, axis=axis)


def _pick(t: Tensor, idx: Any, axis: int, keepdim: bool, result: Any) -> Any:
    """``result(values, indices)`` for the int64 positions ``idx`` (size 1 along ``axis``)."""
    values = gather_along(t, axis, wrap(idx))
    if not keepdim:
        values = values.squeeze(axis)
        idx = idx.squeeze(axis)
    return result(values, wrap(idx))


def _whole(t: Tensor, ignore_nan: bool) -> Tensor:
    """``median()``/``nanmedian()`` of every element."""
    x = t._data
    m = xp(x)
    flat = _orderable(x.reshape(-1), "median")
    if flat.size == 0:
        v = m.asarray(m.nan, dtype=x.dtype) if _dt.kind_of(x.dtype) == "f" else None
        if v is None:
            raise ValueError("median() of an empty integer tensor has no value")
        return wrap(v)
    nan = m.isnan(flat) if flat.dtype.kind == "f" else None
    if nan is not None and not ignore_nan and nan.any():
        v = m.asarray(m.nan).astype(x.dtype)
    else:
        n = flat.size - (int(nan.sum()) if nan is not None else 0)
        k = max(n - 1, 0) // 2
        v = m.sort(flat)[k].astype(x.dtype)
    if t.requires_grad:
        return run(EvenShare, t, xp(x).asarray(v))
    return wrap(m.asarray(v))


def _median_dim(t: Tensor, dim: int, keepdim: bool, ignore_nan: bool) -> Any:
    x = t._data
    result = _NanMedianResult if ignore_nan else _MedianResult
    if x.ndim == 0:
        wrap_dim(dim, 0)
        return result(t.clone(), wrap(xp(x).zeros((), dtype=_INT64)))
    axis = wrap_dim(dim, x.ndim)
    m = xp(x)
    w = _orderable(x, "median")
    n = x.shape[axis]
    if n == 0:
        raise IndexError(f"median(): cannot take the median of an empty dimension {axis}")
    order = _sorted_order(w, axis)
    nan = m.isnan(w) if w.dtype.kind == "f" else None
    if nan is None:
        k = m.full(x.shape[:axis] + (1,) + x.shape[axis + 1:], (n - 1) // 2, dtype=_INT64)
        idx = m.take_along_axis(order, k, axis=axis)
    elif ignore_nan:
        count = n - nan.sum(axis=axis, keepdims=True)
        k = (m.maximum(count, 1) - 1) // 2
        idx = m.take_along_axis(order, k.astype(_INT64), axis=axis)
    else:
        k = m.full(x.shape[:axis] + (1,) + x.shape[axis + 1:], (n - 1) // 2, dtype=_INT64)
        idx = m.take_along_axis(order, k, axis=axis)
        has_nan = nan.any(axis=axis, keepdims=True)
        first_nan = m.argmax(nan, axis=axis, keepdims=True)
        idx = m.where(has_nan, first_nan, idx)
    return _pick(t, idx.astype(_INT64, copy=False), axis, keepdim, result)


def _mode(t: Tensor, dim: int, keepdim: bool) -> Any:
    x = t._data
    m = xp(x)
    if x.ndim == 0:
        wrap_dim(dim, 0)
        return _ModeResult(t.clone(), wrap(m.zeros((), dtype=_INT64)))
    axis = wrap_dim(dim, x.ndim)
    n = x.shape[axis]
    if n == 0:
        raise IndexError(f"mode(): cannot take the mode of an empty dimension {axis}")
    w = m.moveaxis(_orderable(x, "mode"), axis, -1)
    order = _sorted_order(w, -1)
    s = m.take_along_axis(w, order, axis=-1)
    differs = s[..., 1:] != s[..., :-1]
    if s.dtype.kind == "f":
        differs &= ~(m.isnan(s[..., 1:]) & m.isnan(s[..., :-1]))
    lead = m.ones(s.shape[:-1] + (1,), dtype=bool)
    starts = m.concatenate([lead, differs], axis=-1)
    ends = m.concatenate([differs, lead], axis=-1)
    pos = m.arange(n)
    start_of = m.maximum.accumulate(m.where(starts, pos, 0), axis=-1)
    runs = m.where(ends, pos - start_of + 1, 0)
    best = m.argmax(runs, axis=-1)[..., None]  # the longest run; the smallest value on ties
    # a stable sort keeps equal values in their order: a run's end is its last position
    idx = m.take_along_axis(order, best, axis=-1)
    idx = m.moveaxis(idx, -1, axis).astype(_INT64, copy=False)
    return _pick(t, idx, axis, keepdim, _ModeResult)


@tensor_methods
class _StatisticsMethods:
    def median(self, dim: Any = None, keepdim: bool = False) -> Any:
        """Return the median (the lower middle element for an even count; NaN where a NaN is
        present); with ``dim``, ``(values, indices)``.

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([1.0, 4.0, 2.0, 3.0]).median()
            tensor(2.)
        """
        if dim is None:
            return _whole(self, False)
        return _median_dim(self, dim, keepdim, False)

    def nanmedian(self, dim: Any = None, keepdim: bool = False) -> Any:
        """Return the median of the elements that are not NaN (see :meth:`median`)."""
        if dim is None:
            return _whole(self, True)
        return _median_dim(self, dim, keepdim, True)

    def kthvalue(self, k: int, dim: int = -1, keepdim: bool = False) -> Any:
        """Return ``(values, indices)`` of the ``k``-th smallest element along ``dim``
        (``k`` from 1; NaN counts as the largest).

        Raises:
            ValueError: ``k`` outside ``[1, size of dim]``.
        """
        x = self._data
        k = operator.index(k)
        if x.ndim == 0:
            wrap_dim(dim, 0)
            if k != 1:
                raise ValueError(f"kthvalue(): k={k} is out of range for a 0-d tensor")
            return _KthvalueResult(self.clone(), wrap(xp(x).zeros((), dtype=_INT64)))
        axis = wrap_dim(dim, x.ndim)
        n = x.shape[axis]
        if not 1 <= k <= n:
            raise ValueError(f"kthvalue(): k={k} is out of range for a dimension of size {n}; "
                             f"pass 1 <= k <= {n}")
        order = _sorted_order(_orderable(x, "kthvalue"), axis)
        key = (slice(None),) * axis + (slice(k - 1, k),)
        return _pick(self, order[key].astype(_INT64, copy=False), axis, keepdim,
                     _KthvalueResult)

    def mode(self, dim: int = -1, keepdim: bool = False) -> Any:
        """Return ``(values, indices)``: the most frequent value along ``dim`` (the smallest
        of those that tie) and the last position holding it."""
        return _mode(self, dim, keepdim)

    def cov(self, *, correction: int = 1, fweights: Any = None, aweights: Any = None) -> Tensor:
        """Return the covariance matrix of the variables in the rows (observations in the
        columns), with integer frequency weights and/or observation weights, as torch.

        Raises:
            ValueError: more than 2 dimensions.
        """
        x = self
        if x.dim() > 2:
            raise ValueError(f"cov(): expects at most 2 dimensions, got {x.dim()}")
        if x.dim() < 2:
            x = x.reshape(1, -1)
        if not (x.is_floating_point() or x.is_complex()):
            x = x.to(_dt.get_default_dtype())
        n = x.shape[1]
        w = None
        if fweights is not None:
            w = fweights
        if aweights is not None:
            w = aweights if w is None else w * aweights
        if w is None:
            avg = x.mean(1, keepdim=True)
            total = n
            norm = n - correction
        else:
            w = w.to(x.dtype)
            total = w.sum()
            avg = (x * w).sum(1, keepdim=True) / total
            if correction == 0:
                norm = total
            elif aweights is None:
                norm = total - correction
            else:
                norm = total - correction * (w * aweights).sum() / total
        d = x - avg
        dw = d if w is None else d * w
        c = dw @ d.conj().t() / (norm if not isinstance(norm, (int, float)) else max(norm, 0))
        return c.squeeze() if self.dim() < 2 else c

    def corrcoef(self) -> Tensor:
        """Return the Pearson correlation coefficients of the variables in the rows."""
        c = self.cov()
        if c.dim() == 0:
            return c / c
        d = c.diagonal().sqrt()
        return (c / d.unsqueeze(1) / d.unsqueeze(0)).clamp(-1, 1)

    def msort(self) -> Tensor:
        """Return the elements sorted along the first dimension (``sort(0).values``)."""
        return self.sort(0).values
