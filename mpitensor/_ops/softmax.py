"""``softmax`` and ``log_softmax`` along a dimension, and their gradients.

The one implementation of both: ``Tensor.softmax``, ``mpitensor.softmax`` and (through them)
``nn.functional`` compute here. Both subtract the maximum along ``dim`` first, so large
inputs do not overflow; a row of ``-inf`` gives ``nan``, as in torch.

Example:
    >>> import mpitensor as mt
    >>> mt.tensor([0.0, 0.0]).log_softmax(0).exp()
    tensor([0.5000, 0.5000])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core import autocast as _autocast
from mpitensor._core.devices import xp
from mpitensor._core.dims import wrap_dim
from mpitensor._core.half import computes_in_float32
from mpitensor._core.opkit import run, tensor_methods
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

DTypeLike = Any


def _axis(x: Any, dim: Any, fname: str) -> Any:
    """The axis ``dim`` names (None for a 0-d ``x``: its one element is the whole row).

    Raises:
        RuntimeError: ``x`` is not floating point.
        IndexError: ``dim`` is out of range.
    """
    if not _dt.is_floating_dtype(x.dtype):
        raise RuntimeError(
            f"{fname}() needs a floating point tensor, got {np.dtype(x.dtype).name}; convert "
            f"it first (x.float()) or pass dtype=mpitensor.float32"
        )
    d = wrap_dim(dim, x.ndim)
    return d if x.ndim else None


class _AlongDim(Function):
    """Base of the two: ``forward(ctx, x, dim)`` checks, finds the axis and keeps the output,
    which is all either backward needs."""

    name = ""

    @classmethod
    def forward(cls, ctx: Any, x: Any, dim: int) -> Any:
        axis = _axis(x, dim, cls.name)
        out = cls.compute(x, axis)
        ctx.axis = axis
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def compute(x: Any, axis: Any) -> Any:
        raise NotImplementedError


@computes_in_float32  # half inputs: float32 inside, one rounding, as torch
class Softmax(_AlongDim):
    """``exp(x) / exp(x).sum(dim)``: the gradient is ``out * (g - (g * out).sum(dim))``."""

    name = "softmax"

    @staticmethod
    def compute(x: Any, axis: Any) -> Any:
        out = xp(x).exp(x - x.max(axis=axis, keepdims=True))
        out /= out.sum(axis=axis, keepdims=True)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (out,) = ctx.saved_tensors
        gy = g * out
        return gy - out * gy.sum(axis=ctx.axis, keepdims=True), None


@computes_in_float32
class LogSoftmax(_AlongDim):
    """``x - log(exp(x).sum(dim))``: the gradient is ``g - exp(out) * g.sum(dim)``."""

    name = "log_softmax"

    @staticmethod
    def compute(x: Any, axis: Any) -> Any:
        m = xp(x)
        out = x - x.max(axis=axis, keepdims=True)
        out -= m.log(m.exp(out).sum(axis=axis, keepdims=True))
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (out,) = ctx.saved_tensors
        return g - xp(out).exp(out) * g.sum(axis=ctx.axis, keepdims=True), None


@tensor_methods
class _SoftmaxMethods:
    def softmax(self, dim: int, dtype: DTypeLike = None) -> Tensor:
        """Return ``exp(self) / exp(self).sum(dim)``, computed stably.

        Args:
            dim: the dimension whose entries sum to 1.
            dtype: cast to this dtype first (the cast is differentiable).

        Raises:
            RuntimeError: a tensor (or ``dtype``) that is not floating point.
            IndexError: ``dim`` out of range.
        """
        if _autocast.ON and _autocast.active():
            return _autocast.run("softmax", Tensor.softmax, self, dim, dtype=dtype)
        return run(Softmax, self if dtype is None else self.to(dtype), dim)

    def log_softmax(self, dim: int, dtype: DTypeLike = None) -> Tensor:
        """Return ``log(softmax(self, dim))``, computed stably (arguments as in ``softmax``)."""
        if _autocast.ON and _autocast.active():
            return _autocast.run("log_softmax", Tensor.log_softmax, self, dim, dtype=dtype)
        return run(LogSoftmax, self if dtype is None else self.to(dtype), dim)
