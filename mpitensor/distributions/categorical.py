"""Distributions over a finite set of categories: :class:`Categorical` (an index) and
:class:`OneHotCategorical` (a one-hot vector)."""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Any, Optional

from mpitensor import dtypes as _dt
from mpitensor.tensor import Size, Tensor, arange, broadcast_tensors, eye, full, multinomial

from . import constraints
from ._common import logits_to_probs, probs_to_logits
from .distribution import Distribution, ShapeLike, _expanded, _size, lazy_property

__all__ = ["Categorical", "OneHotCategorical"]


def _one_of(probs: Any, logits: Any, name: str) -> None:
    if (probs is None) == (logits is None):
        raise ValueError(f"{name}: pass either probs or logits, not both and not neither")


class Categorical(Distribution):
    """Distribution over the indices ``0 .. K-1`` of the last dimension of ``probs`` (non-negative
    weights, normalised here) or ``logits`` (unnormalised log probabilities).

    Args:
        probs: weights of shape ``batch_shape + (K,)``.
        logits: log weights of the same shape (exactly one of ``probs`` and ``logits``).
        validate_args: see :class:`Distribution`.

    Raises:
        ValueError: both or neither of ``probs`` and ``logits``; a parameter with fewer than one
            dimension; with validation, negative weights or NaN logits.

    Example:
        >>> import mpitensor as mt
        >>> d = Categorical(logits=mt.zeros(4))
        >>> round(d.entropy().item(), 6) == round(math.log(4), 6)
        True
    """

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    has_enumerate_support = True

    def __init__(self, probs: Any = None, logits: Any = None,
                 validate_args: Optional[bool] = None) -> None:
        _one_of(probs, logits, type(self).__name__)
        param = probs if probs is not None else logits
        if not isinstance(param, Tensor):
            raise ValueError(f"{type(self).__name__}: probs/logits must be a tensor, got "
                             f"{type(param).__name__}")
        if param.dim() < 1:
            raise ValueError(f"{type(self).__name__}: probs/logits need at least one dimension")
        if probs is not None:
            self.probs = probs / probs.sum(-1, keepdim=True)
        else:
            self.logits = logits - logits.logsumexp(dim=-1, keepdim=True)
        self._param = self.probs if probs is not None else self.logits
        self._num_events = int(param.shape[-1])
        super().__init__(param.shape[:-1], (), validate_args)

    @lazy_property
    def logits(self) -> Tensor:
        """Normalised log probabilities (``log_softmax`` of the logits given)."""
        return probs_to_logits(self.probs)

    @lazy_property
    def probs(self) -> Tensor:
        """Normalised probabilities."""
        return logits_to_probs(self.logits)

    @property
    def param_shape(self) -> Size:
        """The shape of ``probs``/``logits``."""
        return self._param.shape

    @property
    def support(self) -> constraints.Constraint:  # type: ignore[override]
        """The indices 0 .. K-1."""
        return constraints.integer_interval(0, self._num_events - 1)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> Categorical:
        """Return this distribution with its parameters expanded to ``batch_shape``."""
        cls = type(self)
        new = _instance if _instance is not None else cls.__new__(cls)
        shape = _size(batch_shape)
        k = (self._num_events,)
        if "probs" in self.__dict__:
            new.probs = self.probs.expand(*shape, *k)
            new._param = new.probs
        if "logits" in self.__dict__:
            new.logits = self.logits.expand(*shape, *k)
            new._param = new.logits
        new._num_events = self._num_events
        return _expanded(new, self, shape)

    @property
    def mean(self) -> Tensor:
        return full(tuple(self._extended_shape()), math.nan, dtype=self.probs.dtype,
                    device=self.probs.device)

    @property
    def mode(self) -> Tensor:
        return self.probs.argmax(dim=-1)

    @property
    def variance(self) -> Tensor:
        return self.mean

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        sample_shape = _size(sample_shape)
        n = math.prod(sample_shape)
        probs2 = self.probs.detach().reshape(-1, self._num_events)
        if n == 0:
            return full(tuple(self._extended_shape(sample_shape)), 0, dtype=_dt.int64,
                        device=probs2.device)
        draws = multinomial(probs2, n, replacement=True)  # (batch, n)
        return draws.t().reshape(*self._extended_shape(sample_shape))

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        value = value.long().unsqueeze(-1)
        value, log_pmf = broadcast_tensors(value, self.logits)
        return log_pmf.gather(-1, value[..., :1]).squeeze(-1)

    def entropy(self) -> Tensor:
        logits = self.logits.clamp(min=_dt.finfo(self.logits.dtype).min)
        return -(logits * self.probs).sum(-1)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """Return the indices ``0 .. K-1`` along a new leading dimension (expanded over the
        batch unless ``expand`` is False)."""
        nb = len(self._batch_shape)
        values = arange(self._num_events, dtype=_dt.int64, device=self._param.device)
        values = values.reshape(-1, *((1,) * nb))
        if expand:
            values = values.expand(self._num_events, *self._batch_shape)
        return values


class OneHotCategorical(Distribution):
    """Like :class:`Categorical`, with each draw a one-hot vector of length K (the event).

    Args:
        probs: weights of shape ``batch_shape + (K,)``.
        logits: log weights (exactly one of ``probs`` and ``logits``).
        validate_args: see :class:`Distribution`.

    Raises:
        ValueError: as :class:`Categorical`; with validation, a value that is not one-hot.

    Example:
        >>> import mpitensor as mt
        >>> OneHotCategorical(mt.tensor([0.0, 1.0])).sample().tolist()
        [0.0, 1.0]
    """

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    support = constraints.one_hot
    has_enumerate_support = True

    def __init__(self, probs: Any = None, logits: Any = None,
                 validate_args: Optional[bool] = None) -> None:
        self._categorical = Categorical(probs, logits, validate_args=validate_args)
        super().__init__(self._categorical.batch_shape,
                         (self._categorical._num_events,), validate_args=False)
        if validate_args is not None:
            self._validate_args = validate_args
        else:
            self._validate_args = Distribution._validate_args

    probs = property(attrgetter("_categorical.probs"), doc="Normalised probabilities.")
    logits = property(attrgetter("_categorical.logits"), doc="Normalised log probabilities.")

    param_shape = property(attrgetter("_categorical.param_shape"),
                           doc="The shape of ``probs``/``logits``.")

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> OneHotCategorical:
        """Return this distribution with its parameters expanded to ``batch_shape``."""
        new = _instance if _instance is not None else type(self).__new__(type(self))
        new._categorical = self._categorical.expand(batch_shape)
        return _expanded(new, self, _size(batch_shape))

    mean = property(attrgetter("probs"), doc="The mean: ``probs``.")

    @property
    def mode(self) -> Tensor:
        probs = self.probs
        k = self._categorical._num_events
        return eye(k, dtype=probs.dtype, device=probs.device)[probs.argmax(dim=-1)]

    @property
    def variance(self) -> Tensor:
        return self.probs * (1 - self.probs)

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        idx = self._categorical.sample(sample_shape)
        probs = self.probs
        k = self._categorical._num_events
        return eye(k, dtype=probs.dtype, device=probs.device)[idx]

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return self._categorical.log_prob(value.argmax(dim=-1))

    def entropy(self) -> Tensor:
        return self._categorical.entropy()

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """Return the K one-hot vectors along a new leading dimension."""
        k = self._categorical._num_events
        probs = self.probs
        values = eye(k, dtype=probs.dtype, device=probs.device)
        values = values.reshape(k, *((1,) * len(self.batch_shape)), k)
        if expand:
            values = values.expand(k, *self.batch_shape, k)
        return values
