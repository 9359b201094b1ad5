"""More discrete families of ``torch.distributions`` and the mixture: :class:`Binomial`,
:class:`Geometric`, :class:`NegativeBinomial`, :class:`Multinomial`,
:class:`OneHotCategoricalStraightThrough` and :class:`MixtureSameFamily`.

The counting families take ``probs`` or ``logits`` (exactly one), as torch's do; their log
masses are composed of differentiable tensor ops (``lgamma`` for the binomial coefficients).
Draws come from mpitensor's default generator.

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.distributions import Binomial
    >>> round(Binomial(4, mt.tensor(0.5)).log_prob(mt.tensor(2.0)).exp().item(), 6)
    0.375
"""

from __future__ import annotations

import math
from typing import Any, Optional

from mpitensor.tensor import Size, Tensor, arange, eye, lgamma, poisson, where

from . import constraints
from ._common import drawn, softplus, uniform_open
from .bernoulli import Bernoulli
from .categorical import Categorical, OneHotCategorical, _one_of
from .distribution import Distribution, ShapeLike, _expanded, _size, broadcast_all
from .gamma import _gamma_draw

__all__ = [
    "Binomial", "Geometric", "NegativeBinomial", "Multinomial",
    "OneHotCategoricalStraightThrough", "MixtureSameFamily",
]


class _BinaryParam(Distribution):
    """A family set by one success probability, given as ``probs`` or ``logits`` (and, for the
    counting ones, a ``total_count`` broadcast with it)."""

    _params = ("probs", "logits")  # what expand() expands (those given or computed)

    def _init_binary(self, probs: Any, logits: Any, validate_args: Optional[bool],
                     total_count: Any = None) -> None:
        _one_of(probs, logits, type(self).__name__)
        given = probs if probs is not None else logits
        if total_count is None:
            (param,) = broadcast_all(given)
        else:
            self.total_count, param = broadcast_all(total_count, given)
            self.total_count = self.total_count.to(param.dtype)
        if probs is not None:
            self.probs = param
        else:
            self.logits = param
        Distribution.__init__(self, param.shape, (), validate_args)

    # the one computed from the other on first use, as for a Bernoulli trial
    logits = Bernoulli.logits
    probs = Bernoulli.probs

    @property
    def param_shape(self) -> Size:
        """The shape of ``probs``/``logits``."""
        return self._batch_shape


class Binomial(_BinaryParam):
    """Binomial distribution: the number of successes in ``total_count`` trials of success
    probability ``probs`` (or log odds ``logits``).

    Raises:
        ValueError: both or neither of ``probs`` and ``logits``; with validation, a
            ``total_count`` that is not a non-negative integer, ``probs`` outside [0, 1] or a
            value outside ``0 .. total_count``.

    Example:
        >>> import mpitensor as mt
        >>> Binomial(10, mt.tensor(0.3)).mean.item()
        3.0
    """

    arg_constraints = {"total_count": constraints.nonnegative_integer,
                       "probs": constraints.unit_interval, "logits": constraints.real}
    has_enumerate_support = True
    _params = ("total_count", "probs", "logits")  # what expand() expands

    def __init__(self, total_count: Any = 1, probs: Any = None, logits: Any = None,
                 validate_args: Optional[bool] = None) -> None:
        self._init_binary(probs, logits, validate_args, total_count)

    @property
    def support(self) -> constraints.Constraint:  # type: ignore[override]
        """The integers ``0 .. total_count``."""
        return constraints.integer_interval(0, self.total_count)

    @property
    def mean(self) -> Tensor:
        return self.total_count * self.probs

    @property
    def mode(self) -> Tensor:
        return ((self.total_count + 1) * self.probs).floor().clamp(max=self.total_count)

    @property
    def variance(self) -> Tensor:
        return self.total_count * self.probs * (1 - self.probs)

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        n = self.total_count.detach().expand(*shape)._data
        p = self.probs.detach().expand(*shape)._data
        return drawn(self.probs, lambda rng: rng.binomial(n.astype("int64"), p, size=shape))

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        n, logits = self.total_count, self.logits
        log_choose = lgamma(n + 1) - lgamma(value + 1) - lgamma(n - value + 1)
        return log_choose + value * logits - n * softplus(logits)

    def _homogeneous_count(self, what: str) -> int:
        n = int(self.total_count.max().item()) if self.total_count.numel() else 0
        if self.total_count.numel() and not bool((self.total_count == n).all()):
            raise NotImplementedError(f"Binomial.{what}: total_count differs across the batch; "
                                      f"it needs one total_count for the whole batch")
        return n

    def entropy(self) -> Tensor:
        lp = self.log_prob(self.enumerate_support(False))
        return -(lp.exp() * lp).sum(0)

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """Return ``0 .. total_count`` along a new leading dimension (needs one total_count
        for the whole batch).

        Raises:
            NotImplementedError: total_count differs across the batch.
        """
        n = self._homogeneous_count("enumerate_support()")
        values = arange(1 + n, dtype=self.probs.dtype, device=self.probs.device)
        values = values.reshape(-1, *((1,) * len(self._batch_shape)))
        if expand:
            values = values.expand(-1, *self._batch_shape)
        return values


