"""Views by explicit strides, and the legacy ways of changing a tensor's own shape.

``as_strided(x, size, stride, storage_offset)`` looks at the memory that holds ``x`` (its
*storage*: the array that owns the memory ``x`` is a view of, as one flat run of ``x``'s
elements) through new sizes and strides, counted in elements from the storage's start, as in
torch. The result is a view: a write through it shows in ``x`` and the other way round.
``as_strided_`` re-points ``x`` itself; ``as_strided_scatter`` is the out-of-place write.
``Tensor.new`` is the legacy constructor (``x.new(2, 3)``, ``x.new([1, 2])``); ``resize_`` and
``resize_as_`` change a tensor's own shape, reading its storage from its offset on (a new,
larger storage when it does not fit, the old elements copied to its start).

Gradients work on positions in the storage alone: the gradient of a view is added up at the
storage positions it reads (overlapping windows add), then read back at the positions the
input reads, divided by how often the input itself reads each one (an expanded input).

Example:
    >>> import mpitensor as mt
    >>> x = mt.arange(5.0)
    >>> mt.as_strided(x, (3, 2), (1, 1))      # sliding windows of two
    tensor([[0., 1.],
            [1., 2.],
            [2., 3.]])
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Optional

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core.devices import xp
from mpitensor._core.dims import size_from
from mpitensor._core.opkit import NO_RECORD, Function, bump_version, run, tensor_methods, wrap
from mpitensor._ops.indexing import scatter_add_into
from mpitensor.tensor import Size, Tensor

__all__ = ["as_strided", "as_strided_", "as_strided_scatter"]

_ndarray = np.ndarray
_grad_mode = _autograd._mode


# ------------------------------------------------------------------------------- storage
def _owner(a: Any) -> Any:
    """The array that owns ``a``'s memory (``a`` itself when it does, or when its memory
    belongs to a non-array buffer, as after ``frombuffer``)."""
    b = a.base
    if b is None or not hasattr(b, "dtype") or not hasattr(b, "nbytes"):
        return a
    return b


def _storage(a: Any) -> tuple:
    """``(owner, offset, numel)``: the storage of array ``a``, where ``a``'s first element lies
    in it and how many of ``a``'s elements it holds.

    Raises:
        RuntimeError: the owner is not one contiguous block of memory.
    """
    if _backend.is_meta_array(a):  # no memory: a storage of its own elements, in C order
        return a, 0, a.size
    owner = _owner(a)
    if not (owner.flags.c_contiguous or owner.flags.f_contiguous):
        raise RuntimeError(
            "as_strided: the memory under this tensor is not one contiguous block (it is a "
            "strided view of an array made outside mpitensor); clone() the tensor first")
    item = a.dtype.itemsize
    start = _address(a) - _address(owner)
    return owner, start // item, owner.nbytes // item


def _address(a: Any) -> int:
    if isinstance(a, _ndarray):
        return a.__array_interface__["data"][0]
    return int(a.data.ptr)


def _required(size: tuple, stride: tuple, offset: int) -> int:
    """The elements a storage needs for this geometry (0 when it holds no element)."""
    if any(s == 0 for s in size):
        return 0
    return offset + sum((n - 1) * st for n, st in zip(size, stride)) + 1


def _check_geometry(size: tuple, stride: tuple, offset: int, what: str) -> None:
    if len(size) != len(stride):
        raise RuntimeError(f"{what}: size has {len(size)} dimensions and stride "
                           f"{len(stride)}; give one stride per dimension")
    if any(s < 0 for s in stride):
        raise RuntimeError(f"{what}: strides must not be negative, got {list(stride)}")
    if offset < 0:
        raise RuntimeError(f"{what}: storage_offset must not be negative, got {offset}")


def _strided_array(a: Any, size: tuple, stride: tuple, offset: int, what: str) -> Any:
    """The view of ``a``'s storage with this geometry (bounds-checked)."""
    _check_geometry(size, stride, offset, what)
    if _backend.is_meta_array(a):  # no memory to reach past: shapes only, as torch's meta
        return _backend.meta_array(size, a.dtype)
    owner, _, numel = _storage(a)
    need = _required(size, stride, offset)
    if need > numel:
        raise RuntimeError(
            f"{what}: sizes {list(size)} with strides {list(stride)} from storage offset "
            f"{offset} reach element {need - 1} of a storage that holds {numel} elements of "
            f"{_dt.dt_repr(a.dtype)}; choose a geometry inside it")
    item = a.dtype.itemsize
    byte_strides = tuple(st * item for st in stride)
    if isinstance(a, _ndarray):
        return np.ndarray(size, a.dtype, buffer=owner, offset=offset * item if need else 0,
                          strides=byte_strides)
    run = (owner if owner.flags.c_contiguous else owner.transpose()).reshape(-1)  # no copy
    flat = run.view(a.dtype) if owner.dtype != a.dtype else run
    start = flat[offset:] if need else flat[:0]
    return xp(a).lib.stride_tricks.as_strided(start, size, byte_strides)


