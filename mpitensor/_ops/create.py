"""Making tensors: from data (``tensor``, ``as_tensor``, ``from_numpy``), filled
(``zeros``, ``ones``, ``empty``, ``full``, ``eye``), ranges (``arange``, ``linspace``), shaped
like another (``*_like``) and the ``Tensor.new_*`` methods.

Dtypes default as in torch: Python floats give the default float dtype (float32), ints int64,
bools bool; arrays and tensors keep theirs. ``device`` places the result (``"cpu"``, ``"cuda"``,
``"cuda:N"``); CuPy is imported only for a CUDA device. Random tensors are made in
``mpitensor._ops.random``.

Example:
    >>> import mpitensor as mt
    >>> mt.zeros(2, 3).shape
    mpitensor.Size([2, 3])
"""

from __future__ import annotations

import math
import operator
from typing import Any, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core.devices import DeviceLike, create, factory_device, move, parse_device
from mpitensor._core.dims import keyword_form, size_from
from mpitensor._core.opkit import copy_into, serve, tensor_methods, wrap
from mpitensor._core.promotion import is_scalar, scalar_dtype
from mpitensor._core.python_data import array_from_data
from mpitensor.tensor import Tensor

__all__ = [
    "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "arange",
    "linspace", "eye", "zeros_like", "ones_like", "empty_like", "full_like",
    "memory_format", "contiguous_format", "preserve_format", "channels_last",
    "channels_last_3d", "layout", "strided",
]

DTypeLike = Any

_ndarray = np.ndarray
_INT64 = _dt.int64


class BadValueError(ValueError, RuntimeError):
    """A bad argument value where torch raises ``RuntimeError``: catchable as either, so
    code written against torch and code that expects a ``ValueError`` both see it."""


class UnsupportedDtypeError(TypeError, NotImplementedError):
    """A dtype an operation does not support (an integer tensor for a float-only draw),
    where torch raises ``NotImplementedError``: catchable as either that or ``TypeError``."""


