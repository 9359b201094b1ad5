"""Tensor element types, named like PyTorch's (``mpitensor.float32``, ``mpitensor.long``, ...).

Every dtype is a plain :class:`numpy.dtype`, so ``t.dtype == numpy.float32`` holds and the arrays
underneath (NumPy or CuPy) take these objects directly. ``bfloat16`` is the NumPy dtype of the
``ml_dtypes`` package; NumPy files it under kind ``"V"`` (void), so code asks :func:`kind_of` or
:func:`is_floating_dtype` rather than ``dtype.kind``. The names ``bool``, ``float`` and ``int``
are torch's aliases (``mpitensor.float`` is float32, as ``torch.float`` is); they are bound at the
bottom of this module, and code in this module reaches Python's own types through ``builtins``.

Example:
    >>> import mpitensor as mt
    >>> mt.zeros(2, dtype=mt.float64).dtype == mt.double
    True
"""

from __future__ import annotations

import builtins as _builtins
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "bool",
    "bool_",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "half",
    "float",
    "double",
    "short",
    "int",
    "long",
    "cfloat",
    "cdouble",
    "dtype",
    "to_dtype",
    "get_default_dtype",
    "set_default_dtype",
    "finfo",
    "iinfo",
]

dtype = np.dtype  # the type of every dtype object here: ``isinstance(x, mpitensor.dtype)``

bool_ = np.dtype(np.bool_)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
uint64 = np.dtype(np.uint64)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
complex64 = np.dtype(np.complex64)
complex128 = np.dtype(np.complex128)

half = float16
double = float64
short = int16
long = int64
cfloat = complex64
cdouble = complex128

# Canonical (torch) name of each supported dtype; ``repr`` prints ``mpitensor.<name>``.
_NAMES: dict[np.dtype, str] = {
    bool_: "bool",
    uint8: "uint8",
    uint16: "uint16",
    uint32: "uint32",
    uint64: "uint64",
    int8: "int8",
    int16: "int16",
    int32: "int32",
    int64: "int64",
    float16: "float16",
    bfloat16: "bfloat16",
    float32: "float32",
    float64: "float64",
    complex64: "complex64",
    complex128: "complex128",
}
_SUPPORTED = frozenset(_NAMES)

# Every name a string may use, torch's aliases included ("float" is float32 here, as in torch).
_BY_NAME: dict[str, np.dtype] = {name: dt for dt, name in _NAMES.items()}
_BY_NAME.update(
    {
        "bool_": bool_,
        "half": float16,
        "float": float32,
        "double": float64,
        "short": int16,
        "int": int32,
        "long": int64,
        "cfloat": complex64,
        "cdouble": complex128,
        "byte": uint8,
        "char": int8,
    }
)

# Python types as dtypes follow torch: float -> float64, int -> int64, complex -> complex128.
_BY_PYTYPE: dict[type, np.dtype] = {
    _builtins.bool: bool_,
    _builtins.int: int64,
    _builtins.float: float64,
    _builtins.complex: complex128,
}

_default_dtype: np.dtype = float32


def _unsupported(x: Any) -> TypeError:
    names = ", ".join(_NAMES.values())
    return TypeError(f"unsupported dtype {x!r}: use one of mpitensor.{{{names}}}")


def to_dtype(x: Any) -> np.dtype:
    """Turn a dtype name, string, NumPy dtype or Python type into a supported NumPy dtype.

    Strings take torch's names first (``"float"`` is float32, ``"long"`` is int64, an optional
    ``"mpitensor."`` or ``"torch."`` prefix is allowed), then NumPy's (``"f8"``, ``"<i4"``).

    Args:
        x: ``mpitensor.float32``, ``numpy.float32``, ``numpy.dtype("f4")``, ``"float32"``,
            ``float`` (float64, as in torch), ...

    Returns:
        The ``numpy.dtype``.

    Raises:
        TypeError: ``x`` names no dtype, or one mpitensor does not support (object, strings,
            datetimes, float128, ...).

    Example:
        >>> to_dtype("long")
        dtype('int64')
    """
    if isinstance(x, np.dtype):
        if x in _SUPPORTED:
            return x
        if x.byteorder not in "=|" and x.newbyteorder("=") in _SUPPORTED:
            raise TypeError(
                f"dtype {x!r} is not in native byte order: convert the array first, "
                f"e.g. arr.astype(arr.dtype.newbyteorder('='))"
            )
        raise _unsupported(x)
    if isinstance(x, str):
        key = x.strip()
        for prefix in ("mpitensor.", "torch.", "numpy.", "np."):
            if key.startswith(prefix):
                key = key[len(prefix) :]
                break
        found = _BY_NAME.get(key)
        if found is not None:
            return found
    elif isinstance(x, type):
        found = _BY_PYTYPE.get(x)
        if found is not None:
            return found
    elif x is None:
        raise TypeError("dtype None cannot be converted: pass a dtype such as mpitensor.float32")
    try:
        dt = np.dtype(x)
    except (TypeError, ValueError):
        raise _unsupported(x) from None
    if dt not in _SUPPORTED:
        raise _unsupported(x)
    return dt


def dtype_name(dt: Any) -> str:
    """Return the torch-style name of a dtype, as printed in reprs: ``"float32"``, ``"bool"``."""
    return _NAMES[to_dtype(dt)]


def kind_of(dt: np.dtype) -> str:
    """NumPy's kind letter of ``dt`` (``"b"``, ``"i"``, ``"u"``, ``"f"``, ``"c"``), except that
    bfloat16, which NumPy files under ``"V"``, is a ``"f"`` like the other floats.

    Example:
        >>> kind_of(bfloat16), bfloat16.kind
        ('f', 'V')
    """
    k = dt.kind
    return "f" if k == "V" and dt == bfloat16 else k