class Geometric(_BinaryParam):
    """Geometric distribution: the number of failures before the first success, each trial
    succeeding with probability ``probs`` (in (0, 1]) or log odds ``logits``.

    Raises:
        ValueError: both or neither of ``probs`` and ``logits``; with validation, ``probs``
            not in (0, 1] or a value that is not a non-negative integer.

    Example:
        >>> import mpitensor as mt
        >>> Geometric(mt.tensor(0.25)).mean.item()
        3.0
    """

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.nonnegative_integer

    def __init__(self, probs: Any = None, logits: Any = None,
                 validate_args: Optional[bool] = None) -> None:
        self._init_binary(probs, logits, validate_args)
        if self._validate_args and probs is not None and not bool((self.probs > 0).all()):
            raise ValueError("Geometric: parameter probs must be > 0 (a geometric count needs "
                             "a chance of success); pass probs in (0, 1]")

    @property
    def mean(self) -> Tensor:
        return 1.0 / self.probs - 1.0

    @property
    def mode(self) -> Tensor:
        return self.probs * 0

    @property
    def variance(self) -> Tensor:
        return (1.0 / self.probs - 1.0) / self.probs

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        p = self.probs.detach()
        u = uniform_open(shape, p)
        return (u.log() / (-p).log1p()).floor()

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        value, probs = broadcast_all(value, self.probs)
        # a certain success at the first trial: 0 * log(0) counts as 0
        safe = where((probs == 1) & (value == 0), 0.0, probs)
        return value * (-safe).log1p() + self.probs.log()

    def entropy(self) -> Tensor:
        return (softplus(self.logits) - self.logits * self.probs) / self.probs


class NegativeBinomial(_BinaryParam):
    """Negative binomial distribution: the number of successes (probability ``probs`` each,
    or log odds ``logits``) before ``total_count`` failures.

    Raises:
        ValueError: both or neither of ``probs`` and ``logits``; with validation, a negative
            ``total_count``, ``probs`` outside [0, 1) or a value that is not a non-negative
            integer.

    Example:
        >>> import mpitensor as mt
        >>> NegativeBinomial(3.0, mt.tensor(0.5)).mean.item()
        3.0
    """

    arg_constraints = {"total_count": constraints.greater_than_eq(0),
                       "probs": constraints.half_open_interval(0.0, 1.0),
                       "logits": constraints.real}
    support = constraints.nonnegative_integer
    _params = ("total_count", "probs", "logits")  # what expand() expands

    def __init__(self, total_count: Any, probs: Any = None, logits: Any = None,
                 validate_args: Optional[bool] = None) -> None:
        self._init_binary(probs, logits, validate_args, total_count)

    @property
    def mean(self) -> Tensor:
        return self.total_count * self.logits.exp()

    @property
    def mode(self) -> Tensor:
        return ((self.total_count - 1) * self.logits.exp()).floor().clamp(min=0.0)

    @property
    def variance(self) -> Tensor:
        return self.mean / (-self.logits).sigmoid()

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        # a Poisson draw whose rate is a Gamma(total_count, (1 - p) / p) draw
        rate = _gamma_draw(self.total_count.detach(), shape) * self.logits.detach().exp()
        return poisson(rate.contiguous())

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        n, logits = self.total_count, self.logits
        log_unnorm = -n * softplus(logits) - value * softplus(-logits)
        log_norm = -lgamma(n + value) + lgamma(1.0 + value) + lgamma(n)
        log_norm = where(n + value == 0.0, 0.0, log_norm)
        return log_unnorm - log_norm


