"""``torch.nn.modules.flatten``: ``Flatten`` and ``Unflatten`` (one dimension to many and back)."""

from __future__ import annotations

import math
from typing import Any

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from .._functional.checks import is_int, wrap_dim
from ._common import _is_int, _ReprFields
from .module import Module

__all__ = ["Flatten", "Unflatten"]


class Flatten(_ReprFields, Module):
    """Flatten dimensions ``start_dim`` to ``end_dim`` into one (default: all but the batch).

    Raises:
        ValueError: a non-integer dimension.

    Example:
        >>> import mpitensor as mt
        >>> Flatten()(mt.zeros(2, 16, 5, 5)).shape
        mpitensor.Size([2, 400])
    """

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        if not _is_int(start_dim) or not _is_int(end_dim):
            raise ValueError(f"Flatten: start_dim and end_dim must be ints, got {start_dim!r} "
                             f"and {end_dim!r}")
        self.start_dim = int(start_dim)
        self.end_dim = int(end_dim)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.flatten(input, self.start_dim, self.end_dim)

    _repr = ("start_dim", "end_dim")


class Unflatten(_ReprFields, Module):
    """Split dimension ``dim`` into ``unflattened_size`` (which may hold one -1).

    Raises:
        TypeError: a non-integer dim or size. RuntimeError (in forward): sizes whose product
            is not the dimension's size.

    Example:
        >>> import mpitensor as mt
        >>> Unflatten(-1, (2, -1))(mt.zeros(6)).shape
        mpitensor.Size([2, 3])
    """

    def __init__(self, dim: int, unflattened_size: Any) -> None:
        super().__init__()
        if not is_int(dim):
            raise TypeError(f"Unflatten: dim must be an int, got {dim!r}")
        if not isinstance(unflattened_size, (tuple, list)) or \
                not all(is_int(s) for s in unflattened_size):
            raise TypeError(f"Unflatten: unflattened_size must be a tuple or list of ints, got "
                            f"{unflattened_size!r}")
        self.dim = dim
        self.unflattened_size = unflattened_size

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        d = wrap_dim(self.dim, input.ndim, "Unflatten")
        sizes = list(self.unflattened_size)
        n = input.shape[d]
        if sizes.count(-1) == 1:
            known = math.prod(s for s in sizes if s != -1)
            sizes[sizes.index(-1)] = n // known if known else 0
        if math.prod(sizes) != n:
            raise RuntimeError(f"Unflatten: sizes {tuple(self.unflattened_size)} do not multiply "
                               f"to the size {n} of dimension {d}")
        shape = tuple(input.shape)
        return input.reshape(shape[:d] + tuple(sizes) + shape[d + 1:])

    _repr = ("dim", "unflattened_size")