class _NamedConstant:
    """A singleton torch exposes as ``torch.<name>``: shown and pickled by that name."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"mpitensor.{self._name}"

    def __reduce__(self) -> str:
        return self._name


class memory_format(_NamedConstant):  # noqa: N801 - torch's name
    """A memory layout request (``contiguous_format``, ``preserve_format``,
    ``channels_last``, ``channels_last_3d``), accepted where torch takes one.

    Arrays here are always laid out as NumPy/CuPy make them (C order), so every format gives
    the same values; only the stride pattern, which mpitensor does not expose, would differ.
    """

    __slots__ = ()


class layout(_NamedConstant):  # noqa: N801 - torch's name
    """A tensor layout; ``strided`` (dense) is the only one mpitensor has."""

    __slots__ = ()


contiguous_format = memory_format("contiguous_format")
preserve_format = memory_format("preserve_format")
channels_last = memory_format("channels_last")
channels_last_3d = memory_format("channels_last_3d")
strided = layout("strided")


def check_placement(fname: str, layout: Any = None, memory_format: Any = None,
                    pin_memory: Any = False) -> None:
    """Check the ``layout=``, ``memory_format=`` and ``pin_memory=`` arguments torch's
    constructors take (all dense C-order arrays here, so they change no values).

    Raises:
        TypeError: an argument of the wrong kind.
        BadValueError: a layout other than ``strided``.
    """
    if memory_format is not None and not isinstance(memory_format, globals()["memory_format"]):
        raise TypeError(f"{fname}(): memory_format must be a mpitensor.memory_format such as "
                        f"mpitensor.contiguous_format, got {memory_format!r}")
    if layout is not None:
        if not isinstance(layout, globals()["layout"]):
            raise TypeError(f"{fname}(): layout must be mpitensor.strided, got {layout!r}")
        if layout is not strided:
            raise BadValueError(f"{fname}(): only the strided layout is supported")
    if pin_memory not in (None, False, True):
        raise TypeError(f"{fname}(): pin_memory must be a bool, got {pin_memory!r}")


def write_into(out: Any, arr: Any, fname: str) -> Tensor:
    """Write the new array ``arr`` into the ``out=`` tensor, which is resized (new storage)
    where its shape differs, as torch resizes; returns ``out``.

    Raises:
        TypeError: ``out`` is not a Tensor.
        RuntimeError: ``out`` requires grad while grad mode is on.
    """
    if not isinstance(out, Tensor):
        raise TypeError(f"{fname}(): out must be a Tensor, got {type(out).__name__}")
    from mpitensor import autograd as _ag  # noqa: PLC0415 - a layer below; imported by now

    if out.requires_grad and _ag.is_grad_enabled():
        raise RuntimeError(f"{fname}(): out= does not take part in autograd, but out requires "
                           f"grad; pass a tensor that does not, or call under no_grad()")
    x = out._data
    if tuple(arr.shape) != tuple(x.shape):
        out._data = create(_backend.device_of(x), "empty", tuple(arr.shape), dtype=x.dtype)
    copy_into(out._data, arr)
    _ag.bump_version(out)
    return out


def sizes(size: tuple, kw: Any, fname: str) -> tuple:
    """The shape of a constructor called with sizes as varargs, one sequence, or ``size=``.

    Raises:
        TypeError: both, or sizes that are not ints.
        BadValueError: (a ``ValueError`` and ``RuntimeError``) a negative size.
    """
    if kw is not None:
        if size:
            raise TypeError(f"{fname}(): pass the size either positionally or as size=, not "
                            f"both")
        size = (kw,)
    if len(size) == 1 and not isinstance(size[0], (tuple, list)):
        try:
            operator.index(size[0])
        except TypeError:
            raise TypeError(f"{fname}(): size must be ints or one tuple of ints, got "
                            f"{size[0]!r}") from None
    try:
        return size_from(size, fname)
    except ValueError as e:  # a negative size: torch raises RuntimeError
        raise BadValueError(str(e)) from None


def dtype_or(dtype: DTypeLike, default: np.dtype) -> np.dtype:
    """``dtype`` read as a NumPy dtype, or ``default`` when it is None."""
    return default if dtype is None else _dt.to_dtype(dtype)


def finish(arr: Any, requires_grad: bool) -> Tensor:
    """A new tensor of ``arr``, marked for autograd when asked (float/complex only)."""
    t = wrap(arr)
    if requires_grad:
        t.requires_grad = True
    return t


def like_args(t: Any, dtype: Any, device: Any) -> tuple:
    """``(shape, dtype, device)`` of a ``*_like`` call: ``t``'s, unless given.

    Raises:
        TypeError: ``t`` is neither a tensor nor an array.
    """
    x = t._data if isinstance(t, Tensor) else t
    if not (isinstance(x, _ndarray) or _backend.is_cupy_array(x)):
        raise TypeError(f"expected a Tensor or an array, got {type(t).__name__}")
    dt = x.dtype if dtype is None else _dt.to_dtype(dtype)
    dev = _backend.device_of(x) if device is None else parse_device(device)
    return x.shape, dt, dev


def _size_kw(kwargs: dict, fname: str) -> Any:
    """The ``size=`` keyword of a constructor that takes sizes as varargs (None if absent).

    Raises:
        TypeError: any other keyword.
    """
    size = kwargs.pop("size", None)
    if kwargs:
        raise TypeError(f"{fname}() got unexpected keyword arguments {sorted(kwargs)}")
    return size


def _filled(name: str, size: tuple, fname: str, dtype: Any, device: Any, rg: bool,
            out: Any = None, size_kw: Any = None, **placement: Any) -> Tensor:
    shape = sizes(size, size_kw, fname)
    check_placement(fname, **placement)
    if out is not None:
        default = out.dtype if isinstance(out, Tensor) else None
        dt = dtype_or(dtype, default or _dt.get_default_dtype())
        dev = parse_device(device) or _backend.device_of(getattr(out, "_data", None))
        return write_into(out, create(dev, name, shape, dtype=dt), fname)
    dt = dtype_or(dtype, _dt.get_default_dtype())
    return finish(create(factory_device(device), name, shape, dtype=dt), rg)


def tensor(
    data: Any,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make a new tensor holding a copy of ``data``, like ``torch.tensor``.

    Python floats become the default dtype (float32), ints int64, bools bool and complex numbers
    complex64; arrays and tensors keep their dtype.

    Args:
        data: a number, nested lists/tuples of numbers, a NumPy/CuPy array or a Tensor.
        dtype: the element type (default: inferred as above).
        device: ``"cpu"`` (default), ``"cuda"``, ``"cuda:N"`` or a :class:`device`.
        requires_grad: mark the result for autograd (float/complex only).

    Returns:
        A new Tensor that shares no memory with ``data``.

    Raises:
        TypeError: the data is not numeric, or ``dtype``/``device`` is not understood.
        ValueError: nested sequences are ragged.

    Example:
        >>> tensor([[1, 2], [3, 4]]).dtype
        dtype('int64')
    """
    dt = None if dtype is None else _dt.to_dtype(dtype)
    dev = factory_device(device)
    if isinstance(data, Tensor):
        data = data._data
    if isinstance(data, _ndarray) or _backend.is_cupy_array(data):
        src_dev = _backend.device_of(data)
        arr = data.astype(dt if dt is not None else data.dtype, copy=True)
        if dev is not None and dev != src_dev:
            arr = move(arr, dev)
        _dt.to_dtype(arr.dtype)
    else:
        arr = move(array_from_data(data, dt), dev)
    return finish(arr, requires_grad)


