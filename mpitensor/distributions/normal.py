"""The normal (Gaussian) distribution."""

from __future__ import annotations

import math
from typing import Any

from mpitensor.tensor import Tensor, erf, erfinv

from ._common import LOG_SQRT_2PI, normal
from ._location import LocScale
from .distribution import ShapeLike

__all__ = ["Normal"]


class Normal(LocScale):
    """Normal distribution of mean ``loc`` and standard deviation ``scale``; ``rsample`` is
    reparameterised (``loc + scale * eps``).

    Args:
        loc: the mean (tensor or number).
        scale: the standard deviation, > 0.
        validate_args: see :class:`Distribution`.

    Raises:
        ValueError: with validation, a ``scale`` not > 0 or a NaN ``loc``.

    Example:
        >>> import mpitensor as mt
        >>> round(Normal(0.0, 1.0).log_prob(mt.tensor(0.0)).item(), 4)
        -0.9189
    """

    @property
    def stddev(self) -> Tensor:
        return self.scale

    @property
    def variance(self) -> Tensor:
        return self.scale ** 2

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        return self.loc + normal(tuple(shape), self.loc) * self.scale

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return -((value - self.loc) ** 2) / (2 * self.variance) - self.scale.log() - LOG_SQRT_2PI

    def cdf(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 * (1 + erf((value - self.loc) / (self.scale * math.sqrt(2))))

    def icdf(self, value: Any) -> Tensor:
        return self.loc + self.scale * erfinv(2 * value - 1) * math.sqrt(2)

    def entropy(self) -> Tensor:
        return 0.5 + LOG_SQRT_2PI + self.scale.log()
