"""The Laplace (double exponential) distribution and the exponential distribution."""

from __future__ import annotations

from typing import Any

from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor, zeros_like

from . import constraints
from ._common import uniform, uniform_open
from ._location import LocScale, Rated
from .distribution import ShapeLike

__all__ = ["Laplace", "Exponential"]


class Laplace(LocScale):
    """Laplace distribution of location ``loc`` and scale ``scale`` (> 0); ``rsample`` is
    reparameterised.

    Raises:
        ValueError: with validation, a ``scale`` not > 0.

    Example:
        >>> Laplace(0.0, 1.0).variance.item()
        2.0
    """

    @property
    def variance(self) -> Tensor:
        return 2 * self.scale ** 2

    @property
    def stddev(self) -> Tensor:
        return 2 ** 0.5 * self.scale

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        eps = _dt.finfo(self.loc.dtype).eps
        u = uniform(tuple(self._extended_shape(sample_shape)), self.loc) * 2 - 1
        u = u.clamp(min=eps - 1, max=1 - eps)  # log1p(-|u|) stays finite
        return self.loc - self.scale * u.sign() * (-u.abs()).log1p()

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return -(2 * self.scale).log() - (value - self.loc).abs() / self.scale

    def cdf(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        d = value - self.loc
        return 0.5 - 0.5 * d.sign() * (-d.abs() / self.scale).expm1()

    def icdf(self, value: Any) -> Tensor:
        t = value - 0.5
        return self.loc - self.scale * t.sign() * (-2 * t.abs()).log1p()

    def entropy(self) -> Tensor:
        return 1 + (2 * self.scale).log()


class Exponential(Rated):
    """Exponential distribution of rate ``rate`` (> 0); ``rsample`` is reparameterised.

    Raises:
        ValueError: with validation, a ``rate`` not > 0 or a negative value.

    Example:
        >>> Exponential(2.0).mean.item()
        0.5
    """

    arg_constraints = {"rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True

    @property
    def mean(self) -> Tensor:
        return self.rate.reciprocal()

    @property
    def mode(self) -> Tensor:
        return zeros_like(self.rate)

    @property
    def stddev(self) -> Tensor:
        return self.rate.reciprocal()

    @property
    def variance(self) -> Tensor:
        return self.rate.pow(-2)

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        u = uniform_open(tuple(self._extended_shape(sample_shape)), self.rate)
        return -u.log() / self.rate

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return self.rate.log() - self.rate * value

    def cdf(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return 1 - (-self.rate * value).exp()

    def icdf(self, value: Any) -> Tensor:
        return -(-value).log1p() / self.rate

    def entropy(self) -> Tensor:
        return 1.0 - self.rate.log()