def as_tensor(data: Any, dtype: DTypeLike = None, device: DeviceLike = None) -> Tensor:
    """Make a tensor from ``data`` sharing memory when possible (same dtype and device).

    Args:
        data: a Tensor, a NumPy/CuPy array, or Python data (copied, as in :func:`tensor`).
        dtype: the element type (default: keep or infer).
        device: the target device (default: keep, CPU for Python data).

    Returns:
        ``data`` itself for a Tensor that already matches; otherwise a new Tensor.

    Example:
        >>> import numpy as np
        >>> a = np.zeros(2); as_tensor(a)._data is a
        True
    """
    dt = None if dtype is None else _dt.to_dtype(dtype)
    dev = factory_device(device)
    if isinstance(data, Tensor):
        x = data._data
        r = move(x, dev)
        if dt is not None:
            r = r.astype(dt, copy=False)
        return data if r is x else wrap(r)
    if isinstance(data, _ndarray) or _backend.is_cupy_array(data):
        if isinstance(data, _ndarray) and type(data) is not _ndarray:
            data = data.view(_ndarray)
        r = move(data, dev)
        if dt is not None:
            r = r.astype(dt, copy=False)
        _dt.to_dtype(r.dtype)
        return wrap(r)
    return tensor(data, dtype=dt, device=dev)


def from_numpy(ndarray: np.ndarray) -> Tensor:
    """Wrap a NumPy array in a Tensor that shares its memory (writes go both ways).

    Args:
        ndarray: a ``numpy.ndarray`` of a supported dtype.

    Returns:
        A CPU Tensor whose ``_data`` is ``ndarray``.

    Raises:
        TypeError: not a NumPy array, or an unsupported dtype (object, strings, ...).

    Example:
        >>> import numpy as np
        >>> a = np.arange(3); t = from_numpy(a); a[0] = 7; t
        tensor([7, 1, 2])
    """
    if not isinstance(ndarray, _ndarray):
        raise TypeError(
            f"from_numpy() expects a numpy.ndarray, got {type(ndarray).__name__}; use "
            f"mpitensor.tensor() for other data"
        )
    _dt.to_dtype(ndarray.dtype)
    if type(ndarray) is not _ndarray:
        ndarray = ndarray.view(_ndarray)
    return wrap(ndarray)


