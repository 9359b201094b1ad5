"""Reinterpreting batch dimensions of a distribution as event dimensions."""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Optional

from mpitensor.tensor import Tensor

from . import constraints
from .distribution import Distribution, ShapeLike, _size

__all__ = ["Independent"]


def _sum_right(t: Tensor, n: int) -> Tensor:
    return t.sum(tuple(range(-n, 0))) if n else t


class Independent(Distribution):
    """Treat the ``reinterpreted_batch_ndims`` rightmost batch dimensions of
    ``base_distribution`` as event dimensions: ``log_prob`` and ``entropy`` sum over them.

    Raises:
        ValueError: ``reinterpreted_batch_ndims`` larger than the base's batch dimensions.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.distributions import Normal
        >>> d = Independent(Normal(mt.zeros(3), 1.0), 1)
        >>> (tuple(d.batch_shape), tuple(d.event_shape))
        ((), (3,))
    """

    arg_constraints: dict = {}

    def __init__(self, base_distribution: Distribution, reinterpreted_batch_ndims: int,
                 validate_args: Optional[bool] = None) -> None:
        n = int(reinterpreted_batch_ndims)
        bs = tuple(base_distribution.batch_shape)
        if n > len(bs) or n < 0:
            raise ValueError(f"Independent: reinterpreted_batch_ndims must be in 0..{len(bs)} "
                             f"(the base's batch dimensions), got {n}")
        self.base_dist = base_distribution
        self.reinterpreted_batch_ndims = n
        cut = len(bs) - n
        super().__init__(bs[:cut], bs[cut:] + tuple(base_distribution.event_shape),
                         validate_args)

    @property
    def has_rsample(self) -> bool:  # type: ignore[override]
        return self.base_dist.has_rsample

    @property
    def has_enumerate_support(self) -> bool:  # type: ignore[override]
        return self.reinterpreted_batch_ndims == 0 and self.base_dist.has_enumerate_support

    @property
    def support(self) -> constraints.Constraint:  # type: ignore[override]
        """The base's support, over the reinterpreted dimensions."""
        s = self.base_dist.support
        return constraints.independent(s, self.reinterpreted_batch_ndims) \
            if self.reinterpreted_batch_ndims else s

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> Independent:
        """Return this distribution with the base expanded to ``batch_shape``."""
        shape = tuple(_size(batch_shape))
        n = self.reinterpreted_batch_ndims
        ev = tuple(self.event_shape)
        base = self.base_dist.expand(shape + ev[:n])
        return Independent(base, n, validate_args=False)

    mean = property(attrgetter("base_dist.mean"), doc="The base distribution's mean.")
    mode = property(attrgetter("base_dist.mode"), doc="The base distribution's mode.")

    variance = property(attrgetter("base_dist.variance"), doc="The base distribution's variance.")

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        return self.base_dist.sample(sample_shape)

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        return self.base_dist.rsample(sample_shape)

    def log_prob(self, value: Any) -> Tensor:
        return _sum_right(self.base_dist.log_prob(value), self.reinterpreted_batch_ndims)

    def entropy(self) -> Tensor:
        return _sum_right(self.base_dist.entropy(), self.reinterpreted_batch_ndims)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """The base's support, where no dimension was reinterpreted."""
        if self.reinterpreted_batch_ndims:
            raise NotImplementedError("Independent: enumerate_support() with reinterpreted "
                                      "dimensions is not implemented")
        return self.base_dist.enumerate_support(expand)

    def __repr__(self) -> str:
        return f"Independent({self.base_dist!r}, {self.reinterpreted_batch_ndims})"
