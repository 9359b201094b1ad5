"""The Poisson distribution."""

from __future__ import annotations

from typing import Any

from mpitensor.tensor import Tensor, lgamma, poisson, xlogy

from . import constraints
from ._location import Rated
from .distribution import ShapeLike, broadcast_all

__all__ = ["Poisson"]


class Poisson(Rated):
    """Poisson distribution of rate ``rate`` (>= 0) over the non-negative integers.

    Raises:
        ValueError: with validation, a negative rate or a value that is not a non-negative
            integer.

    Example:
        >>> Poisson(3.0).variance.item()
        3.0
    """

    arg_constraints = {"rate": constraints.nonnegative}
    support = constraints.nonnegative_integer

    @property
    def mean(self) -> Tensor:
        return self.rate

    @property
    def mode(self) -> Tensor:
        return self.rate.floor()

    @property
    def variance(self) -> Tensor:
        return self.rate

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        return poisson(self.rate.detach().expand(*shape).contiguous())

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        rate, value = broadcast_all(self.rate, value)
        return xlogy(value, rate) - rate - lgamma(value + 1)
