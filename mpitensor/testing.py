"""``mpitensor.testing`` (``torch.testing``): :func:`assert_close`, as torch's.

Example:
    >>> import mpitensor as torch
    >>> torch.testing.assert_close(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-7]))
    >>> torch.testing.assert_close({"w": torch.zeros(2)}, {"w": torch.zeros(2)})
"""

from __future__ import annotations

import collections.abc
import numbers
import warnings
from typing import Any, Callable, Optional, Tuple, Union

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor

__all__ = ["assert_close", "assert_allclose"]

#: default (rtol, atol) per dtype name, torch's table; other dtypes compare exactly
_DEFAULTS = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
             "float64": (1e-7, 1e-7), "complex64": (1.3e-6, 1e-5),
             "complex128": (1e-7, 1e-7)}


def _fail(msg: Union[str, Callable[[str], str], None], text: str) -> AssertionError:
    if callable(msg):
        return AssertionError(msg(text))
    return AssertionError(text if msg is None else msg)


def _as_array(x: Any, where: str) -> Tuple[Any, str]:
    """``(array, device string)`` of a tensor-like."""
    if isinstance(x, Tensor):
        return x.detach()._data, str(x.device)
    if isinstance(x, np.ndarray) or _backend.is_cupy_array(x):
        return x, "cpu" if isinstance(x, np.ndarray) else "cuda"
    if isinstance(x, (bool, numbers.Number, np.generic)):
        return np.asarray(x), "cpu"
    raise ValueError(f"assert_close(): {where} is a {type(x).__name__}, from which no tensor "
                     f"can be made")


def _dtype_name(a: Any) -> str:
    return _dt.dt_repr(a.dtype).replace("mpitensor.", "")


def _compare(actual: Any, expected: Any, where: str, rtol: Optional[float],
             atol: Optional[float], equal_nan: bool, check_device: bool, check_dtype: bool,
             check_stride: bool, allow_subclasses: bool, msg: Any) -> None:
    scalars = (bool, numbers.Number)
    if not (isinstance(actual, scalars) and isinstance(expected, scalars)):
        ta, te = type(actual), type(expected)
        related = issubclass(ta, te) or issubclass(te, ta)
        if not (related if allow_subclasses else ta is te):
            raise _fail(msg, f"{where}: the inputs are not related types: {ta.__name__} and "
                             f"{te.__name__}")
    elif check_dtype and type(actual) is not type(expected):
        raise _fail(msg, f"{where}: the scalars are of different types: "
                         f"{type(actual).__name__} and {type(expected).__name__} "
                         f"(pass check_dtype=False to compare their values)")
    a, dev_a = _as_array(actual, "actual" + where)
    e, dev_e = _as_array(expected, "expected" + where)
    if a.shape != e.shape:
        raise _fail(msg, f"{where}: the shapes do not match: {tuple(a.shape)} != "
                         f"{tuple(e.shape)}")
    if check_device and dev_a != dev_e:
        raise _fail(msg, f"{where}: the devices do not match: {dev_a} != {dev_e}")
    if check_dtype and a.dtype != e.dtype:
        raise _fail(msg, f"{where}: the dtypes do not match: {_dtype_name(a)} != "
                         f"{_dtype_name(e)}")
    if check_stride and isinstance(actual, Tensor) and isinstance(expected, Tensor) \
            and actual.stride() != expected.stride():
        raise _fail(msg, f"{where}: the strides do not match: {actual.stride()} != "
                         f"{expected.stride()}")
    if rtol is None:
        rtol, atol = max(_DEFAULTS.get(_dtype_name(a), (0.0, 0.0)),
                         _DEFAULTS.get(_dtype_name(e), (0.0, 0.0)))
    a = np.asarray(a.get() if not isinstance(a, np.ndarray) and hasattr(a, "get") else a)
    e = np.asarray(e.get() if not isinstance(e, np.ndarray) and hasattr(e, "get") else e)
    common = np.result_type(a.dtype if _dt.kind_of(a.dtype) != "V" else np.float32,
                            e.dtype if _dt.kind_of(e.dtype) != "V" else np.float32)
    if common.kind in "biu" and rtol == 0 and atol == 0:
        bad = a != e
        diff = np.abs(a.astype(np.float64) - e.astype(np.float64))
    else:
        wide = np.complex128 if common.kind == "c" else np.float64
        av, ev = a.astype(wide), e.astype(wide)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(av - ev)
            finite = np.isfinite(av) & np.isfinite(ev)
            close = finite & (diff <= atol + rtol * np.abs(ev))
            same_inf = np.isinf(av) & (av == ev)  # infinities only match themselves
            both_nan = np.isnan(av) & np.isnan(ev) if equal_nan else np.zeros(av.shape, bool)
        bad = ~(close | same_inf | both_nan)
    if not bad.any():
        return
    n_bad, n = int(bad.sum()), bad.size
    flat = np.where(bad.reshape(-1), diff.reshape(-1), -np.inf)
    worst = int(np.argmax(flat))
    at = tuple(int(i) for i in np.unravel_index(worst, a.shape)) if a.ndim else ()
    ref = np.abs(e.astype(np.complex128 if e.dtype.kind == "c" else np.float64)).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = diff.reshape(-1)[worst] / ref[worst]
    text = (f"not close{where}: {n_bad} of {n} elements ({100 * n_bad / n:.1f} %) differ by "
            f"more than atol + rtol * |expected| (atol={atol}, rtol={rtol}); the worst, at "
            f"index {at}, by {diff.reshape(-1)[worst]} ({rel} relative)")
    raise _fail(msg, text)


