"""Dropout variants of ``torch.nn.functional`` beyond ``dropout``/``dropout2d``: channel
dropout of 1-D and 3-D feature maps (``dropout1d``, ``dropout3d``) and the self-normalising
``alpha_dropout`` / ``feature_alpha_dropout``.

Masks are drawn from mpitensor's global generator (``mpitensor.manual_seed`` makes them
reproducible; they are not torch's numbers). Alpha dropout sets dropped values to SELU's
negative saturation ``-scale * alpha`` and applies the affine map that keeps a unit Gaussian's
mean and variance, as torch does. ``inplace=True`` goes through the tensor in-place machinery.

Re-exported by :mod:`mpitensor.nn.functional`; import them from there.

Example:
    >>> import mpitensor as mt
    >>> dropout1d(mt.ones(2, 3, 4), p=0.0).shape
    mpitensor.Size([2, 3, 4])
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._ops.random import _draw
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

from .activations import SELU_ALPHA, SELU_SCALE
from .checks import as_tensor, check_float, run_inplace, shape_str

__all__ = ["dropout1d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"]

_ALPHA_PRIME = SELU_ALPHA * SELU_SCALE  # |SELU's negative saturation|


class _Affine(Function):
    """``x * a + b`` with ``a`` and ``b`` arrays that broadcast to ``x``; no gradient for them."""

    @staticmethod
    def forward(ctx: Any, x: Any, a: Any, b: Any) -> Any:
        ctx.save_for_backward(a)
        out = x * a
        if b is not None:
            out = out + b
        return out.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (a,) = ctx.saved_tensors
        from mpitensor.autograd import _sum_to  # noqa: PLC0415 - same layer

        return _sum_to(g * a, g.shape).astype(g.dtype, copy=False), None, None


def _check_p(p: Any, fname: str) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{fname}(): p is a probability and must be in [0, 1], got {p!r}")
    return float(p)


def _keep(x: Any, p: float, shape: tuple) -> Any:
    """A 0/1 mask of ``shape`` (1 with probability 1 - p), in ``x``'s dtype."""
    dt = x.dtype if x.dtype in (_dt.float32, _dt.float64) else _dt.float32
    u = _draw("rand", shape, None, np.dtype(dt), _backend.device_of(x))
    return (u >= p).astype(x.dtype)


def _apply(t: Tensor, a: Any, b: Any, inplace: bool, fname: str) -> Tensor:
    if inplace:
        return run_inplace(t, _Affine, f"{fname}(inplace=True)", a, b)
    return _Affine.apply(t, a, b)


def _channel_dropout(t: Tensor, p: float, shape: tuple, inplace: bool, fname: str) -> Tensor:
    x = t._data
    if p == 1.0:
        a = _backend.array_module(x).zeros(shape, dtype=x.dtype)
    else:
        a = _keep(x, p, shape) * x.dtype.type(1.0 / (1.0 - p))
    return _apply(t, a, None, inplace, fname)


def dropout1d(input: Any, p: float = 0.5, training: bool = True,  # noqa: A002 - torch's name
              inplace: bool = False) -> Tensor:
    """Zero whole channels of a (N, C, L) or (C, L) input with probability ``p``; scale the
    rest by ``1 / (1 - p)``.

    Raises:
        ValueError: ``p`` outside [0, 1]. RuntimeError: an input of another rank.

    Example:
        >>> import mpitensor as mt
        >>> dropout1d(mt.ones(2, 2), training=False)
        tensor([[1., 1.],
                [1., 1.]])
    """
    pv = _check_p(p, "dropout1d")
    t = as_tensor(input, "input", "dropout1d")
    if t.ndim not in (2, 3):
        raise RuntimeError(f"dropout1d(): expected a 2-D (C, L) or 3-D (N, C, L) input, got "
                           f"shape {shape_str(t.shape)}; dropout1d drops channels of inputs "
                           f"with one spatial dimension")
    if not training or pv == 0.0 or t.numel() == 0:
        return t
    check_float(t, "input", "dropout1d")
    shape = (t.shape[0], 1) if t.ndim == 2 else (t.shape[0], t.shape[1], 1)
    return _channel_dropout(t, pv, shape, inplace, "dropout1d")


