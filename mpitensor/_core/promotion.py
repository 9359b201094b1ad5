"""Which dtype a value or an operation gets: torch's type promotion, on NumPy dtypes.

NumPy and torch disagree in three places that show in results, and these rules follow torch:

- an integer meeting a float takes the float's type (NumPy widens ``int64 + float32`` to
  float64);
- a Python scalar only changes the result's category (``float32 tensor * 2.5`` stays float32,
  ``int tensor * 2.5`` becomes the default float dtype);
- a zero-dim tensor counts like a scalar next to tensors with dimensions.

The operators, ``where``, ``clamp``, ``cat`` and the in-place updates all ask here, so every
op promotes the same way. bfloat16 is a float here (NumPy calls its kind ``"V"``, and has no
common type for it and float16): next to any other float or complex dtype it counts as float32,
so ``bfloat16 + float16`` is float32, as in torch.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mpitensor import dtypes as _dt

_INT64 = _dt.int64
_BOOL = _dt.bool_
_BF16 = _dt.bfloat16
_F32 = _dt.float32
_kind = _dt.kind_of


def is_scalar(v: Any) -> bool:
    """True for a Python number (bool, int, float or complex), which has no dtype of its own."""
    return isinstance(v, (bool, int, float, complex))


def scalar_dtype(s: Any) -> np.dtype:
    """The dtype torch gives a Python number: bool, int64, the default float or complex dtype."""
    if isinstance(s, bool):
        return _BOOL
    if isinstance(s, int):
        return _INT64
    if isinstance(s, float):
        return _dt.get_default_dtype()
    return _dt.default_complex_dtype()


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """The common dtype of two tensors' dtypes (``torch.promote_types``)."""
    if a == b:
        return a
    ka, kb = _kind(a), _kind(b)
    if ka == "b":
        return b
    if kb == "b":
        return a
    # the one place NumPy differs: it would widen int64 + float32 to float64
    if ka in "iu" and kb in "fc":
        return b
    if kb in "iu" and ka in "fc":
        return a
    if a == _BF16:
        a = _F32
    elif b == _BF16:
        b = _F32
    return np.promote_types(a, b)


def _complex_of(d: np.dtype) -> np.dtype:
    return _dt.complex128 if d == _dt.float64 else _dt.complex64


def _merge(stronger: Optional[np.dtype], weaker: Optional[np.dtype]) -> Optional[np.dtype]:
    """Fold a weaker class of operands into a stronger one: it may only change the category."""
    if stronger is None:
        return weaker
    if weaker is None:
        return stronger
    ks, kw = _kind(stronger), _kind(weaker)
    if ks == "c":
        return stronger
    if kw == "c":
        return _complex_of(stronger) if ks == "f" else weaker
    if ks == "f":
        return stronger
    if ks == "b" or kw == "f":
        return promote(stronger, weaker)
    return stronger


def result_type(*operands: Any) -> np.dtype:
    """The dtype of an operation on these arrays and Python numbers, as torch computes it.

    Arrays with dimensions decide first, then zero-dim arrays, then Python numbers; each weaker
    class only matters when it brings a higher category (bool < integer < float < complex).
    """
    dimensioned = zero_dim = numbers = None
    for o in operands:
        if is_scalar(o):
            d = scalar_dtype(o)
            numbers = d if numbers is None else promote(numbers, d)
        elif o.ndim:
            dimensioned = o.dtype if dimensioned is None else promote(dimensioned, o.dtype)
        else:
            zero_dim = o.dtype if zero_dim is None else promote(zero_dim, o.dtype)
    return _merge(dimensioned, _merge(zero_dim, numbers))


def true_divide_dtype(rt: np.dtype) -> np.dtype:
    """The dtype of ``/`` given the promoted operand dtype: integers divide into the default
    float dtype."""
    return _dt.get_default_dtype() if _kind(rt) in "biu" else rt


def can_cast(frm: np.dtype, to: np.dtype) -> bool:
    """Whether an in-place op may write a ``frm`` result into a ``to`` tensor: never a float
    into an integer, a complex into a real, or a number into a bool."""
    kf, kt = _kind(frm), _kind(to)
    if kf == "c" and kt != "c":
        return False
    if kf == "f" and kt in "biu":
        return False
    return not (kf != "b" and kt == "b")


def sum_dtype(dt: np.dtype) -> Optional[np.dtype]:
    """The accumulator of a sum or product: int64 for integers and bools (None: keep ``dt``)."""
    return _INT64 if dt.kind in "biu" else None