def _walk(actual: Any, expected: Any, where: str, **kw: Any) -> None:
    strings = (str, bytes)
    if isinstance(actual, collections.abc.Mapping) and \
            isinstance(expected, collections.abc.Mapping):
        if set(actual) != set(expected):
            raise _fail(kw["msg"], f"{where}: the keys of the mappings do not match: "
                                   f"{sorted(map(repr, actual))} != "
                                   f"{sorted(map(repr, expected))}")
        for k in expected:
            _walk(actual[k], expected[k], f"{where}[{k!r}]", **kw)
        return
    if isinstance(actual, collections.abc.Sequence) and \
            isinstance(expected, collections.abc.Sequence) and \
            not isinstance(actual, strings) and not isinstance(expected, strings):
        if len(actual) != len(expected):
            raise _fail(kw["msg"], f"{where}: the sequences differ in length: {len(actual)} "
                                   f"!= {len(expected)}")
        for i, (x, y) in enumerate(zip(actual, expected)):
            _walk(x, y, f"{where}[{i}]", **kw)
        return
    _compare(actual, expected, where, **kw)


def assert_close(actual: Any, expected: Any, *, allow_subclasses: bool = True,
                 rtol: Optional[float] = None, atol: Optional[float] = None,
                 equal_nan: bool = False, check_device: bool = True, check_dtype: bool = True,
                 check_layout: bool = True, check_stride: bool = False,
                 msg: Union[str, Callable[[str], str], None] = None) -> None:
    """Assert ``|actual - expected| <= atol + rtol * |expected|`` elementwise, as torch's.

    Tensors, NumPy/CuPy arrays and Python numbers compare directly; sequences and mappings
    compare element by element. Without ``rtol``/``atol``, torch's defaults for the dtypes
    apply (float32: 1.3e-6 and 1e-5; float64: 1e-7 and 1e-7; integers: exact). Infinities
    must be equal; NaNs only match with ``equal_nan``. Shapes, devices and dtypes must match
    unless their checks are turned off (then values are compared after promotion).

    Raises:
        ValueError: only one of ``rtol`` and ``atol`` given, or an input from which no tensor
            can be made.
        AssertionError: the inputs are not close, with the number of mismatched elements and
            the greatest absolute and relative differences.
    """
    if (rtol is None) != (atol is None):
        raise ValueError("assert_close(): give both rtol and atol, or neither (then the "
                         "dtype's defaults apply)")
    _walk(actual, expected, "", allow_subclasses=allow_subclasses, rtol=rtol, atol=atol,
          equal_nan=equal_nan, check_device=check_device, check_dtype=check_dtype,
          check_stride=check_stride, msg=msg)
    del check_layout  # every tensor here is strided


#: ``assert_allclose``'s tolerances (rtol, atol) by dtype, wider than ``assert_close``'s.
_ALLCLOSE_TOLERANCES = {"float16": (1e-3, 1e-3), "bfloat16": (1e-3, 1e-3),
                        "float32": (1e-4, 1e-5), "float64": (1e-5, 1e-8)}


def assert_allclose(actual: Any, expected: Any, rtol: Optional[float] = None,
                    atol: Optional[float] = None, equal_nan: bool = True, msg: str = "") -> None:
    """The deprecated form of :func:`assert_close` that older programs call.

    ``expected`` is first made a tensor of ``actual``'s dtype (so dtypes never mismatch),
    NaNs match by default, and without ``rtol``/``atol`` the tolerances are wider than
    :func:`assert_close`'s: float16/bfloat16 1e-3 and 1e-3, float32 1e-4 and 1e-5, float64
    1e-5 and 1e-8, integers exact. Warns ``FutureWarning``.
    """
    warnings.warn("testing.assert_allclose is deprecated: use testing.assert_close, which "
                  "checks dtypes and uses tighter default tolerances", FutureWarning,
                  stacklevel=2)
    if not isinstance(actual, Tensor):
        actual = Tensor(actual)
    expected = Tensor(expected).to(actual.dtype) if not isinstance(expected, Tensor) \
        else expected.to(actual.dtype)
    if rtol is None and atol is None:
        rtol, atol = _ALLCLOSE_TOLERANCES.get(_dtype_name(actual), (0.0, 0.0))
    assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=equal_nan,
                 check_dtype=False, msg=msg or None)
