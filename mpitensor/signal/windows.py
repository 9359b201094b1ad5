"""``torch.signal.windows``: window functions as tensors, scipy.signal's family under torch's
names and keyword-only arguments.

Each takes the number of points ``M`` and ``sym`` (True: a symmetric window, for filter design;
False: the first ``M`` of ``M + 1`` points, for spectral analysis), and makes a float32 or
float64 tensor (``dtype``, default the default dtype) on ``device``. The values are computed
in float64 and rounded once to the dtype.

Example:
    >>> import mpitensor as mt
    >>> mt.signal.windows.hann(5)
    tensor([0.0000, 0.5000, 1.0000, 0.5000, 0.0000])
    >>> mt.signal.windows.hann(4, sym=False)
    tensor([0.0000, 0.5000, 1.0000, 0.5000])
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core.opkit import Tensor
from mpitensor._ops import create as _create
from mpitensor._ops.spectral import (
    bartlett_values,
    general_cosine_values,
    kaiser_values,
    sampled,
    window_length,
    window_tensor,
)

__all__ = ["bartlett", "blackman", "cosine", "exponential", "gaussian", "general_cosine",
           "general_hamming", "hamming", "hann", "kaiser", "nuttall"]

_NUTTALL = (0.3635819, 0.4891775, 0.1365995, 0.0106411)


def _checked(fname: str, M: Any, dtype: Any) -> tuple:
    """``(M, dtype)`` checked: a non-negative int and float32 or float64."""
    m = window_length(M, fname, "M")
    if m < 0:
        raise ValueError(f"{fname}(): the window length M must be non-negative, got M={m}")
    dt = _create.dtype_or(dtype, _dt.get_default_dtype())
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"{fname}(): expects a float32 or float64 dtype, got "
                         f"{_dt.dt_repr(dt)}")
    return m, dt


def _make(fname: str, M: Any, sym: bool, values: Callable[[int], np.ndarray], dtype: Any,
          layout: Any, device: Any, requires_grad: bool) -> Tensor:
    m, dt = _checked(fname, M, dtype)
    return window_tensor(sampled(m, bool(sym), values), dt, device, requires_grad, layout,
                         fname)


def _positive(v: Any, what: str, fname: str) -> float:
    v = float(v)
    if not v > 0:
        raise ValueError(f"{fname}(): {what} must be positive, got {v}")
    return v


def bartlett(M: int, *, sym: bool = True, dtype: Any = None, layout: Any = None,
             device: Any = None, requires_grad: bool = False) -> Tensor:
    """Return the Bartlett (triangular) window ``1 - |2n / (M - 1) - 1|``.

    Raises:
        TypeError: ``M`` is not an int. ValueError: ``M < 0`` or a dtype other than
            float32/float64.
    """
    return _make("bartlett", M, sym, bartlett_values, dtype, layout, device, requires_grad)


def general_cosine(M: int, *, a: Iterable[float], sym: bool = True, dtype: Any = None,
                   layout: Any = None, device: Any = None,
                   requires_grad: bool = False) -> Tensor:
    """Return the window ``sum_k (-1)^k a[k] cos(2 pi k n / (M - 1))``.

    Raises:
        TypeError: ``a`` is not a list or tuple. ValueError: ``a`` is empty (and as
            :func:`bartlett`).

    Example:
        >>> import mpitensor as mt
        >>> mt.signal.windows.general_cosine(3, a=[0.5, 0.5])
        tensor([0., 1., 0.])
    """
    if not isinstance(a, (list, tuple)):
        raise TypeError(f"general_cosine(): the coefficients a must be a list or tuple, got "
                        f"{type(a).__name__}")
    if len(a) == 0:
        raise ValueError("general_cosine(): the coefficients a cannot be empty")
    coeffs = tuple(float(c) for c in a)
    return _make("general_cosine", M, sym, lambda m: general_cosine_values(m, coeffs), dtype,
                 layout, device, requires_grad)


def general_hamming(M: int, *, alpha: float = 0.54, sym: bool = True, dtype: Any = None,
                    layout: Any = None, device: Any = None,
                    requires_grad: bool = False) -> Tensor:
    """Return the generalised Hamming window ``alpha - (1 - alpha) cos(2 pi n / (M - 1))``."""
    return general_cosine(M, a=[alpha, 1.0 - alpha], sym=sym, dtype=dtype, layout=layout,
                          device=device, requires_grad=requires_grad)


def hamming(M: int, *, sym: bool = True, dtype: Any = None, layout: Any = None,
            device: Any = None, requires_grad: bool = False) -> Tensor:
    """Return the Hamming window: :func:`general_hamming` with ``alpha = 0.54``."""
    return general_hamming(M, alpha=0.54, sym=sym, dtype=dtype, layout=layout, device=device,
                           requires_grad=requires_grad)


def hann(M: int, *, sym: bool = True, dtype: Any = None, layout: Any = None,
         device: Any = None, requires_grad: bool = False) -> Tensor:
    """Return the Hann window: :func:`general_hamming` with ``alpha = 0.5``."""
    return general_hamming(M, alpha=0.5, sym=sym, dtype=dtype, layout=layout, device=device,
                           requires_grad=requires_grad)


def blackman(M: int, *, sym: bool = True, dtype: Any = None, layout: Any = None,
             device: Any = None, requires_grad: bool = False) -> Tensor:
    """Return the Blackman window: :func:`general_cosine` with ``a = [0.42, 0.5, 0.08]``."""
    return general_cosine(M, a=[0.42, 0.5, 0.08], sym=sym, dtype=dtype, layout=layout,
                          device=device, requires_grad=requires_grad)


def nuttall(M: int, *, sym: bool = True, dtype: Any = None, layout: Any = None,
            device: Any = None, requires_grad: bool = False) -> Tensor:
    """Return the minimum 4-term Blackman-Harris window of Nuttall: :func:`general_cosine`
    with ``a = [0.3635819, 0.4891775, 0.1365995, 0.0106411]``."""
    return general_cosine(M, a=list(_NUTTALL), sym=sym, dtype=dtype, layout=layout,
                          device=device, requires_grad=requires_grad)


def cosine(M: int, *, sym: bool = True, dtype: Any = None, layout: Any = None,
           device: Any = None, requires_grad: bool = False) -> Tensor:
    """Return the cosine (sine) window ``sin(pi (n + 0.5) / M)``."""
    return _make("cosine", M, sym, lambda m: np.sin(np.pi * (np.arange(m) + 0.5) / m), dtype,
                 layout, device, requires_grad)


def exponential(M: int, *, center: Optional[float] = None, tau: float = 1.0,
                sym: bool = True, dtype: Any = None, layout: Any = None, device: Any = None,
                requires_grad: bool = False) -> Tensor:
    """Return the exponential (Poisson) window ``exp(-|n - center| / tau)``, ``n < M``;
    ``center`` defaults to the middle, ``(M - 1) / 2`` (``M / 2`` when ``sym`` is False).

    Raises:
        ValueError: ``tau <= 0``, a ``center`` given with ``sym=True`` (and as
            :func:`bartlett`).
    """
    if sym and center is not None:
        raise ValueError("exponential(): center must be None for a symmetric window (sym=True)")
    t = _positive(tau, "tau", "exponential")
    m, dt = _checked("exponential", M, dtype)
    if center is None:  # the middle of the M (sym) or M + 1 (periodic) points; 0 for one
        c = (m - 1) / 2.0 if sym or m == 1 else m / 2.0
    else:
        c = float(center)
    return window_tensor(np.exp(-np.abs(np.arange(m) - c) / t), dt, device, requires_grad,
                         layout, "exponential")


def gaussian(M: int, *, std: float = 1.0, sym: bool = True, dtype: Any = None,
             layout: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Return the Gaussian window ``exp(-((n - (M - 1) / 2) / std)^2 / 2)``.

    Raises:
        ValueError: ``std <= 0`` (and as :func:`bartlett`).
    """
    s = _positive(std, "the standard deviation std", "gaussian")
    return _make("gaussian", M, sym,
                 lambda m: np.exp(-0.5 * ((np.arange(m) - (m - 1) / 2.0) / s) ** 2), dtype,
                 layout, device, requires_grad)


def kaiser(M: int, *, beta: float = 12.0, sym: bool = True, dtype: Any = None,
           layout: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Return the Kaiser window ``I0(beta sqrt(1 - (2n / (M - 1) - 1)^2)) / I0(beta)``.

    Raises:
        ValueError: ``beta < 0`` (and as :func:`bartlett`).
    """
    b = float(beta)
    if b < 0:
        raise ValueError(f"kaiser(): beta must be non-negative, got {b}")
    return _make("kaiser", M, sym, lambda m: kaiser_values(m, b), dtype, layout, device,
                 requires_grad)