class Multinomial(Distribution):
    """Multinomial distribution: the counts of ``total_count`` draws from a categorical of
    ``probs`` or ``logits`` (the event is the vector of K counts).

    Raises:
        ValueError: both or neither of ``probs`` and ``logits``; a ``total_count`` that is not
            an int; with validation, weights that are not a valid categorical or counts that
            are negative or sum over ``total_count``.

    Example:
        >>> import mpitensor as mt
        >>> Multinomial(4, mt.tensor([0.25, 0.75])).mean.tolist()
        [1.0, 3.0]
    """

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}

    def __init__(self, total_count: int = 1, probs: Any = None, logits: Any = None,
                 validate_args: Optional[bool] = None) -> None:
        if not isinstance(total_count, int) or isinstance(total_count, bool):
            raise ValueError(f"Multinomial: total_count must be an int (one count for the "
                             f"whole batch), got {total_count!r}")
        self.total_count = total_count
        self._categorical = Categorical(probs=probs, logits=logits,
                                        validate_args=validate_args)
        self._binomial = Binomial(total_count=total_count, probs=self.probs,
                                  validate_args=False)
        batch = self._categorical.batch_shape
        event = self._categorical.param_shape[-1:]
        super().__init__(batch, event, validate_args)

    probs = property(lambda self: self._categorical.probs, doc="Normalised probabilities.")
    logits = property(lambda self: self._categorical.logits,
                      doc="Normalised log probabilities.")

    @property
    def param_shape(self) -> Size:
        """The shape of ``probs``/``logits``."""
        return self._categorical.param_shape

    @property
    def support(self) -> constraints.Constraint:  # type: ignore[override]
        """Vectors of non-negative integer counts summing to at most ``total_count``."""
        return constraints.multinomial(self.total_count)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> Multinomial:
        new = _instance if _instance is not None else type(self).__new__(type(self))
        shape = _size(batch_shape)
        new.total_count = self.total_count
        new._categorical = self._categorical.expand(shape)
        new._binomial = self._binomial.expand(tuple(shape) + tuple(self._event_shape))
        return _expanded(new, self, shape)

    @property
    def mean(self) -> Tensor:
        return self.probs * self.total_count

    @property
    def variance(self) -> Tensor:
        return self.total_count * self.probs * (1 - self.probs)

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        sample_shape = _size(sample_shape)
        idx = self._categorical.sample(Size((self.total_count,)) + sample_shape)
        k = self._event_shape[0]
        probs = self.probs
        counts = eye(k, dtype=probs.dtype, device=probs.device)[idx].sum(0)
        return counts.reshape(*self._extended_shape(sample_shape))

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        # a category of probability 0 never drawn contributes nothing (not 0 * -inf)
        logits = where((value == 0) & (logits == -math.inf), 0.0, logits)
        return (lgamma(value.sum(-1) + 1) - lgamma(value + 1).sum(-1)
                + (logits * value).sum(-1))

    def entropy(self) -> Tensor:
        n = float(self.total_count)
        term1 = n * self._categorical.entropy() - math.lgamma(n + 1)
        support = self._binomial.enumerate_support(expand=False)[1:]
        binomial_probs = self._binomial.log_prob(support).exp()
        term2 = (binomial_probs * lgamma(support + 1)).sum(0).sum(-1)
        return term1 + term2


class OneHotCategoricalStraightThrough(OneHotCategorical):
    """A :class:`OneHotCategorical` whose ``rsample`` is a one-hot draw carrying the
    straight-through gradient: the draw's value, with the gradient of ``probs``
    (Bengio et al., 2013).

    Example:
        >>> import mpitensor as mt
        >>> OneHotCategoricalStraightThrough(mt.tensor([0.0, 1.0])).has_rsample
        True
    """

    has_rsample = True

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        draws = self.sample(sample_shape)
        probs = self._categorical.probs
        return draws + (probs - probs.detach())


