"""Indexing and masked writes: ``t[key]``, ``t[key] = value``, ``masked_fill``/``masked_fill_``
and ``nonzero``, with their gradients.

A key is anything NumPy indexes with (ints, slices, ``None``, ``...``, bool masks, integer
arrays and lists), where tensors may stand for arrays. Basic indexing gives views; a single
element gives a zero-dim view rather than a Python number, as in torch. The gradient of
``t[key]`` is written into zeros shaped like ``t``, and for integer-array keys added up, so
that an element picked twice gets both contributions. ``t[key]`` with a basic key is a view
sharing ``t``'s version counter; ``t[key] = value`` is an in-place write, recorded by autograd
(``mpitensor.autograd.apply_inplace``) when ``t`` or ``value`` requires grad.

Example:
    >>> import mpitensor as mt
    >>> x = mt.tensor([1.0, 2.0, 3.0], requires_grad=True)
    >>> x[[0, 0, 2]].sum().backward()
    >>> x.grad
    tensor([2., 0., 1.])
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._base import determinism as _determinism
from mpitensor._core.devices import move, xp
from mpitensor._core.opkit import NO_RECORD, replay, sum_to, tensor_methods, wrap
from mpitensor.autograd import (
    ArrayFunction as Function,
    apply_inplace,
    bump_version,
    inplace_recorded,
    link_view,
    storage,
)
from mpitensor.tensor import Tensor

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


def scatter_add_into(gx: Any, key: Any, g: Any) -> None:
    """``gx[key] += g`` with repeated indices adding up (``add.at``; older CuPy: cupyx)."""
    if isinstance(gx, _ndarray):
        np.add.at(gx, key, g)
        return
    if _determinism.add_at(gx, key, g):  # use_deterministic_algorithms: no atomics
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
            scatter_add_into(gx, key, g)
        else:
            gx[key] = g
        return gx, None


def _fit(g: Any, shape: tuple, dtype: Any) -> Any:
    g = g if g.shape == shape else sum_to(g, shape)
    return g if g.dtype == dtype else g.astype(dtype)


def _on_device_of(x: Any, value: Any) -> Any:
    """``value`` (an array or anything NumPy takes) where ``x`` lives."""
    if isinstance(x, _ndarray):
        return value.get() if _backend.is_cupy_array(value) else value
    return move(value, _backend.device_of(x)) if isinstance(value, _ndarray) else value


class IndexPut(Function):
    """``x[key] = value``: ``x``'s old value gets the gradient outside the written positions;
    ``value`` gets it at those positions (summed where it was broadcast)."""

    @staticmethod
    def forward_(ctx: Any, x: Any, value: Any, key: Any) -> Any:
        if hasattr(value, "shape") and ctx.needs_input_grad and ctx.needs_input_grad[1]:
            if _backend.is_cupy_array(value) != _backend.is_cupy_array(x):
                raise RuntimeError(
                    "t[key] = value with a value that requires grad needs both on one device; "
                    "move the value with .to(t.device) first"
                )
            ctx.meta = (value.shape, value.dtype)
        ctx.key = key
        x[key] = value
        return x

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        need = ctx.needs_input_grad
        key = ctx.key
        gx = gv = None
        if need[0]:
            gx = g.copy()
            gx[key] = 0
        if need[1]:
            gv = xp(g).asarray(g[key])
            gv = _fit(gv, *ctx.meta)
        return gx, gv, None


def _mask_of(mask: Any, what: str) -> Any:
    m = mask._data if isinstance(mask, Tensor) else mask
    if not hasattr(m, "dtype") or m.dtype.kind != "b":
        raise TypeError(
            f"{what} takes a bool mask (a tensor of dtype mpitensor.bool), got "
            f"{getattr(m, 'dtype', type(m).__name__)}; compare to get one, e.g. t > 0"
        )
    return m


def _fill_value(value: Any, what: str) -> Any:
    v = value._data if isinstance(value, Tensor) else value
    if hasattr(v, "ndim") and v.ndim != 0:
        raise RuntimeError(
            f"{what} takes a number or a 0-dimensional tensor as the value, got a tensor with "
            f"{v.ndim} dimension(s)"
        )
    return v


class MaskedFill(Function):
    """``x`` with ``value`` where ``mask`` is True (the mask broadcast to ``x``'s shape): ``x``
    gets the gradient where the mask is False, a tensor ``value`` the sum of the rest."""

    @staticmethod
    def _note(ctx: Any, x: Any, mask: Any, value: Any) -> None:
        ctx.save_for_backward(mask)
        need = ctx.needs_input_grad
        if need and need[2]:
            ctx.meta = (value.shape, value.dtype)

    @classmethod
    def forward(cls, ctx: Any, x: Any, mask: Any, value: Any) -> Any:
        cls._note(ctx, x, mask, value)
        out = x.copy()
        xp(x).copyto(out, value, casting="unsafe", where=mask)
        return out

    @classmethod
    def forward_(cls, ctx: Any, x: Any, mask: Any, value: Any) -> Any:
        cls._note(ctx, x, mask, value)
        xp(x).copyto(x, value, casting="unsafe", where=mask)
        return x

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (mask,) = ctx.saved_tensors
        need = ctx.needs_input_grad
        m = xp(g)
        gx = gv = None
        if need[0]:
            gx = m.where(mask, g.dtype.type(0), g)
        if need[2]:
            shape, dtype = ctx.meta
            gv = (g * m.broadcast_to(mask, g.shape)).sum().reshape(shape).astype(dtype)
        return gx, None, gv


@tensor_methods
class _IndexingMethods:
    def __getitem__(self, key: Any) -> Tensor:
        # opkit.run written out: indexing is frequent enough for its call to show
        k = index_key(key)
        x = self._data
        if self._requires_grad and _grad_mode.enabled:
            r = Index.apply(self, k)
        else:
            r = wrap(Index.forward(NO_RECORD, x, k))
        if storage(r._data) is storage(x):  # a basic key: a view of self
            link_view(r, self, functools.partial(replay, Index, (k,)))
        return r

    def __setitem__(self, key: Any, value: Any) -> None:
        key = index_key(key)
        if _grad_mode.enabled and inplace_recorded(self, "t[key] = value", value):
            if not (isinstance(value, Tensor) and value._requires_grad):
                value = _on_device_of(
                    self._data, value._data if isinstance(value, Tensor) else value)
            apply_inplace(IndexPut, "t[key] = value", self, value, key)
            return
        x = self._data
        x[key] = _on_device_of(x, value._data if isinstance(value, Tensor) else value)
        bump_version(self)

    def masked_fill(self, mask: Any, value: Any) -> Tensor:
        """Return a copy with ``value`` where ``mask`` (bool, broadcast to self) is True.

        Args:
            mask: a bool tensor broadcastable to self's shape.
            value: a number or a 0-dimensional tensor (which then gets a gradient).

        Raises:
            TypeError: ``mask`` is not bool.
            RuntimeError: ``value`` is a tensor with dimensions.

        Example:
            >>> import mpitensor as mt
            >>> t = mt.tensor([1.0, -2.0, 3.0])
            >>> t.masked_fill(t < 0, 0.0)
            tensor([1., 0., 3.])
        """
        m = _mask_of(mask, "masked_fill()")
        _fill_value(value, "masked_fill()")
        if _grad_mode.enabled and (
            self._requires_grad or (isinstance(value, Tensor) and value._requires_grad)
        ):
            return MaskedFill.apply(self, mask, value)  # a mask tensor's version is noted
        return wrap(MaskedFill.forward(NO_RECORD, self._data, m, _fill_value(value, "")))

    def masked_fill_(self, mask: Any, value: Any) -> Tensor:
        """Write ``value`` into self where ``mask`` (bool, broadcast to self) is True.

        Recorded by autograd when self or ``value`` requires grad; returns self.

        Raises:
            TypeError: ``mask`` is not bool.
            RuntimeError: ``value`` is a tensor with dimensions, or self is a leaf that
                requires grad (outside ``no_grad()``).
        """
        m = _mask_of(mask, "masked_fill_()")
        v = _fill_value(value, "masked_fill_()")
        if _grad_mode.enabled and inplace_recorded(self, "masked_fill_()", value):
            return apply_inplace(MaskedFill, "masked_fill_()", self, mask, value)
        MaskedFill.forward_(NO_RECORD, self._data, m, v)
        bump_version(self)
        return self

    def nonzero(self, *, as_tuple: bool = False) -> Any:
        """Return the indices of non-zero elements: an ``(n, ndim)`` int64 tensor, or a tuple
        of one int64 tensor per dimension."""
        x = self._data
        m = xp(x)
        if as_tuple:
            return tuple(wrap(i.astype(_INT64, copy=False)) for i in m.nonzero(m.atleast_1d(x)))
        return wrap(m.argwhere(x).astype(_INT64, copy=False))
