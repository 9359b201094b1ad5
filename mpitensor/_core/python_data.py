"""Python data in: a fresh array from numbers and nested sequences, with torch's dtype rules.

``tensor([1, 2])`` is int64 and ``tensor([1., 2.])`` the default float dtype (float32), where
NumPy would make int64 and float64; NumPy scalars and arrays keep their own dtype. Shared by the
``Tensor`` constructor and :func:`mpitensor.tensor`.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core.promotion import is_scalar, scalar_dtype


def _first_leaf(data: Any) -> Any:
    """The first non-sequence element of nested lists/tuples (or the data itself)."""
    depth = 0
    while isinstance(data, (list, tuple)) and data and depth < 64:
        data = data[0]
        depth += 1
    return data


def array_from_data(data: Any, dtype: Optional[np.dtype]) -> np.ndarray:
    """A fresh NumPy array from Python data, with torch's dtype inference when ``dtype`` is None."""
    if isinstance(data, np.generic):  # NumPy scalars keep their dtype (np.float64 -> float64)
        return np.array(data, dtype=dtype)
    if is_scalar(data):
        return np.array(data, dtype=scalar_dtype(data) if dtype is None else dtype)
    if isinstance(data, (str, bytes)):
        raise TypeError(f"tensor() cannot make a tensor from {type(data).__name__} {data!r}")
    try:
        arr = np.array(data, dtype=dtype)
    except ValueError as exc:
        raise ValueError(
            f"tensor() could not convert the data: {exc}; nested sequences must be rectangular"
        ) from None
    except TypeError as exc:
        raise TypeError(f"tensor() could not convert the data: {exc}") from None
    if _dt.kind_of(arr.dtype) not in "biufc":
        raise TypeError(
            f"tensor() could not infer a numeric dtype from {type(data).__name__} data (NumPy "
            f"made {arr.dtype}); pass numbers, nested sequences of numbers, or arrays"
        )
    if dtype is None:
        leaf = _first_leaf(data)
        if is_scalar(leaf) or (isinstance(leaf, (list, tuple)) and not leaf):
            kind = arr.dtype.kind
            if kind == "f":
                arr = arr.astype(_dt.get_default_dtype(), copy=False)
            elif kind == "c":
                arr = arr.astype(_dt.default_complex_dtype(), copy=False)
            elif kind == "i":
                arr = arr.astype(_dt.int64, copy=False)
    _dt.to_dtype(arr.dtype)
    return arr