class MixtureSameFamily(Distribution):
    """A mixture of K components of one family: ``mixture_distribution`` (a
    :class:`Categorical` over the K components, batch shape ``B``) picks a component of
    ``component_distribution`` (batch shape ``B + (K,)``).

    ``log_prob`` is ``logsumexp`` over the components of their log densities plus the log
    mixture weights; ``sample`` draws an index, then the chosen component's value.

    Raises:
        ValueError: a mixture that is not a Categorical, a component that is not a
            Distribution, batch shapes that do not match or a different number of components.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.distributions import Categorical, Normal
        >>> d = MixtureSameFamily(Categorical(mt.ones(2)), Normal(mt.tensor([-1.0, 1.0]), 1.0))
        >>> d.mean.item()
        0.0
    """

    arg_constraints: dict = {}
    has_rsample = False

    def __init__(self, mixture_distribution: Categorical,
                 component_distribution: Distribution,
                 validate_args: Optional[bool] = None) -> None:
        if not isinstance(mixture_distribution, Categorical):
            raise ValueError("MixtureSameFamily: mixture_distribution must be a Categorical")
        if not isinstance(component_distribution, Distribution):
            raise ValueError("MixtureSameFamily: component_distribution must be a "
                             "Distribution")
        mb = tuple(mixture_distribution.batch_shape)
        cb = tuple(component_distribution.batch_shape)
        if len(cb) < 1 or len(mb) != len(cb) - 1 or any(
                a != b and a != 1 and b != 1 for a, b in zip(mb, cb[:-1])):
            raise ValueError(f"MixtureSameFamily: the mixture's batch shape {mb} must match "
                             f"the component's batch shape {cb} without its last dimension")
        k = mixture_distribution.logits.shape[-1]
        if cb[-1] != k:
            raise ValueError(f"MixtureSameFamily: the mixture has {k} components but the "
                             f"component distribution's last batch dimension is {cb[-1]}")
        self._mixture_distribution = mixture_distribution
        self._component_distribution = component_distribution
        self._num_component = k
        self._event_ndims = len(component_distribution.event_shape)
        super().__init__(cb[:-1], component_distribution.event_shape, validate_args)

    mixture_distribution = property(lambda self: self._mixture_distribution,
                                    doc="The Categorical over the components.")
    component_distribution = property(lambda self: self._component_distribution,
                                      doc="The distribution of the components.")

    @property
    def support(self) -> constraints.Constraint:  # type: ignore[override]
        """The components' support."""
        return self._component_distribution.support

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> MixtureSameFamily:
        shape = tuple(_size(batch_shape))
        comp = self._component_distribution.expand(shape + (self._num_component,))
        mix = self._mixture_distribution.expand(shape)
        new = _instance if _instance is not None else type(self).__new__(type(self))
        new._mixture_distribution, new._component_distribution = mix, comp
        new._num_component, new._event_ndims = self._num_component, self._event_ndims
        return _expanded(new, self, shape)

    def _weights(self) -> Tensor:
        """The mixture probabilities, with a trailing 1 per event dimension."""
        probs = self._mixture_distribution.probs
        return probs.reshape(*probs.shape, *((1,) * self._event_ndims))

    def _pad(self, x: Tensor) -> Tensor:
        return x.unsqueeze(-1 - self._event_ndims)

    @property
    def mean(self) -> Tensor:
        return (self._weights() * self._component_distribution.mean).sum(-1 - self._event_ndims)

    @property
    def variance(self) -> Tensor:
        w, comp, d = self._weights(), self._component_distribution, -1 - self._event_ndims
        within = (w * comp.variance).sum(d)
        between = (w * (comp.mean - self._pad(self.mean)) ** 2).sum(d)
        return within + between

    def cdf(self, x: Any) -> Tensor:
        cdf_x = self._component_distribution.cdf(self._pad(x))
        return (cdf_x * self._mixture_distribution.probs).sum(-1)

    def log_prob(self, x: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(x)
        log_prob_x = self._component_distribution.log_prob(self._pad(x))
        log_mix = self._mixture_distribution.logits.log_softmax(-1)
        return (log_prob_x + log_mix).logsumexp(-1)

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        sample_shape = tuple(_size(sample_shape))
        idx = self._mixture_distribution.sample(sample_shape)  # S + B
        comp = self._component_distribution.sample(sample_shape)  # S + B + (K,) + E
        es = tuple(self._event_shape)
        idx = idx.reshape(*idx.shape, 1, *((1,) * len(es)))
        idx = idx.expand(*idx.shape[:-1 - len(es)], 1, *es)
        return comp.gather(-1 - len(es), idx).squeeze(-1 - len(es))

    def __repr__(self) -> str:
        return (f"MixtureSameFamily(\n  {self._mixture_distribution!r},\n  "
                f"{self._component_distribution!r})")
