"""Counting and searching: ``bincount``, ``histc``, ``searchsorted``, ``bucketize``,
``unique`` and ``unique_consecutive``. None of them is differentiable (their results are
counts and positions, or, for ``unique``, values torch gives no gradient either).

Example:
    >>> import mpitensor as mt
    >>> mt.bincount(mt.tensor([0, 2, 2]))
    tensor([1, 0, 2])
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any, Optional

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._base import determinism as _determinism
from mpitensor._core.devices import same_device, xp
from mpitensor._core.dims import wrap_dim
from mpitensor._core.opkit import serve, tensor_methods, wrap
from mpitensor.tensor import Tensor

_INT64 = _dt.int64
_INT32 = _dt.int32


def _array(v: Any) -> Any:
    if isinstance(v, Tensor):
        return v._data
    return v if hasattr(v, "dtype") and hasattr(v, "shape") else np.asarray(v)


def bincount(input: Tensor, weights: Optional[Tensor] = None, minlength: int = 0) -> Tensor:  # noqa: A002
    """Count each non-negative integer of a 1-D tensor (or add up ``weights`` per value).

    Returns int64 counts, or sums in the weights' float dtype (float64 for integer weights).

    Raises:
        TypeError: ``input`` is not an integer tensor.
        ValueError: ``input`` is not 1-D or holds a negative value.

    Example:
        >>> import mpitensor as mt
        >>> bincount(mt.tensor([1, 1, 3]), minlength=5)
        tensor([0, 2, 0, 1, 0])
    """
    x = _array(input)
    if x.dtype.kind not in "iub":
        raise TypeError(f"bincount(): expected an integer tensor, got {_dt.dt_repr(x.dtype)}")
    if x.ndim != 1:
        raise ValueError(f"bincount(): expected a 1-D tensor, got {x.ndim} dimensions")
    if x.size and int(x.min()) < 0:
        raise ValueError("bincount(): the input must be non-negative")
    m = xp(x)
    if weights is None:
        return wrap(m.bincount(x, minlength=minlength).astype(_INT64, copy=False))
    w = _array(weights)
    x, w = same_device(x, w)
    if w.shape != x.shape:
        raise ValueError(f"bincount(): weights have shape {list(w.shape)}, input "
                         f"{list(x.shape)}")
    dt = w.dtype if _dt.kind_of(w.dtype) == "f" else _dt.float64
    _determinism.alert("bincount() with weights on a GPU", x)  # float atomics
    return wrap(m.bincount(x, weights=w.astype(_dt.float64), minlength=minlength).astype(dt))


def histc(input: Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:  # noqa: A002
    """Return a histogram of ``bins`` equal bins over ``[min, max]`` (the data's range when
    both are 0); elements outside are ignored; the dtype is the input's.

    Raises:
        TypeError: an integer or bool tensor.
        ValueError: ``bins`` is not positive, or ``min > max``.
    """
    x = _array(input)
    if _dt.kind_of(x.dtype) != "f":
        raise TypeError(f"histc(): expected a floating point tensor, got "
                        f"{_dt.dt_repr(x.dtype)}")
    if bins <= 0:
        raise ValueError(f"histc(): bins must be positive, got {bins}")
    m = xp(x)
    w = x.astype(_dt.float64).reshape(-1)
    lo, hi = float(min), float(max)
    if lo > hi:
        raise ValueError(f"histc(): max ({hi}) must be at least min ({lo})")
    if lo == hi and w.size:
        finite = w[m.isfinite(w)]
        if finite.size:
            lo, hi = float(finite.min()), float(finite.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    keep = (w >= lo) & (w <= hi)
    v = w[keep]
    idx = ((v - lo) * bins / (hi - lo)).astype(_INT64)
    idx = m.minimum(idx, bins - 1)
    return wrap(m.bincount(idx, minlength=bins).astype(x.dtype))


def searchsorted(sorted_sequence: Tensor, input: Any, *, out_int32: bool = False,  # noqa: A002
                 right: bool = False, side: Optional[str] = None,
                 sorter: Optional[Tensor] = None) -> Tensor:
    """Return where each element of ``input`` would be inserted in ``sorted_sequence`` (the
    innermost dimension, row by row for several) to keep it sorted.

    Args:
        right, side: place equal elements after (``right=True`` or ``side="right"``) or
            before the existing ones.
        sorter: the positions that sort ``sorted_sequence`` (argsort's result), if unsorted.
        out_int32: int32 results instead of int64.

    Raises:
        ValueError: ``side`` and ``right`` disagree, or the leading dimensions differ.
    """
    seq = _array(sorted_sequence)
    scalar = not isinstance(input, Tensor) and np.ndim(input) == 0
    vals = _array(input)
    if side is not None:
        if side not in ("left", "right"):
            raise ValueError(f"searchsorted(): side must be 'left' or 'right', got {side!r}")
        if right and side == "left":
            raise ValueError("searchsorted(): side='left' and right=True disagree")
    else:
        side = "right" if right else "left"
    m = xp(seq)
    if sorter is not None:
        seq = m.take_along_axis(seq, _array(sorter).astype(_INT64), axis=-1)
    if seq.ndim <= 1:
        out = m.searchsorted(seq, vals, side=side)
    else:
        if vals.ndim != seq.ndim or vals.shape[:-1] != seq.shape[:-1]:
            raise ValueError(f"searchsorted(): the leading dimensions of the sequence "
                             f"{list(seq.shape[:-1])} and of the values "
                             f"{list(vals.shape[:-1])} must match")
        s2 = seq.reshape(-1, seq.shape[-1])
        v2 = vals.reshape(-1, vals.shape[-1])
        out = m.stack([m.searchsorted(s2[i], v2[i], side=side) for i in range(s2.shape[0])])
        out = out.reshape(vals.shape)
    out = m.asarray(out).astype(_INT32 if out_int32 else _INT64)
    return wrap(out.reshape(()) if scalar else out)


def bucketize(input: Any, boundaries: Tensor, *, out_int32: bool = False,  # noqa: A002
              right: bool = False) -> Tensor:
    """Return the index of the bucket of ``boundaries`` (1-D, sorted) each element falls in:
    ``boundaries[i-1] < x <= boundaries[i]``, or with ``right`` ``[i-1] <= x < [i]``.

    Raises:
        ValueError: ``boundaries`` is not 1-D.
    """
    b = _array(boundaries)
    if b.ndim != 1:
        raise ValueError(f"bucketize(): boundaries must be 1-D, got {b.ndim} dimensions")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)


def isin(elements: Any, test_elements: Any, *, assume_unique: bool = False,
         invert: bool = False) -> Tensor:
    """Return, as bools, whether each element of ``elements`` is in ``test_elements`` (either
    may be a number); ``invert`` asks whether it is not."""
    a, b = _array(elements), _array(test_elements)
    if isinstance(elements, Tensor) and not isinstance(test_elements, Tensor):
        b = xp(a).asarray(b)
    elif isinstance(test_elements, Tensor) and not isinstance(elements, Tensor):
        a = xp(b).asarray(a)
    a, b = same_device(a, b)
    return wrap(xp(a).isin(a, b, assume_unique=assume_unique, invert=invert))


_HistogramResult = namedtuple("histogram", ["hist", "bin_edges"])


def histogram(input: Tensor, bins: Any = 100, *, range: Any = None,  # noqa: A002
              weight: Optional[Tensor] = None, density: bool = False) -> Any:
    """Return ``(hist, bin_edges)``: counts (or summed ``weight``, or a density) in ``bins``
    equal bins over ``range`` (the data's by default), or in the bins a tensor of edges
    bounds, as ``numpy.histogram``; in the input's float dtype.

    Raises:
        TypeError: an integer or bool tensor.
    """
    x = _array(input)
    if _dt.kind_of(x.dtype) != "f":
        raise TypeError(f"histogram(): expected a floating point tensor, got "
                        f"{_dt.dt_repr(x.dtype)}")
    m = xp(x)
    b = _array(bins) if isinstance(bins, Tensor) else bins
    w = None if weight is None else _array(weight).astype(_dt.float64)
    hist, edges = m.histogram(x.astype(_dt.float64), bins=b, range=range, weights=w,
                              density=density)
    return _HistogramResult(wrap(hist.astype(x.dtype)), wrap(edges.astype(x.dtype)))


def _unique_result(out: Any, inverse: Any, counts: Any, return_inverse: bool,
                   return_counts: bool) -> Any:
    res = [wrap(out)]
    if return_inverse:
        res.append(wrap(inverse.astype(_INT64, copy=False)))
    if return_counts:
        res.append(wrap(counts.astype(_INT64, copy=False)))
    return res[0] if len(res) == 1 else tuple(res)


@tensor_methods
class _CountingMethods:
    def bincount(self, weights: Optional[Tensor] = None, minlength: int = 0) -> Tensor:
        """Return the counts of each non-negative integer (see :func:`bincount`)."""
        return bincount(self, weights, minlength)

    def histc(self, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:  # noqa: A002
        """Return a histogram of the elements (see :func:`histc`)."""
        return histc(self, bins, min, max)

    def histogram(self, bins: Any = 100, *, range: Any = None,  # noqa: A002
                  weight: Optional[Tensor] = None, density: bool = False) -> Any:
        """Return ``(hist, bin_edges)`` of the elements (see :func:`histogram`)."""
        return histogram(self, bins, range=range, weight=weight, density=density)

    def unique(self, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
               return_counts: bool = False, dim: Optional[int] = None) -> Any:
        """Return the distinct elements in ascending order (distinct slices of ``dim`` when
        given), and on request the int64 position of each element's value among them
        (``return_inverse``) and how often each occurs (``return_counts``).

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([3, 1, 3]).unique(return_counts=True)
            (tensor([1, 3]), tensor([1, 2]))
        """
        x = self._data
        m = xp(x)
        if dim is None:
            out, inv, cnt = m.unique(x.reshape(-1), return_inverse=True, return_counts=True)
            inv = inv.reshape(x.shape)
        else:
            axis = wrap_dim(dim, x.ndim)
            out, inv, cnt = m.unique(x, return_inverse=True, return_counts=True, axis=axis)
            inv = inv.reshape(-1)
        return _unique_result(out, inv, cnt, return_inverse, return_counts)

    def unique_consecutive(self, return_inverse: bool = False, return_counts: bool = False,
                           dim: Optional[int] = None) -> Any:
        """Return the elements with each run of equal neighbours kept once (slices of
        ``dim`` when given), with the same optional results as :meth:`unique`."""
        x = self._data
        m = xp(x)
        if dim is None:
            flat = x.reshape(-1)
            axis, n = 0, flat.size
            change = flat[1:] != flat[:-1]
        else:
            flat = x
            axis = wrap_dim(dim, x.ndim)
            n = x.shape[axis]
            a = m.moveaxis(x, axis, 0).reshape(n, -1)
            change = (a[1:] != a[:-1]).any(axis=1)
        keep = m.concatenate([m.ones(min(n, 1), dtype=bool), change])
        out = m.compress(keep, flat, axis=axis)
        inv = m.cumsum(keep) - 1
        starts = m.flatnonzero(keep)
        cnt = m.diff(m.concatenate([starts, m.asarray([n])]))
        if dim is None:
            inv = inv.reshape(x.shape)
        return _unique_result(out, inv, cnt, return_inverse, return_counts)


def unique(input: Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
           return_counts: bool = False, dim: Optional[int] = None) -> Any:
    """Return ``input.unique(...)`` (see :meth:`Tensor.unique`)."""
    return input.unique(sorted, return_inverse, return_counts, dim)


def unique_consecutive(input: Tensor, return_inverse: bool = False,  # noqa: A002
                       return_counts: bool = False, dim: Optional[int] = None) -> Any:
    """Return ``input.unique_consecutive(...)``."""
    return input.unique_consecutive(return_inverse, return_counts, dim)


serve({name: globals()[name] for name in (
    "bincount", "histc", "searchsorted", "bucketize", "unique", "unique_consecutive", "isin",
    "histogram")})
