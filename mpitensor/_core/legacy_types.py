"""torch's legacy typed tensor constructors (``FloatTensor``, ``LongTensor``, ...) and the
``'torch.FloatTensor'``-style type names that ``Tensor.type`` reads and writes.

Each constructor makes a plain :class:`~mpitensor.Tensor` of its dtype on the CPU; the class
is never the tensor's own type, but ``isinstance(t, FloatTensor)`` asks whether ``t`` is a CPU
float32 tensor, as torch answers it. The calls torch takes:

- nothing: an empty 1-D tensor;
- sizes as ints or one ``Size``: an uninitialized tensor of that shape;
- a list, a tuple or an array: a copy of that data in the constructor's dtype (a tuple is
  data, not a shape, as in torch);
- a tensor of the same dtype: that tensor's data, shared.

Example:
    >>> import mpitensor as mt
    >>> mt.LongTensor([1, 2])
    tensor([1, 2])
    >>> isinstance(mt.zeros(2), mt.FloatTensor), mt.FloatTensor(2, 3).shape
    (True, mpitensor.Size([2, 3]))
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core.devices import parse_device
from mpitensor._ops.create import BadValueError, empty, tensor
from mpitensor.tensor import Size, Tensor

__all__ = [
    "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
    "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor", "ComplexFloatTensor",
    "ComplexDoubleTensor", "set_default_tensor_type",
]

# type name -> dtype name, in torch's spelling
_NAMES = {
    "FloatTensor": "float32", "DoubleTensor": "float64", "HalfTensor": "float16",
    "BFloat16Tensor": "bfloat16", "LongTensor": "int64", "IntTensor": "int32",
    "ShortTensor": "int16", "CharTensor": "int8", "ByteTensor": "uint8", "BoolTensor": "bool",
    "ComplexFloatTensor": "complex64", "ComplexDoubleTensor": "complex128",
    "UInt16Tensor": "uint16", "UInt32Tensor": "uint32", "UInt64Tensor": "uint64",
}


class _LegacyTensorType(type):
    """The metaclass of the legacy constructors: calling one makes a Tensor; ``isinstance``
    compares dtype and device."""

    dtype: np.dtype

    def __instancecheck__(cls, obj: Any) -> bool:
        return (isinstance(obj, Tensor) and obj._data.dtype == cls.dtype
                and not _backend.is_cupy_array(obj._data))

    def __repr__(cls) -> str:
        return f"<class 'mpitensor.{cls.__name__}'>"

    def __call__(cls, *args: Any, device: Any = None) -> Tensor:
        dev = parse_device(device)
        if dev is not None and dev.type != "cpu":
            raise BadValueError(f"{cls.__name__}() makes CPU tensors, but device {dev} was "
                                f"given; use mpitensor.empty(..., dtype=, device=) instead")
        return _construct(cls.__name__, cls.dtype, args)

    @property
    def is_cuda(cls) -> bool:
        return False


def _construct(name: str, dt: np.dtype, args: tuple) -> Tensor:
    """The tensor a legacy constructor ``name`` of dtype ``dt`` makes from ``args``.

    Raises:
        TypeError: arguments that fit none of the call forms, or a tensor of another dtype.
        BadValueError: a negative size.
    """
    if not args:
        return empty(0, dtype=dt)
    if len(args) == 1:
        data = args[0]
        if isinstance(data, Tensor):
            if data._data.dtype != dt or _backend.is_cupy_array(data._data):
                raise TypeError(f"{name}() takes a CPU tensor of dtype {_dt.dt_repr(dt)}, got "
                                f"{_dt.dt_repr(data._data.dtype)}; convert it with .to()")
            return Tensor._wrap(data._data)
        if isinstance(data, Size):
            return _sized(name, dt, tuple(data))
        if isinstance(data, (list, tuple, np.ndarray)) or _backend.is_cupy_array(data):
            return tensor(data, dtype=dt)
        if isinstance(data, (bool, float, complex, str, np.generic)) and not isinstance(
                data, np.integer):
            raise TypeError(f"{name}() takes sizes or a sequence of data, got "
                            f"{type(data).__name__}")
    return _sized(name, dt, args)


def _sized(name: str, dt: np.dtype, args: tuple) -> Tensor:
    try:
        shape = tuple(operator.index(a) for a in args)
    except TypeError:
        raise TypeError(f"{name}() takes ints as sizes, a Size, or one sequence of data; got "
                        f"{args!r}") from None
    if any(s < 0 for s in shape):
        raise BadValueError(f"{name}(): negative dimension in size {list(shape)}")
    return empty(*shape, dtype=dt)


def _make(name: str) -> type:
    cls = _LegacyTensorType(name, (), {
        "__doc__": f"Make a CPU tensor of dtype {_NAMES[name]}, as torch.{name} does: "
                   f"``{name}(2, 3)``, ``{name}([1, 2])``, ``{name}()``.",
        "__module__": "mpitensor",
        "__slots__": (),
    })
    cls.dtype = _dt.to_dtype(_NAMES[name])
    return cls


(FloatTensor, DoubleTensor, HalfTensor, BFloat16Tensor, LongTensor, IntTensor, ShortTensor,
 CharTensor, ByteTensor, BoolTensor, ComplexFloatTensor, ComplexDoubleTensor) = map(_make, (
    "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
    "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor", "ComplexFloatTensor",
    "ComplexDoubleTensor"))


def type_name(dt: np.dtype, on_gpu: bool) -> str:
    """The name ``Tensor.type()`` gives a tensor of dtype ``dt``: ``"mpitensor.FloatTensor"``
    or ``"mpitensor.cuda.FloatTensor"``."""
    name = {v: k for k, v in _NAMES.items()}[_dt.dtype_name(dt)]
    return f"mpitensor.cuda.{name}" if on_gpu else f"mpitensor.{name}"


def parse_type(spec: Any) -> tuple:
    """``(dtype, on_gpu)`` for what ``Tensor.type(spec)`` was given: a legacy class or a name
    such as ``"torch.FloatTensor"``, ``"torch.cuda.LongTensor"`` (``mpitensor.`` works as
    well as ``torch.``); ``on_gpu`` is None for a dtype.

    Raises:
        ValueError: a string that names no tensor type.
        TypeError: neither a string, a legacy class nor a dtype.
    """
    if isinstance(spec, _LegacyTensorType):
        return spec.dtype, False
    if isinstance(spec, str):
        parts = spec.split(".")
        if len(parts) in (2, 3) and parts[0] in ("torch", "mpitensor") and parts[-1] in _NAMES \
                and (len(parts) == 2 or parts[1] == "cuda"):
            return _dt.to_dtype(_NAMES[parts[-1]]), len(parts) == 3
        raise ValueError(f"invalid tensor type {spec!r}: use a name such as "
                         f"'torch.FloatTensor' or 'torch.cuda.LongTensor', or a dtype")
    try:
        return _dt.to_dtype(spec), None
    except (TypeError, ValueError):
        raise TypeError(f"type() takes a dtype, a type name or a legacy tensor class, got "
                        f"{spec!r}") from None


def set_default_tensor_type(t: Any) -> None:
    """Make the float type ``t`` (a legacy class such as :data:`DoubleTensor` or a name such
    as ``"torch.DoubleTensor"``) the default dtype; deprecated as in torch (it warns), use
    :func:`mpitensor.set_default_dtype`.

    Raises:
        TypeError: not a floating point type, a CUDA type (tensors are placed with
            ``device=``), or a float type :func:`set_default_dtype` does not take.
        ValueError: a name that is no tensor type.

    Example:
        >>> import warnings, mpitensor as mt
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     mt.set_default_tensor_type(mt.DoubleTensor)
        ...     d = mt.zeros(1).dtype
        ...     mt.set_default_tensor_type("torch.FloatTensor")
        >>> d
        dtype('float64')
    """
    warnings.warn("set_default_tensor_type() is deprecated (as in torch); use "
                  "set_default_dtype() instead", UserWarning, stacklevel=2)
    if not isinstance(t, (str, _LegacyTensorType)):
        raise TypeError(f"set_default_tensor_type() takes a type name or a legacy tensor class, "
                        f"got {t!r}")
    dt, on_gpu = parse_type(t)
    if on_gpu:
        raise TypeError(f"set_default_tensor_type({t!r}): CUDA default types are not "
                        f"supported; pass device= to the constructors, or move with .to()")
    if not _dt.is_floating_dtype(dt):
        raise TypeError(f"set_default_tensor_type({t!r}): only floating point types can be "
                        f"the default type")
    _dt.set_default_dtype(dt)
