"""The Bernoulli distribution: 1 with probability ``probs``, else 0."""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Any, Optional

from mpitensor.tensor import Tensor, bernoulli, stack, where

from . import constraints
from ._common import logits_to_probs, probs_to_logits, softplus
from .distribution import Distribution, ShapeLike, _expanded, _size, broadcast_all, lazy_property

__all__ = ["Bernoulli"]


class Bernoulli(Distribution):
    """Bernoulli distribution of parameter ``probs`` (in [0, 1]) or ``logits``.

    Args:
        probs: the probability of 1.
        logits: its log-odds (exactly one of ``probs`` and ``logits``).
        validate_args: see :class:`Distribution`.

    Raises:
        ValueError: both or neither of ``probs`` and ``logits``; with validation, ``probs``
            outside [0, 1] or a value other than 0 or 1.

    Example:
        >>> import mpitensor as mt
        >>> Bernoulli(mt.tensor([0.25])).variance.tolist()
        [0.1875]
    """

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.boolean
    has_enumerate_support = True

    def __init__(self, probs: Any = None, logits: Any = None,
                 validate_args: Optional[bool] = None) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("Bernoulli: pass either probs or logits, not both and not neither")
        if probs is not None:
            (self.probs,) = broadcast_all(probs)
            self._param = self.probs
        else:
            (self.logits,) = broadcast_all(logits)
            self._param = self.logits
        super().__init__(self._param.shape, (), validate_args)

    @lazy_property
    def logits(self) -> Tensor:
        """The log-odds of 1."""
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self) -> Tensor:
        """The probability of 1."""
        return logits_to_probs(self.logits, is_binary=True)

    @property
    def param_shape(self) -> Any:
        """The shape of ``probs``/``logits``."""
        return self._param.shape

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> Bernoulli:
        """Return this distribution with its parameter expanded to ``batch_shape``."""
        new = _instance if _instance is not None else type(self).__new__(type(self))
        shape = _size(batch_shape)
        for n in ("probs", "logits"):
            if n in self.__dict__:
                setattr(new, n, self.__dict__[n].expand(*shape))
                new._param = new.__dict__[n]
        return _expanded(new, self, shape)

    mean = property(attrgetter("probs"), doc="The mean: ``probs``.")

    @property
    def mode(self) -> Tensor:
        p = self.probs
        m = (p >= 0.5).to(p.dtype)
        return where(p == 0.5, math.nan, m)

    @property
    def variance(self) -> Tensor:
        return self.probs * (1 - self.probs)

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        return bernoulli(self.probs.detach().expand(*shape))

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return value * logits - softplus(logits)

    def entropy(self) -> Tensor:
        logits, probs = broadcast_all(self.logits, self.probs)
        return softplus(logits) - probs * logits

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """Return ``[0, 1]`` along a new leading dimension."""
        p = self._param
        values = stack([p.new_zeros(()), p.new_ones(())])
        values = values.reshape(2, *((1,) * len(self.batch_shape)))
        if expand:
            values = values.expand(2, *self.batch_shape)
        return values
