"""One flat vector from a model's parameters, and back."""

from __future__ import annotations

from typing import Iterable

from ..._ops.combine import cat
from ...autograd import no_grad
from ...tensor import Tensor

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """Return every parameter flattened and joined into one 1-d tensor (differentiable)."""
    return cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy consecutive slices of the 1-d ``vec`` into ``parameters``, in order.

    Raises:
        TypeError: ``vec`` is not a tensor.
        ValueError: ``vec`` is not 1-d, or its length is not the parameters' total size.
    """
    if not isinstance(vec, Tensor):
        raise TypeError(f"vec must be a Tensor, got {type(vec).__name__}")
    if vec.ndim != 1:
        raise ValueError(f"vec must be 1-d, got shape {tuple(vec.shape)}")
    params = list(parameters)
    total = sum(p.numel() for p in params)
    if vec.numel() != total:
        raise ValueError(f"vec has {vec.numel()} elements but the parameters hold {total}")
    start = 0
    with no_grad():
        for p in params:
            n = p.numel()
            p.copy_(vec[start:start + n].reshape(p.shape))
            start += n