def zeros(
    *size: Any, out: Optional[Tensor] = None, dtype: DTypeLike = None, layout: Any = None,
    device: DeviceLike = None, requires_grad: bool = False, pin_memory: bool = False,
    **kwargs: Any,
) -> Tensor:
    """Make a tensor of zeros.

    Args:
        size: ints, one tuple/list/Size, or ``size=``: ``zeros(2, 3)``, ``zeros((2, 3))``.
        out: a tensor to write the result into (resized if its shape differs; its dtype
            and device are the defaults).
        dtype: element type (default float32, see :func:`get_default_dtype`).
        layout, pin_memory (and ``memory_format`` for :func:`empty`): accepted as torch takes
            them; arrays here are dense and C-ordered, so they change no values.
        device: ``"cpu"`` (default), ``"cuda"``, ``"cuda:N"`` or a :class:`device`.
        requires_grad: mark the result for autograd.

    Raises:
        TypeError: sizes are not ints.
        ValueError: a size is negative.

    Example:
        >>> zeros(2, 3).shape
        mpitensor.Size([2, 3])
    """
    return _filled("zeros", size, "zeros", dtype, device, requires_grad, out,
                   _size_kw(kwargs, "zeros"), layout=layout, pin_memory=pin_memory)


def ones(
    *size: Any, out: Optional[Tensor] = None, dtype: DTypeLike = None, layout: Any = None,
    device: DeviceLike = None, requires_grad: bool = False, pin_memory: bool = False,
    **kwargs: Any,
) -> Tensor:
    """Make a tensor of ones (arguments as in :func:`zeros`).

    Example:
        >>> import mpitensor as mt
        >>> mt.ones(2, dtype=mt.int64)
        tensor([1, 1])
    """
    return _filled("ones", size, "ones", dtype, device, requires_grad, out,
                   _size_kw(kwargs, "ones"), layout=layout, pin_memory=pin_memory)


def empty(
    *size: Any, out: Optional[Tensor] = None, dtype: DTypeLike = None, layout: Any = None,
    device: DeviceLike = None, requires_grad: bool = False, pin_memory: bool = False,
    memory_format: Any = None, **kwargs: Any,
) -> Tensor:
    """Make an uninitialized tensor (arguments as in :func:`zeros`).

    Example:
        >>> empty(4).numel()
        4
    """
    return _filled("empty", size, "empty", dtype, device, requires_grad, out,
                   _size_kw(kwargs, "empty"), layout=layout, pin_memory=pin_memory,
                   memory_format=memory_format)


def full(size: Any, fill_value: Any, *, out: Optional[Tensor] = None, dtype: DTypeLike = None,
         layout: Any = None, device: DeviceLike = None, pin_memory: bool = False,
         requires_grad: bool = False) -> Tensor:
    """Make a tensor filled with ``fill_value``; the dtype follows the value as in torch.

    Args:
        size: an int or a tuple/list of ints.
        fill_value: a number or a one-element tensor (bool -> bool, int -> int64,
            float -> default dtype, complex -> default complex).
        dtype, device, requires_grad: as in :func:`zeros`.

    Example:
        >>> full((2,), 7)
        tensor([7, 7])
    """
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    elif isinstance(fill_value, np.generic):
        fill_value = fill_value.item()
    if not is_scalar(fill_value):
        raise TypeError(f"full(): fill_value must be a number, got {fill_value!r}")
    check_placement("full", layout, None, pin_memory)
    shape = sizes((size if isinstance(size, (tuple, list)) else (size,)), None, "full")
    if out is not None:
        dt = dtype_or(dtype, getattr(out, "dtype", None) or scalar_dtype(fill_value))
        dev = parse_device(device) or _backend.device_of(getattr(out, "_data", None))
        return write_into(out, create(dev, "full", shape, fill_value, dtype=dt), "full")
    dt = dtype_or(dtype, scalar_dtype(fill_value))
    return finish(create(factory_device(device), "full", shape, fill_value, dtype=dt),
                   requires_grad)


def _like(kind: str, doc: str) -> Any:
    """The public function ``{kind}_like``: ``create(kind)`` with the shape (and by default
    the dtype and device) of ``input``."""

    def like(input: Any, *, dtype: DTypeLike = None, layout: Any = None,  # noqa: A002
             device: DeviceLike = None, requires_grad: bool = False, memory_format: Any = None,
             pin_memory: bool = False) -> Tensor:
        check_placement("*_like", layout, memory_format, pin_memory)
        shape, dt, dev = like_args(input, dtype, device)
        return finish(create(dev, kind, shape, dtype=dt), requires_grad)

    like.__name__ = like.__qualname__ = f"{kind}_like"
    like.__doc__ = doc
    return like


