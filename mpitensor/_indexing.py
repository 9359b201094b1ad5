"""Indexing: ``t[key]``, ``t[key] = value`` and ``nonzero``, with the gradient of ``t[key]``.

A key is anything NumPy indexes with (ints, slices, ``None``, ``...``, bool masks, integer
arrays and lists), where tensors may stand for arrays. Basic indexing gives views; a single
element gives a zero-dim view rather than a Python number, as in torch. The gradient of
``t[key]`` is written into zeros shaped like ``t``, and for integer-array keys added up, so
that an element picked twice gets both contributions.

Example:
    >>> import mpitensor as mt
    >>> x = mt.tensor([1.0, 2.0, 3.0], requires_grad=True)
    >>> x[[0, 0, 2]].sum().backward()
    >>> x.grad
    tensor([2., 0., 1.])
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._devices import move, xp
from mpitensor.autograd import _NO_RECORD, Function
from mpitensor.tensor import Tensor, _check_inplace, _new, _tensor_methods

_ndarray = np.ndarray
_INT64 = _dt.int64
_grad_mode = _autograd._mode


def index_key(key: Any) -> Any:
    """``key`` with every tensor in it replaced by its array, for NumPy or CuPy to index with."""
    if isinstance(key, Tensor):
        return key._data
    if type(key) is tuple:
        return tuple(k._data if isinstance(k, Tensor) else k for k in key)
    return key


def _has_int_index(key: Any) -> bool:
    """True when ``key`` holds an integer array or list (its repeated indices must add up)."""
    for k in key if type(key) is tuple else (key,):
        if isinstance(k, list):
            if np.asarray(k).dtype.kind in "iu":
                return True
        elif hasattr(k, "shape") and not isinstance(k, np.generic) and k.dtype.kind in "iu":
            return True
    return False


def _scatter_add(gx: Any, key: Any, g: Any) -> None:
    """``gx[key] += g`` with repeated indices adding up (``add.at``; older CuPy: cupyx)."""
    if isinstance(gx, _ndarray):
        np.add.at(gx, key, g)
        return
    add_at = getattr(xp(gx).add, "at", None)
    if add_at is not None:
        add_at(gx, key, g)
        return
    cupyx = sys.modules.get("cupyx") or importlib.import_module("cupyx")
    cupyx.scatter_add(gx, key, g)


class Index(Function):
    """``x[key]`` (``key`` as :func:`index_key` leaves it): the gradient goes back to the
    indexed positions of zeros shaped like ``x``."""

    @staticmethod
    def forward(ctx: Any, x: Any, key: Any) -> Any:
        r = x[key]
        if isinstance(r, np.generic):  # a single element: torch returns a 0-d view
            key = (*key, Ellipsis) if type(key) is tuple else (key, Ellipsis)
            r = x[key]
        ctx.meta = (x.shape, x.dtype, key)
        return r

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, key = ctx.meta
        gx = xp(g).zeros(shape, dtype=dtype)
        if _has_int_index(key):
            _scatter_add(gx, key, g)
        else:
            gx[key] = g
        return gx, None


@_tensor_methods
class _IndexingMethods:
    def __getitem__(self, key: Any) -> Tensor:
        # tensor._run written out: indexing is frequent enough for its call to show
        if self._requires_grad and _grad_mode.enabled:
            return Index.apply(self, index_key(key))
        return _new(Index.forward(_NO_RECORD, self._data, index_key(key)))

    def __setitem__(self, key: Any, value: Any) -> None:
        if (
            self._requires_grad or (isinstance(value, Tensor) and value._requires_grad)
        ) and _grad_mode.enabled:
            _check_inplace(self, value, "__setitem__")
        x = self._data
        key = index_key(key)
        if isinstance(value, Tensor):
            value = value._data
        if isinstance(x, _ndarray):
            if _backend.is_cupy_array(value):
                value = value.get()
        elif isinstance(value, _ndarray):
            value = move(value, _backend.device_of(x))
        x[key] = value

    def nonzero(self, *, as_tuple: bool = False) -> Any:
        """Return the indices of non-zero elements: an ``(n, ndim)`` int64 tensor, or a tuple
        of one int64 tensor per dimension."""
        x = self._data
        m = xp(x)
        if as_tuple:
            return tuple(_new(i.astype(_INT64, copy=False)) for i in m.nonzero(m.atleast_1d(x)))
        return _new(m.argwhere(x).astype(_INT64, copy=False))