def is_floating_dtype(dt: np.dtype) -> _builtins.bool:
    """True for float16, bfloat16, float32 and float64."""
    return kind_of(dt) == "f"


def get_default_dtype() -> np.dtype:
    """Return the dtype given to Python floats and to float constructors (float32 by default).

    Example:
        >>> get_default_dtype()
        dtype('float32')
    """
    return _default_dtype


def set_default_dtype(d: Any) -> None:
    """Set the default floating dtype; only float32 and float64 are allowed, as in torch.

    Args:
        d: ``mpitensor.float32`` or ``mpitensor.float64`` (or anything :func:`to_dtype` takes).

    Raises:
        TypeError: ``d`` is another dtype.

    Example:
        >>> set_default_dtype(float64); set_default_dtype(float32)
    """
    global _default_dtype
    dt = to_dtype(d)
    if dt not in (float32, float64):
        raise TypeError(
            f"set_default_dtype() takes mpitensor.float32 or mpitensor.float64, got {dt_repr(dt)}"
        )
    _default_dtype = dt


def default_complex_dtype() -> np.dtype:
    """Return the complex dtype paired with the default dtype (complex64 for float32)."""
    return complex128 if _default_dtype == float64 else complex64


class _DtypeInfo:
    """Base of :class:`finfo` and :class:`iinfo`: two are equal when they describe one dtype."""

    dtype: Any

    def __eq__(self, other: object) -> _builtins.bool:
        return type(other) is type(self) and other.dtype == self.dtype

    def __hash__(self) -> _builtins.int:
        return hash((type(self).__name__, self.dtype))


class finfo(_DtypeInfo):  # noqa: N801 - torch's name
    """The limits of a floating dtype, as Python floats (``torch.finfo``).

    Attributes:
        bits: bits per element.
        eps: the gap between 1.0 and the next larger representable number.
        max, min: the largest and the most negative finite numbers.
        tiny, smallest_normal: the smallest positive normal number (two names for it).
        resolution: about the decimal precision, ``10 ** -digits``.
        dtype: the dtype's name, e.g. ``"bfloat16"`` (a complex dtype gives its parts' float).

    Args:
        type: a floating or complex dtype (anything :func:`to_dtype` takes); the default dtype
            when left out.

    Raises:
        TypeError: an integer or bool dtype (use :class:`iinfo`).

    Example:
        >>> finfo(bfloat16).eps
        0.0078125
    """

    __slots__ = ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "dtype")

    def __init__(self, type: Any = None) -> None:  # noqa: A002 - torch's argument name
        dt = _default_dtype if type is None else to_dtype(type)
        kind = kind_of(dt)
        if kind not in "fc":
            raise TypeError(
                f"finfo() takes a floating point or complex dtype, got {dt_repr(dt)}; "
                f"use mpitensor.iinfo for integer dtypes"
            )
        if kind == "c":
            dt = float64 if dt == complex128 else float32
        info = ml_dtypes.finfo(dt) if dt == bfloat16 else np.finfo(dt)
        self.bits = _builtins.int(info.bits)
        self.eps = _builtins.float(info.eps)
        self.max = _builtins.float(info.max)
        self.min = _builtins.float(info.min)
        self.tiny = _builtins.float(info.tiny)
        self.smallest_normal = _builtins.float(info.smallest_normal)
        self.resolution = 10.0 ** -_builtins.int(info.precision)
        self.dtype = _NAMES[dt]

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution:g}, min={self.min:g}, max={self.max:g}, "
                f"eps={self.eps:g}, smallest_normal={self.smallest_normal:g}, "
                f"tiny={self.tiny:g}, dtype={self.dtype})")


class iinfo(_DtypeInfo):  # noqa: N801 - torch's name
    """The limits of an integer dtype, as Python ints (``torch.iinfo``).

    Attributes:
        bits: bits per element.
        max, min: the largest and the smallest value.
        dtype: the dtype's name, e.g. ``"int32"``.

    Args:
        type: an integer dtype (anything :func:`to_dtype` takes).

    Raises:
        TypeError: a bool, floating or complex dtype (use :class:`finfo` for the floats).

    Example:
        >>> iinfo(uint8).max
        255
    """

    __slots__ = ("bits", "max", "min", "dtype")

    def __init__(self, type: Any) -> None:  # noqa: A002 - torch's argument name
        dt = to_dtype(type)
        if dt.kind not in "iu":
            raise TypeError(
                f"iinfo() takes an integer dtype, got {dt_repr(dt)}; use mpitensor.finfo for "
                f"floating point dtypes"
            )
        info = np.iinfo(dt)
        self.bits = _builtins.int(info.bits)
        self.min = _builtins.int(info.min)
        self.max = _builtins.int(info.max)
        self.dtype = _NAMES[dt]

    def __repr__(self) -> str:
        return f"iinfo(min={self.min:g}, max={self.max:g}, dtype={self.dtype})"


def dt_repr(dt: np.dtype) -> str:
    """Return ``"mpitensor.<name>"`` for a dtype (falls back to NumPy's name)."""
    name = _NAMES.get(dt)
    return f"mpitensor.{name}" if name is not None else f"numpy.{dt}"


# torch's aliases that shadow Python builtins. Bound last so nothing above sees them; functions
# here that need Python's own types use ``_builtins``.
bool = bool_  # noqa: A001
float = float32  # noqa: A001
int = int32  # noqa: A001