zeros_like = _like("zeros", """Make zeros with the shape (and by default dtype and device) of
    ``input``.

    Example:
        >>> zeros_like(tensor([1, 2]))
        tensor([0, 0])
    """)
ones_like = _like("ones", """Make ones with the shape (and by default dtype and device) of
    ``input``.

    Example:
        >>> ones_like(zeros(2))
        tensor([1., 1.])
    """)
empty_like = _like("empty", """Make an uninitialized tensor with the shape (dtype, device) of
    ``input``.

    Example:
        >>> empty_like(zeros(2, 3)).shape
        mpitensor.Size([2, 3])
    """)


def full_like(
    input: Any, fill_value: Any, *, dtype: DTypeLike = None, layout: Any = None,  # noqa: A002
    device: DeviceLike = None, requires_grad: bool = False, memory_format: Any = None,
    pin_memory: bool = False,
) -> Tensor:
    """Make a tensor like ``input`` filled with ``fill_value`` (keeping ``input``'s dtype).

    Example:
        >>> full_like(zeros(2), 3)
        tensor([3., 3.])
    """
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    check_placement("*_like", layout, memory_format, pin_memory)
    shape, dt, dev = like_args(input, dtype, device)
    return finish(create(dev, "full", shape, fill_value, dtype=dt), requires_grad)