def dropout3d(input: Any, p: float = 0.5, training: bool = True,  # noqa: A002 - torch's name
              inplace: bool = False) -> Tensor:
    """Zero whole channels of a (N, C, D, H, W) or (C, D, H, W) input with probability ``p``;
    scale the rest by ``1 / (1 - p)``. Other ranks warn (as in torch) and are taken as
    unbatched, channels first.

    Raises:
        ValueError: ``p`` outside [0, 1].

    Example:
        >>> import mpitensor as mt
        >>> dropout3d(mt.ones(1, 2, 1, 1, 1), p=0.0).shape
        mpitensor.Size([1, 2, 1, 1, 1])
    """
    pv = _check_p(p, "dropout3d")
    t = as_tensor(input, "input", "dropout3d")
    if t.ndim not in (4, 5):
        warnings.warn(f"dropout3d(): a {t.ndim}-D input is deprecated (torch plans to reject "
                      f"it); dropout3d drops channels of (N, C, D, H, W) or (C, D, H, W) inputs. "
                      f"Use dropout for elementwise dropout", UserWarning, stacklevel=2)
    if not training or pv == 0.0 or t.numel() == 0:
        return t
    check_float(t, "input", "dropout3d")
    if t.ndim == 5:
        shape = (t.shape[0], t.shape[1]) + (1,) * 3
    else:
        shape = (t.shape[0],) + (1,) * (t.ndim - 1)
    return _channel_dropout(t, pv, shape, inplace, "dropout3d")


def _alpha(input: Any, p: Any, training: bool, inplace: bool, feature: bool,  # noqa: A002
           fname: str) -> Tensor:
    pv = _check_p(p, fname)
    t = as_tensor(input, "input", fname)
    if feature and t.ndim < 2:
        raise RuntimeError(f"{fname}(): feature dropout needs at least 2 dimensions (N, C, ...), "
                           f"got shape {shape_str(t.shape)}")
    if not training or pv == 0.0 or t.numel() == 0:
        return t
    check_float(t, "input", fname)
    x = t._data
    xp = _backend.array_module(x)
    shape = (t.shape[0], t.shape[1]) + (1,) * (t.ndim - 2) if feature else tuple(t.shape)
    if pv == 1.0:
        return _apply(t, xp.zeros(shape, dtype=x.dtype), None, inplace, fname)
    keep = _keep(x, pv, shape)
    a = 1.0 / math.sqrt((_ALPHA_PRIME ** 2 * pv + 1) * (1 - pv))
    # kept: a * x + a * alpha' * p; dropped: a * (-alpha') + a * alpha' * p
    b = (keep - 1) * x.dtype.type(_ALPHA_PRIME * a) + x.dtype.type(_ALPHA_PRIME * a * pv)
    return _apply(t, keep * x.dtype.type(a), b, inplace, fname)


def alpha_dropout(input: Any, p: float = 0.5, training: bool = False,  # noqa: A002
                  inplace: bool = False) -> Tensor:
    """Dropout for self-normalising (SELU) networks: dropped elements take SELU's negative
    saturation, then an affine map keeps zero mean and unit variance. Off unless
    ``training=True`` (torch's default here).

    Raises:
        ValueError: ``p`` outside [0, 1].

    Example:
        >>> import mpitensor as mt
        >>> alpha_dropout(mt.ones(2), 0.5)
        tensor([1., 1.])
    """
    return _alpha(input, p, training, inplace, False, "alpha_dropout")


def feature_alpha_dropout(input: Any, p: float = 0.5, training: bool = False,  # noqa: A002
                          inplace: bool = False) -> Tensor:
    """:func:`alpha_dropout` of whole channels of a (N, C, *) input.

    Raises:
        ValueError: ``p`` outside [0, 1]. RuntimeError: fewer than 2 dimensions.

    Example:
        >>> import mpitensor as mt
        >>> feature_alpha_dropout(mt.ones(1, 2), 0.5).shape
        mpitensor.Size([1, 2])
    """
    return _alpha(input, p, training, inplace, True, "feature_alpha_dropout")