def _geometry(a: Any) -> tuple:
    """``(shape, strides in elements, offset)`` of ``a`` in its storage."""
    if _backend.is_meta_array(a):
        return tuple(a.shape), _contiguous_strides(tuple(a.shape)), 0
    item = a.dtype.itemsize
    return tuple(a.shape), tuple(s // item for s in a.strides), _storage(a)[1]


def positions(m: Any, geometry: tuple) -> Any:
    """The storage position of every element of an array of this geometry, shaped like it."""
    shape, stride, offset = geometry
    pos = m.full(shape, offset, dtype=np.int64)
    for d, (n, st) in enumerate(zip(shape, stride)):
        pos = pos + (m.arange(n, dtype=np.int64) * st).reshape((n,) + (1,) * (len(shape) - d - 1))
    return pos


# ----------------------------------------------------------------------------------- ops
class AsStrided(Function):
    """``x``'s storage through new sizes and strides; the gradient is added up at the storage
    positions the view reads and read back at those ``x`` reads."""

    @staticmethod
    def forward(ctx: Any, x: Any, size: tuple, stride: tuple, offset: Optional[int]) -> Any:
        geo_in = _geometry(x)
        off = geo_in[2] if offset is None else offset
        out = _strided_array(x, size, stride, off, "as_strided()")
        ctx.meta = (geo_in, (size, stride, off), x.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        geo_in, geo_out, dtype = ctx.meta
        return storage_gradient(g, geo_in, geo_out, dtype), None, None, None


def storage_gradient(g: Any, geo_in: tuple, geo_out: tuple, dtype: Any) -> Any:
    """The gradient for the input of geometry ``geo_in`` of a view of geometry ``geo_out``
    whose gradient is ``g``."""
    m = xp(g)
    pin, pout = positions(m, geo_in), positions(m, geo_out)
    if pin.size == 0:
        return m.zeros(geo_in[0], dtype=dtype)
    span = int(max(int(pin.max()), int(pout.max()) if pout.size else 0)) + 1
    acc = m.zeros(span, dtype=g.dtype)
    if pout.size:
        scatter_add_into(acc, pout.reshape(-1), g.reshape(-1))
    gx = acc[pin]
    counts = m.bincount(pin.reshape(-1), minlength=span)
    if int(counts.max()) > 1:  # the input reads some positions twice (expanded): share
        gx = gx / counts[pin]
    return gx.astype(dtype, copy=False)


def _view_replay(geo_base: tuple, geo_view: tuple, a: Any) -> Any:
    """The view's elements taken from ``a``, an array shaped like the tensor the view was made
    from (the replay autograd uses after an in-place write into either)."""
    m = xp(a)
    pin = positions(np, geo_base).reshape(-1)
    pout = positions(np, geo_view)
    where = np.full(int(max(pin.max(initial=0), pout.max(initial=0))) + 1, -1, dtype=np.int64)
    where[pin] = np.arange(pin.size)
    idx = where[pout]
    if (idx < 0).any():
        raise RuntimeError(
            "as_strided(): this view reads storage outside the tensor it was made from, so "
            "autograd cannot follow an in-place write into either; clone() the view first")
    return a.reshape(-1)[m.asarray(idx)]


def as_strided(input: Tensor, size: Any, stride: Any,  # noqa: A002 - torch's name
               storage_offset: Optional[int] = None) -> Tensor:
    """A view of ``input``'s storage with the given sizes and strides (in elements), starting
    ``storage_offset`` elements into the storage (``input``'s own offset by default).

    Args:
        input: the tensor whose memory is looked at.
        size: the view's shape.
        stride: one stride per dimension, in elements, not negative.
        storage_offset: where the view's first element lies in the storage.

    Raises:
        RuntimeError: a negative stride or offset, or a geometry reaching past the storage.

    Example:
        >>> import mpitensor as mt
        >>> mt.as_strided(mt.arange(4.0), (2, 2), (1, 2))
        tensor([[0., 2.],
                [1., 3.]])
    """
    x = input._data
    off = _storage(x)[1] if storage_offset is None else _int(storage_offset, "storage_offset")
    geo = (tuple(size_from((size,), "as_strided")), _ints(stride, "stride"), off)
    out = run(AsStrided, input, *geo)
    replay = functools.partial(_view_replay, _geometry(x), geo)
    _autograd.link_view(out, input, replay)
    return out


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"as_strided(): {what} must be an integer, got {v!r}")
    return int(v.__index__())


def _ints(v: Any, what: str) -> tuple:
    if isinstance(v, Tensor) or not hasattr(v, "__iter__"):
        v = (v,) if not isinstance(v, Tensor) else tuple(v.tolist())
    return tuple(_int(s, what) for s in v)


def as_strided_(input: Tensor, size: Any, stride: Any,  # noqa: A002 - torch's name
                storage_offset: Optional[int] = None) -> Tensor:
    """Re-point ``input`` itself at its storage with new sizes and strides; returns it.

    Raises:
        RuntimeError: ``input`` requires grad (autograd cannot follow a tensor whose elements
            change identity), or the geometry is invalid (see :func:`as_strided`).
    """
    if input._requires_grad and _grad_mode.enabled:
        raise RuntimeError("as_strided_(): the tensor requires grad, and autograd cannot "
                           "follow a change of what its elements are; use as_strided()")
    x = input._data
    off = _storage(x)[1] if storage_offset is None else _int(storage_offset, "storage_offset")
    input.data = _strided_array(x, tuple(size_from((size,), "as_strided_")),
                                _ints(stride, "stride"), off, "as_strided_()")
    bump_version(input)
    return input


class AsStridedScatter(Function):
    """``input`` with ``src`` written at the storage positions of a strided view; the
    gradient of ``input`` is zero there, that of ``src`` is read from them."""

    @staticmethod
    def forward(ctx: Any, x: Any, src: Any, size: tuple, stride: tuple,
                offset: Optional[int]) -> Any:
        m = xp(x)
        geo_in = _geometry(x) if x.size else (tuple(x.shape), (0,) * x.ndim, 0)
        geo_out = (size, stride, geo_in[2] if offset is None else offset)
        _check_geometry(*geo_out, "as_strided_scatter()")
        if tuple(src.shape) != tuple(size):
            raise RuntimeError(f"as_strided_scatter(): src has shape {list(src.shape)}, the "
                               f"view {list(size)}; they must be the same")
        pin, pout = positions(m, geo_in), positions(m, geo_out)
        span = max(_required(*geo_in[:2], geo_in[2]), _required(*geo_out), 1)
        _, _, numel = _storage(x) if x.size else (None, 0, 0)
        if _required(*geo_out) > max(numel, _required(*geo_in)):
            raise RuntimeError(
                f"as_strided_scatter(): sizes {list(size)} with strides {list(stride)} from "
                f"storage offset {geo_out[2]} reach past the input's storage of {numel} "
                f"elements")
        buf = m.zeros(span, dtype=x.dtype)
        buf[pin] = x
        buf[pout] = src.astype(x.dtype, copy=False)
        ctx.meta = (pin, pout, src.dtype)
        return buf[pin]

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        pin, pout, sdtype = ctx.meta
        m = xp(g)
        span = int(max(int(pin.max(initial=0)), int(pout.max(initial=0)))) + 1
        buf = m.zeros(span, dtype=g.dtype)
        buf[pin] = g
        gsrc = buf[pout].astype(sdtype, copy=False)
        buf[pout] = 0
        return buf[pin], gsrc, None, None, None


def as_strided_scatter(input: Tensor, src: Tensor, size: Any, stride: Any,  # noqa: A002
                       storage_offset: Optional[int] = None) -> Tensor:
    """A copy of ``input`` with ``src`` written where ``input.as_strided(size, stride,
    storage_offset)`` would look (positions counted in ``input``'s storage).

    Example:
        >>> import mpitensor as mt
        >>> mt.as_strided_scatter(mt.zeros(4), mt.ones(2), (2,), (2,))
        tensor([1., 0., 1., 0.])
    """
    if not isinstance(src, Tensor):
        raise TypeError(f"as_strided_scatter(): src must be a Tensor, got {type(src).__name__}")
    geo = (tuple(size_from((size,), "as_strided_scatter")), _ints(stride, "stride"),
           None if storage_offset is None else _int(storage_offset, "storage_offset"))
    if _grad_mode.enabled and (input._requires_grad or src._requires_grad):
        return AsStridedScatter.apply(input, src, *geo)
    return wrap(AsStridedScatter.forward(NO_RECORD, input._data, src._data, *geo))


@tensor_methods
class _StridedMethods:
    def as_strided(self, size: Any, stride: Any, storage_offset: Optional[int] = None) -> Tensor:
        """A view of this tensor's storage with new sizes and strides (see
        :func:`mpitensor.as_strided`)."""
        return as_strided(self, size, stride, storage_offset)

    def as_strided_(self, size: Any, stride: Any,
                    storage_offset: Optional[int] = None) -> Tensor:
        """Re-point this tensor at its storage with new sizes and strides; returns self."""
        return as_strided_(self, size, stride, storage_offset)

    def as_strided_scatter(self, src: Tensor, size: Any, stride: Any,
                           storage_offset: Optional[int] = None) -> Tensor:
        """A copy with ``src`` written through a strided view (see
        :func:`mpitensor.as_strided_scatter`)."""
        return as_strided_scatter(self, src, size, stride, storage_offset)


# ------------------------------------------------------------------- legacy shape changes
def _contiguous_strides(shape: tuple) -> tuple:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def _shared(t: Tensor) -> bool:
    """Whether another live tensor or array may see ``t``'s memory (a view, or viewed)."""
    if _owner(t._data) is not t._data:
        return True
    cell = getattr(t, "_vc", None)
    views = cell[1] if cell is not None else None
    return bool(views) and any(r() is not None and r() is not t for r in views)


def resize_(t: Tensor, shape: tuple, what: str) -> Tensor:
    """Give ``t`` the contiguous ``shape``, its elements read from its storage offset on (see
    :meth:`Tensor.resize_`)."""
    if t._requires_grad:
        raise RuntimeError(f"{what}: the tensor requires grad, and autograd cannot follow a "
                           f"change of its shape; resize a detach()ed copy")
    x = t._data
    if tuple(x.shape) == shape:
        return t
    if _backend.is_meta_array(x):  # no values to keep
        t.data = _backend.meta_array(shape, x.dtype)
        bump_version(t)
        return t
    owner, off, numel = _storage(x)
    need = off + math.prod(shape)
    if need <= numel:
        t.data = _strided_array(x, shape, _contiguous_strides(shape), off, what)
    elif _shared(t):
        raise RuntimeError(
            f"{what}: {list(shape)} needs a storage of {need} elements, this one holds {numel}, "
            f"and other tensors share it (a view, or viewed), which cannot follow it to new "
            f"memory; resize a clone()")
    else:
        grown = xp(x).empty(need, dtype=x.dtype)
        grown[:numel] = _strided_array(x, (numel,), (1,), 0, what)
        t.data = grown[off:].reshape(shape)
    bump_version(t)
    return t


def new(t: Tensor, args: tuple, device: Any) -> Tensor:
    """``t.new(...)``: see :meth:`Tensor.new`."""
    from mpitensor._ops import create as _create  # noqa: PLC0415 - a sibling op module

    x = t._data
    dev = t.device if device is None else device
    if not args:
        return _create.empty(0, dtype=x.dtype, device=dev)
    if len(args) == 1 and isinstance(args[0], Tensor):
        if args[0]._data.dtype != x.dtype:
            raise TypeError(f"new(): the tensor given is {_dt.dt_repr(args[0]._data.dtype)}, "
                            f"this one {_dt.dt_repr(x.dtype)}; they must match (use "
                            f"t.new_tensor(data) to convert)")
        return wrap(args[0]._data)
    first = args[0]
    is_int = isinstance(first, (int, np.integer)) and not isinstance(first, (bool, np.bool_))
    if len(args) == 1 and isinstance(first, Size):
        return _create.empty(*first, dtype=x.dtype, device=dev)
    if len(args) == 1 and not is_int:
        if not hasattr(first, "__len__"):
            raise TypeError(f"new(): data must be a sequence (got {type(first).__name__})")
        return _create.tensor(first, dtype=x.dtype, device=dev)
    return _create.empty(*size_from(args, "new"), dtype=x.dtype, device=dev)


@tensor_methods
class _LegacyMethods:
    def new(self, *args: Any, device: Any = None) -> Tensor:
        """The legacy constructor, in this tensor's dtype and device: ``t.new(2, 3)`` (or a
        ``Size``) uninitialized, ``t.new([1, 2])`` from data, ``t.new()`` empty, and
        ``t.new(other)`` another tensor of the same dtype, sharing its memory.

        Raises:
            TypeError: a scalar as data, or a tensor of another dtype.

        Example:
            >>> import mpitensor as mt
            >>> mt.zeros(1, dtype=mt.int64).new([1.5, 2])
            tensor([1, 2])
        """
        return new(self, args, device)

    def resize_(self, *sizes: Any, memory_format: Any = None) -> Tensor:
        """Give the tensor a new shape, contiguous, its elements read from its storage on
        (values kept in storage order); a larger storage when it does not fit, the old
        elements at its start and the new ones uninitialized. Returns self.

        Raises:
            RuntimeError: the tensor requires grad, or it must grow while other tensors share
                its memory.

        Example:
            >>> import mpitensor as mt
            >>> mt.arange(6.0).resize_(2, 2)
            tensor([[0., 1.],
                    [2., 3.]])
        """
        return resize_(self, tuple(size_from(sizes, "resize_")), "resize_()")

    def resize_as_(self, the_template: Tensor, memory_format: Any = None) -> Tensor:
        """:meth:`resize_` to ``the_template``'s shape; returns self."""
        return resize_(self, tuple(the_template._data.shape), "resize_as_()")

    def resize(self, *sizes: Any) -> Tensor:
        """Deprecated, as in torch: this tensor reshaped to ``sizes``, which must hold as
        many elements (recorded by autograd); warns ``UserWarning``. Use :meth:`reshape`.

        Raises:
            RuntimeError: ``sizes`` holds another number of elements.
        """
        warnings.warn("resize() is deprecated: it cannot change the number of elements; use "
                      "reshape(), or resize_() in place", UserWarning, stacklevel=2)
        return _same_count_reshape(self, tuple(size_from(sizes, "resize")), "resize()")

    def resize_as(self, tensor: Tensor) -> Tensor:
        """Deprecated, as in torch: :meth:`resize` to ``tensor``'s shape."""
        warnings.warn("resize_as() is deprecated: it cannot change the number of elements; "
                      "use reshape_as()", UserWarning, stacklevel=2)
        return _same_count_reshape(self, tuple(tensor._data.shape), "resize_as()")


def _same_count_reshape(t: Tensor, shape: tuple, what: str) -> Tensor:
    n = math.prod(shape)
    if n != t._data.size:
        raise RuntimeError(f"{what}: {list(shape)} holds {n} elements, the tensor "
                           f"{t._data.size}; the out-of-place form keeps the number of "
                           f"elements (resize_() changes it in place)")
    return t.reshape(shape)