def arange(start: Any = None, end: Any = None, step: Any = 1, *, out: Optional[Tensor] = None,
           dtype: DTypeLike = None, layout: Any = None, device: DeviceLike = None,
           pin_memory: bool = False, requires_grad: bool = False) -> Tensor:
    """Make ``[start, start + step, ...]`` up to (not including) ``end``, like ``torch.arange``.

    All-integer arguments give int64; any float gives the default dtype (float32). Values are
    computed as ``start + i * step`` in double precision.

    Args:
        start: first value (or ``end`` when it is the only argument).
        end: bound, excluded.
        step: increment, non-zero, with the sign of ``end - start``.
        dtype, device, requires_grad: as in :func:`zeros`.

    Raises:
        TypeError: no end.
        BadValueError: (a ``ValueError`` and ``RuntimeError``) ``step`` is zero or points
            away from ``end``.

    Example:
        >>> arange(5)
        tensor([0, 1, 2, 3, 4])
        >>> arange(0, 1, 0.25)
        tensor([0.0000, 0.2500, 0.5000, 0.7500])
    """
    if end is None:
        if start is None:
            raise TypeError("arange() needs an end: arange(end), arange(start, end[, step]) "
                            "or arange(end=...)")
        start, end = 0, start
    elif start is None:
        start = 0
    check_placement("arange", layout, None, pin_memory)
    vals = []
    for v in (start, end, step):
        if isinstance(v, (Tensor, np.generic)):
            v = v.item()
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise TypeError(f"arange() takes real numbers, got {v!r}")
        vals.append(v)
    start, end, step = vals
    if not all(math.isfinite(v) for v in vals):
        raise BadValueError(f"arange(): start, end and step must be finite, got {vals}")
    all_int = all(isinstance(v, int) for v in vals)
    if dtype is None and isinstance(out, Tensor):
        dtype = out._data.dtype
    dt = dtype_or(dtype, _INT64 if all_int else _dt.get_default_dtype())
    if dt.kind == "b":
        raise UnsupportedDtypeError("arange() does not make bool tensors")
    # an integer dtype takes the bounds and step cut to ints, as torch does; the length comes
    # from the cut values for int64 and from the given ones for the narrower integer types
    istart, iend, istep = (int(v) for v in vals) if dt.kind in "iu" else vals
    if (istep if dt == _INT64 else step) == 0:
        raise BadValueError("arange(): step must be nonzero")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise BadValueError(
            f"arange(): upper bound and lower bound inconsistent with step sign "
            f"(start={start}, end={end}, step={step})"
        )
    if all_int or dt == _INT64:
        n = max(0, -((istart - iend) // istep))
    else:
        n = max(0, math.ceil((end - start) / step))
    if dt.kind in "iu":
        arr = (istart + np.arange(n, dtype=np.int64) * istep).astype(dt)
    else:
        arr = (start + np.arange(n, dtype=np.float64) * step).astype(dt)
    if out is not None:
        return write_into(out, arr, "arange")
    dev = factory_device(device)
    return finish(move(arr, dev), requires_grad)


def linspace(start: Any, end: Any, steps: int, *, dtype: DTypeLike = None,
             device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
    """Make ``steps`` evenly spaced values from ``start`` to ``end`` inclusive.

    Raises:
        ValueError: ``steps`` is negative.

    Example:
        >>> linspace(0, 1, 3)
        tensor([0.0000, 0.5000, 1.0000])
    """
    steps = operator.index(steps)
    if steps < 0:
        raise ValueError(f"linspace(): number of steps must be non-negative, got {steps}")
    start = start.item() if isinstance(start, Tensor) else start
    end = end.item() if isinstance(end, Tensor) else end
    default = _dt.default_complex_dtype() if isinstance(start + end, complex) else None
    dt = dtype_or(dtype, default or _dt.get_default_dtype())
    arr = np.linspace(start, end, steps, dtype=np.complex128 if dt.kind == "c" else np.float64)
    return finish(move(arr.astype(dt), factory_device(device)), requires_grad)


def eye(
    n: int,
    m: Optional[int] = None,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make an ``n x m`` identity matrix (``m`` defaults to ``n``).

    Example:
        >>> eye(2)
        tensor([[1., 0.],
                [0., 1.]])
    """
    n = operator.index(n)
    m = n if m is None else operator.index(m)
    if n < 0 or m < 0:
        raise ValueError(f"eye(): n and m must be >= 0, got n={n}, m={m}")
    dt = dtype_or(dtype, _dt.get_default_dtype())
    return finish(create(factory_device(device), "eye", n, m, dtype=dt), requires_grad)


def _new_like(t: Tensor, maker: Any, sizes: tuple, size: Any, dtype: Any, device: Any,
              requires_grad: bool, what: str) -> Tensor:
    """``maker(size)`` (zeros, ones, empty) with ``t``'s dtype and device unless given."""
    return maker(*keyword_form(sizes, {} if size is None else {"size": size}, "size", what),
                 dtype=t.dtype if dtype is None else dtype,
                 device=t.device if device is None else device, requires_grad=requires_grad)


@tensor_methods
class _CreationMethods:
    def new_tensor(
        self, data: Any, *, dtype: DTypeLike = None, device: DeviceLike = None,
        requires_grad: bool = False,
    ) -> Tensor:
        """Return ``tensor(data)`` with this tensor's dtype and device by default."""
        return tensor(
            data,
            dtype=self.dtype if dtype is None else dtype,
            device=self.device if device is None else device,
            requires_grad=requires_grad,
        )

    def new_zeros(self, *sizes: Any, size: Any = None, dtype: DTypeLike = None,
                  device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
        """Return zeros of ``size`` with this tensor's dtype and device by default."""
        return _new_like(self, zeros, sizes, size, dtype, device, requires_grad, "new_zeros")

    def new_ones(self, *sizes: Any, size: Any = None, dtype: DTypeLike = None,
                 device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
        """Return ones of ``size`` with this tensor's dtype and device by default."""
        return _new_like(self, ones, sizes, size, dtype, device, requires_grad, "new_ones")

    def new_empty(self, *sizes: Any, size: Any = None, dtype: DTypeLike = None,
                  device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
        """Return an uninitialized tensor of ``size`` with this tensor's dtype and device."""
        return _new_like(self, empty, sizes, size, dtype, device, requires_grad, "new_empty")

    def new_full(self, size: Any, fill_value: Any, *, dtype: DTypeLike = None,
                 device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
        """Return ``size`` filled with ``fill_value``, this tensor's dtype and device by default."""
        return full(size, fill_value, dtype=self.dtype if dtype is None else dtype,
                    device=self.device if device is None else device,
                    requires_grad=requires_grad)

    # dtype casts named as in torch; defined last because their names shadow builtins in the


@tensor_methods
class _MetaMethods:
    @property
    def is_meta(self) -> bool:
        """True for a tensor on the meta device (a shape and a dtype, no data)."""
        return _backend.device_of(self._data).type == "meta"


serve({name: globals()[name] for name in __all__})
