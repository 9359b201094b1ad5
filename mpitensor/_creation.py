"""Making tensors: from data (``tensor``, ``as_tensor``, ``from_numpy``), filled
(``zeros``, ``ones``, ``empty``, ``full``, ``eye``), ranges (``arange``, ``linspace``), shaped
like another (``*_like``) and the ``Tensor.new_*`` methods.

Dtypes default as in torch: Python floats give the default float dtype (float32), ints int64,
bools bool; arrays and tensors keep theirs. ``device`` places the result (``"cpu"``, ``"cuda"``,
``"cuda:N"``); CuPy is imported only for a CUDA device. Random tensors are made in
``mpitensor._random``.

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
from mpitensor import tensor as _t
from mpitensor._devices import DeviceLike, create, move, parse_device
from mpitensor._dims import size_from
from mpitensor._promotion import is_scalar, scalar_dtype
from mpitensor.tensor import Tensor, _from_data, _new, _tensor_methods

__all__ = [
    "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "arange",
    "linspace", "eye", "zeros_like", "ones_like", "empty_like", "full_like",
]

DTypeLike = Any

_ndarray = np.ndarray
_INT64 = _dt.int64


def dtype_or(dtype: DTypeLike, default: np.dtype) -> np.dtype:
    """``dtype`` read as a NumPy dtype, or ``default`` when it is None."""
    return default if dtype is None else _dt.to_dtype(dtype)


def finish(arr: Any, requires_grad: bool) -> Tensor:
    """A new tensor of ``arr``, marked for autograd when asked (float/complex only)."""
    t = _new(arr)
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


def _filled(name: str, size: tuple, fname: str, dtype: Any, device: Any, rg: bool) -> Tensor:
    shape = size_from(size, fname)
    dt = dtype_or(dtype, _dt.get_default_dtype())
    return finish(create(parse_device(device), name, shape, dtype=dt), rg)


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
    dev = parse_device(device)
    if isinstance(data, Tensor):
        data = data._data
    if isinstance(data, _ndarray) or _backend.is_cupy_array(data):
        src_dev = _backend.device_of(data)
        arr = data.astype(dt if dt is not None else data.dtype, copy=True)
        if dev is not None and dev != src_dev:
            arr = move(arr, dev)
        _dt.to_dtype(arr.dtype)
    else:
        arr = move(_from_data(data, dt), dev)
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
    dev = parse_device(device)
    if isinstance(data, Tensor):
        x = data._data
        r = move(x, dev)
        if dt is not None:
            r = r.astype(dt, copy=False)
        return data if r is x else _new(r)
    if isinstance(data, _ndarray) or _backend.is_cupy_array(data):
        if isinstance(data, _ndarray) and type(data) is not _ndarray:
            data = data.view(_ndarray)
        r = move(data, dev)
        if dt is not None:
            r = r.astype(dt, copy=False)
        _dt.to_dtype(r.dtype)
        return _new(r)
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
    return _new(ndarray)


def zeros(
    *size: Any, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    """Make a tensor of zeros.

    Args:
        size: ints or one tuple/list, e.g. ``zeros(2, 3)`` or ``zeros((2, 3))``.
        dtype: element type (default float32, see :func:`get_default_dtype`).
        device: ``"cpu"`` (default), ``"cuda"``, ``"cuda:N"`` or a :class:`device`.
        requires_grad: mark the result for autograd.

    Raises:
        TypeError: sizes are not ints.
        ValueError: a size is negative.

    Example:
        >>> zeros(2, 3).shape
        mpitensor.Size([2, 3])
    """
    return _filled("zeros", size, "zeros", dtype, device, requires_grad)


def ones(
    *size: Any, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    """Make a tensor of ones (arguments as in :func:`zeros`).

    Example:
        >>> import mpitensor as mt
        >>> mt.ones(2, dtype=mt.int64)
        tensor([1, 1])
    """
    return _filled("ones", size, "ones", dtype, device, requires_grad)


def empty(
    *size: Any, dtype: DTypeLike = None, device: DeviceLike = None, requires_grad: bool = False
) -> Tensor:
    """Make an uninitialized tensor (arguments as in :func:`zeros`).

    Example:
        >>> empty(4).numel()
        4
    """
    return _filled("empty", size, "empty", dtype, device, requires_grad)


def full(
    size: Any,
    fill_value: Any,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
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
    shape = size_from(size if isinstance(size, (tuple, list)) else (size,), "full")
    dt = dtype_or(dtype, scalar_dtype(fill_value))
    return finish(create(parse_device(device), "full", shape, fill_value, dtype=dt),
                   requires_grad)


def zeros_like(
    input: Any, *, dtype: DTypeLike = None, device: DeviceLike = None,  # noqa: A002
    requires_grad: bool = False,
) -> Tensor:
    """Make zeros with the shape (and by default dtype and device) of ``input``.

    Example:
        >>> zeros_like(tensor([1, 2]))
        tensor([0, 0])
    """
    shape, dt, dev = like_args(input, dtype, device)
    return finish(create(dev, "zeros", shape, dtype=dt), requires_grad)


def ones_like(
    input: Any, *, dtype: DTypeLike = None, device: DeviceLike = None,  # noqa: A002
    requires_grad: bool = False,
) -> Tensor:
    """Make ones with the shape (and by default dtype and device) of ``input``.

    Example:
        >>> ones_like(zeros(2))
        tensor([1., 1.])
    """
    shape, dt, dev = like_args(input, dtype, device)
    return finish(create(dev, "ones", shape, dtype=dt), requires_grad)


def empty_like(
    input: Any, *, dtype: DTypeLike = None, device: DeviceLike = None,  # noqa: A002
    requires_grad: bool = False,
) -> Tensor:
    """Make an uninitialized tensor with the shape (dtype, device) of ``input``.

    Example:
        >>> empty_like(zeros(2, 3)).shape
        mpitensor.Size([2, 3])
    """
    shape, dt, dev = like_args(input, dtype, device)
    return finish(create(dev, "empty", shape, dtype=dt), requires_grad)


def full_like(
    input: Any, fill_value: Any, *, dtype: DTypeLike = None,  # noqa: A002
    device: DeviceLike = None, requires_grad: bool = False,
) -> Tensor:
    """Make a tensor like ``input`` filled with ``fill_value`` (keeping ``input``'s dtype).

    Example:
        >>> full_like(zeros(2), 3)
        tensor([3., 3.])
    """
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    shape, dt, dev = like_args(input, dtype, device)
    return finish(create(dev, "full", shape, fill_value, dtype=dt), requires_grad)


def arange(
    start: Any,
    end: Any = None,
    step: Any = 1,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
    """Make ``[start, start + step, ...]`` up to (not including) ``end``, like ``torch.arange``.

    All-integer arguments give int64; any float gives the default dtype (float32). Values are
    computed as ``start + i * step`` in double precision.

    Args:
        start: first value (or ``end`` when it is the only argument).
        end: bound, excluded.
        step: increment, non-zero, with the sign of ``end - start``.
        dtype, device, requires_grad: as in :func:`zeros`.

    Raises:
        ValueError: ``step`` is zero or points away from ``end``.

    Example:
        >>> arange(5)
        tensor([0, 1, 2, 3, 4])
        >>> arange(0, 1, 0.25)
        tensor([0.0000, 0.2500, 0.5000, 0.7500])
    """
    if end is None:
        start, end = 0, start
    vals = []
    for v in (start, end, step):
        if isinstance(v, (Tensor, np.generic)):
            v = v.item()
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise TypeError(f"arange() takes real numbers, got {v!r}")
        vals.append(v)
    start, end, step = vals
    if step == 0:
        raise ValueError("arange(): step must be nonzero")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise ValueError(
            f"arange(): upper bound and lower bound inconsistent with step sign "
            f"(start={start}, end={end}, step={step})"
        )
    all_int = all(isinstance(v, int) for v in vals)
    dt = dtype_or(dtype, _INT64 if all_int else _dt.get_default_dtype())
    dev = parse_device(device)
    if all_int:
        n = max(0, -((start - end) // step))
    else:
        n = max(0, math.ceil((end - start) / step))
    if all_int and dt.kind in "iu":
        arr = np.arange(start, start + n * step, step, dtype=dt)[:n]
    else:
        arr = (start + np.arange(n, dtype=np.float64) * step).astype(dt)
    return finish(move(arr, dev), requires_grad)


def linspace(
    start: Any,
    end: Any,
    steps: int,
    *,
    dtype: DTypeLike = None,
    device: DeviceLike = None,
    requires_grad: bool = False,
) -> Tensor:
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
    return finish(move(arr.astype(dt), parse_device(device)), requires_grad)


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
    return finish(create(parse_device(device), "eye", n, m, dtype=dt), requires_grad)


@_tensor_methods
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

    def new_zeros(self, *size: Any, dtype: DTypeLike = None, device: DeviceLike = None,
                  requires_grad: bool = False) -> Tensor:
        """Return zeros of ``size`` with this tensor's dtype and device by default."""
        return zeros(*size, dtype=self.dtype if dtype is None else dtype,
                     device=self.device if device is None else device,
                     requires_grad=requires_grad)

    def new_ones(self, *size: Any, dtype: DTypeLike = None, device: DeviceLike = None,
                 requires_grad: bool = False) -> Tensor:
        """Return ones of ``size`` with this tensor's dtype and device by default."""
        return ones(*size, dtype=self.dtype if dtype is None else dtype,
                    device=self.device if device is None else device,
                    requires_grad=requires_grad)

    def new_empty(self, *size: Any, dtype: DTypeLike = None, device: DeviceLike = None,
                  requires_grad: bool = False) -> Tensor:
        """Return an uninitialized tensor of ``size`` with this tensor's dtype and device."""
        return empty(*size, dtype=self.dtype if dtype is None else dtype,
                     device=self.device if device is None else device,
                     requires_grad=requires_grad)

    def new_full(self, size: Any, fill_value: Any, *, dtype: DTypeLike = None,
                 device: DeviceLike = None, requires_grad: bool = False) -> Tensor:
        """Return ``size`` filled with ``fill_value``, this tensor's dtype and device by default."""
        return full(size, fill_value, dtype=self.dtype if dtype is None else dtype,
                    device=self.device if device is None else device,
                    requires_grad=requires_grad)

    # dtype casts named as in torch; defined last because their names shadow builtins in the


_t._serve({name: globals()[name] for name in __all__})
