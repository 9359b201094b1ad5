"""torch-style functions of one tensor: ``mpitensor.exp(x)`` is ``x.exp()``,
``mpitensor.flatten(x, 1)`` is ``x.flatten(1)``, ``mpitensor.max(x, 1)`` is ``x.max(1)``.

Each calls the method of the same name, so it is differentiable wherever the method is, and
the op itself lives once, with its method. ``sum``, ``max``, ``min`` and ``abs`` are defined
here under the builtins' names; this module's own code uses none of those builtins.

Example:
    >>> import mpitensor as mt
    >>> mt.relu(mt.tensor([-1.0, 2.0]))
    tensor([0., 2.])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from mpitensor import tensor as _t
from mpitensor.tensor import Tensor

__all__ = [
    "exp", "log", "sqrt", "relu", "sigmoid", "tanh", "clamp", "clip", "matmul", "mean",
    "argmax", "argmin", "flatten", "reshape", "transpose", "permute", "squeeze", "unsqueeze",
    "softmax", "log_softmax", "sum", "max", "min", "abs", "sort", "argsort", "topk",
]

DTypeLike = Any


def exp(input: Tensor) -> Tensor:  # noqa: A002 - torch's argument name
    """Return ``input.exp()``."""
    return input.exp()


def log(input: Tensor) -> Tensor:  # noqa: A002
    """Return ``input.log()``."""
    return input.log()


def sqrt(input: Tensor) -> Tensor:  # noqa: A002
    """Return ``input.sqrt()``."""
    return input.sqrt()


def relu(input: Tensor) -> Tensor:  # noqa: A002
    """Return ``input.relu()``.

    Example:
        >>> import mpitensor as mt
        >>> relu(mt.tensor([-1.0, 2.0]))
        tensor([0., 2.])
    """
    return input.relu()


def sigmoid(input: Tensor) -> Tensor:  # noqa: A002
    """Return ``input.sigmoid()``."""
    return input.sigmoid()


def tanh(input: Tensor) -> Tensor:  # noqa: A002
    """Return ``input.tanh()``."""
    return input.tanh()


def clamp(input: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    """Return ``input.clamp(min, max)``."""
    return input.clamp(min, max)


clip = clamp


def matmul(input: Tensor, other: Any) -> Tensor:  # noqa: A002
    """Return ``input @ other``."""
    return input @ other


def mean(input: Tensor, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
         dtype: DTypeLike = None) -> Tensor:
    """Return ``input.mean(dim, keepdim, dtype=dtype)``."""
    return input.mean(dim, keepdim, dtype=dtype)


def argmax(input: Tensor, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:  # noqa: A002
    """Return ``input.argmax(dim, keepdim)``."""
    return input.argmax(dim, keepdim)


def argmin(input: Tensor, dim: Optional[int] = None, keepdim: bool = False) -> Tensor:  # noqa: A002
    """Return ``input.argmin(dim, keepdim)``."""
    return input.argmin(dim, keepdim)


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:  # noqa: A002
    """Return ``input.flatten(start_dim, end_dim)`` (``torch.flatten(x, 1)`` in LeNet)."""
    return input.flatten(start_dim, end_dim)


def reshape(input: Tensor, shape: Sequence[int]) -> Tensor:  # noqa: A002
    """Return ``input.reshape(shape)``."""
    return input.reshape(shape)


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:  # noqa: A002
    """Return ``input.transpose(dim0, dim1)``."""
    return input.transpose(dim0, dim1)


def permute(input: Tensor, dims: Sequence[int]) -> Tensor:  # noqa: A002
    """Return ``input.permute(dims)``."""
    return input.permute(dims)


def squeeze(input: Tensor, dim: Any = None) -> Tensor:  # noqa: A002
    """Return ``input.squeeze(dim)``."""
    return input.squeeze(dim)


def unsqueeze(input: Tensor, dim: int) -> Tensor:  # noqa: A002
    """Return ``input.unsqueeze(dim)``."""
    return input.unsqueeze(dim)


def softmax(input: Tensor, dim: int, dtype: DTypeLike = None) -> Tensor:  # noqa: A002
    """Return ``input.softmax(dim, dtype)``."""
    return input.softmax(dim, dtype)


def log_softmax(input: Tensor, dim: int, dtype: DTypeLike = None) -> Tensor:  # noqa: A002
    """Return ``input.log_softmax(dim, dtype)``."""
    return input.log_softmax(dim, dtype)


def sum(input: Tensor, dim: Any = None, keepdim: bool = False, *,  # noqa: A002
         dtype: DTypeLike = None) -> Tensor:
    """Return ``input.sum(dim, keepdim, dtype=dtype)``."""
    return input.sum(dim, keepdim, dtype=dtype)


def max(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A002
    """Return ``input.max(dim, keepdim)``: a value, or (values, indices)."""
    return input.max(dim, keepdim)


def min(input: Tensor, dim: Any = None, keepdim: bool = False) -> Any:  # noqa: A002
    """Return ``input.min(dim, keepdim)``."""
    return input.min(dim, keepdim)


def abs(input: Tensor) -> Tensor:  # noqa: A002
    """Return ``input.abs()``."""
    return input.abs()


def sort(input: Tensor, dim: int = -1, descending: bool = False, *,  # noqa: A002
         stable: bool = False) -> Any:
    """Return ``input.sort(dim, descending, stable=stable)``: ``(values, indices)``.

    Example:
        >>> import mpitensor as mt
        >>> sort(mt.tensor([2.0, 1.0])).indices
        tensor([1, 0])
    """
    return input.sort(dim, descending, stable=stable)


def argsort(input: Tensor, dim: int = -1, descending: bool = False,  # noqa: A002
            stable: bool = False) -> Tensor:
    """Return ``input.argsort(dim, descending, stable)``: the int64 positions in sorted order."""
    return input.argsort(dim, descending, stable)


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True,  # noqa: A002
         sorted: bool = True) -> Any:  # noqa: A002 - torch's argument name
    """Return ``input.topk(k, dim, largest, sorted)``: ``(values, indices)`` of the ``k``
    largest (or smallest) elements along ``dim``.

    Example:
        >>> import mpitensor as mt
        >>> topk(mt.tensor([1.0, 3.0, 2.0]), 1).values
        tensor([3.])
    """
    return input.topk(k, dim, largest, sorted)


_t._serve({name: globals()[name] for name in __all__})
