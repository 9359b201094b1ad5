"""The continuous uniform distribution on ``[low, high)``."""

from __future__ import annotations

import math
from typing import Any, Optional

from mpitensor.tensor import Tensor, full

from . import constraints
from ._common import uniform
from .distribution import Distribution, ShapeLike

__all__ = ["Uniform"]


class Uniform(Distribution):
    """Uniform distribution on ``[low, high)``; ``rsample`` is reparameterised.

    Args:
        low: the lower bound (inclusive).
        high: the upper bound (exclusive), > ``low``.
        validate_args: see :class:`Distribution`.

    Raises:
        ValueError: with validation, ``low >= high`` or a value outside ``[low, high)``.

    Example:
        >>> Uniform(0.0, 2.0).mean.item()
        1.0
    """

    arg_constraints = {"low": constraints.dependent, "high": constraints.dependent}
    has_rsample = True
    _params = ("low", "high")  # what expand() expands

    def __init__(self, low: Any, high: Any, validate_args: Optional[bool] = None) -> None:
        self._init_params((low, high), validate_args)
        if self._validate_args and not bool((self.low < self.high).all()):
            raise ValueError("Uniform: low must be less than high everywhere; pass bounds "
                             "with low < high (or validate_args=False to skip this check)")

    @property
    def support(self) -> constraints.Constraint:  # type: ignore[override]
        """The interval ``[low, high)``."""
        return constraints.half_open_interval(self.low, self.high)


    @property
    def mean(self) -> Tensor:
        return (self.high + self.low) / 2

    @property
    def mode(self) -> Tensor:
        return full(tuple(self.batch_shape), math.nan, dtype=self.low.dtype,
                    device=self.low.device)

    @property
    def stddev(self) -> Tensor:
        return (self.high - self.low) / 12 ** 0.5

    @property
    def variance(self) -> Tensor:
        return (self.high - self.low) ** 2 / 12

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        u = uniform(tuple(self._extended_shape(sample_shape)), self.low)
        return self.low + u * (self.high - self.low)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        inside = ((self.low <= value) & (self.high > value)).to(self.low.dtype)
        return inside.log() - (self.high - self.low).log()

    def cdf(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return ((value - self.low) / (self.high - self.low)).clamp(min=0, max=1)

    def icdf(self, value: Any) -> Tensor:
        return value * (self.high - self.low) + self.low

    def entropy(self) -> Tensor:
        return (self.high - self.low).log()
