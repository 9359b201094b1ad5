"""Distributions defined by pushing a base distribution through transforms, with torch's API:
:class:`TransformedDistribution` and the families torch builds on it (LogNormal, HalfNormal,
HalfCauchy, Gumbel, Weibull, Pareto, Kumaraswamy, LogisticNormal, the relaxed Bernoulli and
one-hot categorical of the Gumbel-softmax trick).

``log_prob(y)`` inverts the transforms one by one and subtracts each log-det, summed over the
dimensions that the event has at that point; ``rsample`` pushes the base's reparameterised
draw forward, so gradients reach the parameters.

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.distributions import Normal
    >>> from mpitensor.distributions.transforms import TanhTransform
    >>> d = TransformedDistribution(Normal(0.0, 1.0), [TanhTransform(cache_size=1)])
    >>> round(d.log_prob(mt.tensor(0.0)).item(), 4)
    -0.9189
"""

from __future__ import annotations

import math
from typing import Any, Optional

from mpitensor.tensor import Size, Tensor, as_tensor, digamma, full_like, lgamma, where

from . import constraints
from ._common import clamp_probs, softplus, uniform
from .bernoulli import Bernoulli
from .categorical import Categorical
from .continuous_more import Cauchy, ContinuousBernoulli
from .distribution import (
    Distribution,
    ShapeLike,
    _expanded,
    _size,
    broadcast_all,
)
from .gamma import Beta, Gamma
from .independent import Independent, _sum_right
from .kl import _kl_normal_normal, kl_divergence, register_kl
from .laplace import Exponential, Laplace
from .normal import Normal
from .transforms import (
    AbsTransform,
    AffineTransform,
    ComposeTransform,
    ExpTransform,
    PowerTransform,
    SigmoidTransform,
    StickBreakingTransform,
    Transform,
)
from .uniform import Uniform

__all__ = [
    "TransformedDistribution", "LogNormal", "HalfNormal", "HalfCauchy", "Gumbel", "Weibull",
    "Pareto", "Kumaraswamy", "LogisticNormal", "RelaxedBernoulli", "RelaxedOneHotCategorical",
]  # LogitRelaxedBernoulli and ExpRelaxedCategorical live here, off the package's namespace
# (as in torch, where they are only in their modules)

EULER_GAMMA = 0.57721566490153286060


class TransformedDistribution(Distribution):
    """The distribution of ``y = t_n(...t_1(x))`` for ``x`` drawn from ``base_distribution``.

    Args:
        base_distribution: the distribution of ``x``.
        transforms: a :class:`~.transforms.Transform` or a list of them, applied in order.
        validate_args: see :class:`Distribution`.

    Raises:
        ValueError: ``transforms`` is not a Transform or a list of them; the base has fewer
            dimensions than the transforms' domain needs.
    """

    arg_constraints: dict = {}
    _expanded_params: tuple = ()  # the subclass's own parameters, expanded by expand()

    def __init__(self, base_distribution: Distribution, transforms: Any,
                 validate_args: Optional[bool] = None) -> None:
        if isinstance(transforms, Transform):
            self.transforms = [transforms]
        elif isinstance(transforms, list) and all(isinstance(t, Transform) for t in transforms):
            self.transforms = list(transforms)
        else:
            raise ValueError(f"TransformedDistribution: transforms must be a Transform or a "
                             f"list of Transforms, got {transforms!r}")
        base_shape = tuple(base_distribution.batch_shape) + tuple(base_distribution.event_shape)
        base_event_dim = len(base_distribution.event_shape)
        chain = ComposeTransform(self.transforms)
        if len(base_shape) < chain.domain.event_dim:
            raise ValueError(f"TransformedDistribution: the base distribution's shape "
                             f"{base_shape} has fewer than the {chain.domain.event_dim} "
                             f"dimensions the transforms' domain needs")
        forward_shape = tuple(chain.forward_shape(Size(base_shape)))
        expanded_base = tuple(chain.inverse_shape(Size(forward_shape)))
        if base_shape != expanded_base:
            base_distribution = base_distribution.expand(
                expanded_base[:len(expanded_base) - base_event_dim])
        extra = chain.domain.event_dim - base_event_dim
        if extra > 0:
            base_distribution = Independent(base_distribution, extra)
        self.base_dist = base_distribution
        event_dim = chain.codomain.event_dim + max(base_event_dim - chain.domain.event_dim, 0)
        cut = len(forward_shape) - event_dim
        super().__init__(forward_shape[:cut], forward_shape[cut:], validate_args)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> TransformedDistribution:
        """Return this distribution with its base (and own parameters) expanded to
        ``batch_shape``."""
        new = _instance if _instance is not None else type(self).__new__(type(self))
        batch_shape = _size(batch_shape)
        shape = Size(tuple(batch_shape) + tuple(self.event_shape))
        for t in reversed(self.transforms):
            shape = t.inverse_shape(shape)
        base_batch = tuple(shape)[:len(shape) - len(self.base_dist.event_shape)]
        new.base_dist = self.base_dist.expand(base_batch)
        new.transforms = self.transforms
        for name in self._expanded_params:
            setattr(new, name, getattr(self, name).expand(*batch_shape))
        return _expanded(new, self, batch_shape)

    @property
    def has_rsample(self) -> bool:  # type: ignore[override]
        return self.base_dist.has_rsample

    @property
    def support(self) -> constraints.Constraint:  # type: ignore[override]
        """The last transform's codomain, widened to the event's dimensions."""
        if not self.transforms:
            return self.base_dist.support
        support = self.transforms[-1].codomain
        if len(self.event_shape) > support.event_dim:
            support = constraints.independent(support, len(self.event_shape) - support.event_dim)
        return support

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        from mpitensor.autograd import no_grad

        with no_grad():
            x = self.base_dist.sample(sample_shape)
            for t in self.transforms:
                x = t(x)
            return x

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        x = self.base_dist.rsample(sample_shape)
        for t in self.transforms:
            x = t(x)
        return x

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        event_dim = len(self.event_shape)
        log_prob: Any = 0.0
        y = value
        for t in reversed(self.transforms):
            x = t.inv(y)
            event_dim += t.domain.event_dim - t.codomain.event_dim
            log_prob = log_prob - _sum_right(t.log_abs_det_jacobian(x, y),
                                             event_dim - t.domain.event_dim)
            y = x
        return log_prob + _sum_right(self.base_dist.log_prob(y),
                                     event_dim - len(self.base_dist.event_shape))

    def _monotonize_cdf(self, value: Tensor) -> Tensor:
        """The CDF of the base at the inverse, turned round where the chain decreases."""
        sign: Any = 1
        for t in self.transforms:
            sign = sign * t.sign
        if isinstance(sign, int) and sign == 1:
            return value
        return sign * (value - 0.5) + 0.5

    def cdf(self, value: Any) -> Tensor:
        """The CDF through monotone transforms (each must have a ``sign``)."""
        for t in reversed(self.transforms):
            value = t.inv(value)
        if self._validate_args:
            self.base_dist._validate_sample(value)
        return self._monotonize_cdf(self.base_dist.cdf(value))

    def icdf(self, value: Any) -> Tensor:
        """The inverse CDF through monotone transforms (each must have a ``sign``)."""
        value = self.base_dist.icdf(self._monotonize_cdf(value))
        for t in self.transforms:
            value = t(value)
        return value


class _BaseParams:
    """Mixin: ``loc`` and ``scale`` are the base distribution's."""

    loc = property(lambda self: self.base_dist.loc, doc="The base's location.")
    scale = property(lambda self: self.base_dist.scale, doc="The base's scale.")


class LogNormal(_BaseParams, TransformedDistribution):
    """``exp(X)`` for ``X ~ Normal(loc, scale)``.

    Raises:
        ValueError: with validation, a ``scale`` not > 0 or a value not > 0.

    Example:
        >>> round(LogNormal(0.0, 1.0).mean.item(), 6)
        1.648721
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.positive  # type: ignore[assignment]
    has_rsample = True  # type: ignore[assignment]

    def __init__(self, loc: Any, scale: Any, validate_args: Optional[bool] = None) -> None:
        super().__init__(Normal(loc, scale, validate_args=validate_args), ExpTransform(),
                         validate_args=validate_args)

    @property
    def mean(self) -> Tensor:
        return (self.loc + self.scale.pow(2) / 2).exp()

    @property
    def mode(self) -> Tensor:
        return (self.loc - self.scale.pow(2)).exp()

    @property
    def variance(self) -> Tensor:
        s2 = self.scale.pow(2)
        return s2.expm1() * (2 * self.loc + s2).exp()

    def entropy(self) -> Tensor:
        return self.base_dist.entropy() + self.loc


class _Folded(TransformedDistribution):
    """``|X|`` for ``X`` symmetric about 0: the density and CDF doubled on [0, inf)."""

    support = constraints.nonnegative  # type: ignore[assignment]
    has_rsample = True  # type: ignore[assignment]
    scale = property(lambda self: self.base_dist.scale, doc="The base's scale.")

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        value = value if isinstance(value, Tensor) else as_tensor(
            value, dtype=self.scale.dtype, device=self.scale.device)
        lp = self.base_dist.log_prob(value) + math.log(2)
        return where(value >= 0, lp, -math.inf)

    def cdf(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return 2 * self.base_dist.cdf(value) - 1

    def icdf(self, prob: Any) -> Tensor:
        return self.base_dist.icdf((prob + 1) / 2)

    def entropy(self) -> Tensor:
        return self.base_dist.entropy() - math.log(2)


class HalfNormal(_Folded):
    """``|X|`` for ``X ~ Normal(0, scale)``.

    Example:
        >>> round(HalfNormal(1.0).mean.item(), 6)
        0.797885
    """

    arg_constraints = {"scale": constraints.positive}

    def __init__(self, scale: Any, validate_args: Optional[bool] = None) -> None:
        super().__init__(Normal(0, scale, validate_args=validate_args), AbsTransform(),
                         validate_args=validate_args)

    @property
    def mean(self) -> Tensor:
        return self.scale * math.sqrt(2 / math.pi)

    @property
    def mode(self) -> Tensor:
        return self.scale.new_zeros(self.scale.shape)

    @property
    def variance(self) -> Tensor:
        return self.scale.pow(2) * (1 - 2 / math.pi)


class HalfCauchy(_Folded):
    """``|X|`` for ``X ~ Cauchy(0, scale)`` (mean and variance infinite).

    Example:
        >>> import mpitensor as mt
        >>> HalfCauchy(1.0).cdf(mt.tensor(1.0)).item()
        0.5
    """

    arg_constraints = {"scale": constraints.positive}

    def __init__(self, scale: Any, validate_args: Optional[bool] = None) -> None:
        super().__init__(Cauchy(0, scale, validate_args=validate_args), AbsTransform(),
                         validate_args=validate_args)

    def _filled(self, value: float) -> Tensor:
        return full_like(self.scale, value).expand(*self.batch_shape)

    @property
    def mean(self) -> Tensor:
        return self._filled(math.inf)

    @property
    def mode(self) -> Tensor:
        return self._filled(0.0)

    @property
    def variance(self) -> Tensor:
        return self._filled(math.inf)


class Gumbel(TransformedDistribution):
    """Gumbel (type-I extreme value) distribution of location ``loc`` and scale ``scale``.

    Example:
        >>> round(Gumbel(0.0, 1.0).mean.item(), 6)
        0.577216
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real  # type: ignore[assignment]
    _expanded_params = ("loc", "scale")

    def __init__(self, loc: Any, scale: Any, validate_args: Optional[bool] = None) -> None:
        self.loc, self.scale = broadcast_all(loc, scale)
        from mpitensor import dtypes as _dt

        fi = _dt.finfo(self.loc.dtype)
        base = Uniform(full_like(self.loc, fi.tiny), full_like(self.loc, 1 - fi.eps),
                       validate_args=validate_args)
        chain = [ExpTransform().inv, AffineTransform(0, -self.scale.new_ones(self.scale.shape)),
                 ExpTransform().inv, AffineTransform(self.loc, -self.scale)]
        super().__init__(base, chain, validate_args=validate_args)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        z = (self.loc - value) / self.scale
        return z - z.exp() - self.scale.log()

    @property
    def mean(self) -> Tensor:
        return self.loc + self.scale * EULER_GAMMA

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def stddev(self) -> Tensor:
        return (math.pi / math.sqrt(6)) * self.scale

    @property
    def variance(self) -> Tensor:
        return self.stddev.pow(2)

    def entropy(self) -> Tensor:
        return self.scale.log() + (1 + EULER_GAMMA)


class Weibull(TransformedDistribution):
    """Weibull distribution of scale ``scale`` and shape ``concentration``.

    Example:
        >>> Weibull(1.0, 1.0).mean.item()
        1.0
    """

    arg_constraints = {"scale": constraints.positive, "concentration": constraints.positive}
    support = constraints.positive  # type: ignore[assignment]

    def __init__(self, scale: Any, concentration: Any,
                 validate_args: Optional[bool] = None) -> None:
        self.scale, self.concentration = broadcast_all(scale, concentration)
        self.concentration_reciprocal = self.concentration.reciprocal()
        base = Exponential(self.scale.new_ones(self.scale.shape), validate_args=validate_args)
        chain = [PowerTransform(self.concentration_reciprocal), AffineTransform(0, self.scale)]
        super().__init__(base, chain, validate_args=validate_args)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> Weibull:
        new = _instance if _instance is not None else type(self).__new__(type(self))
        shape = _size(batch_shape)
        new.scale = self.scale.expand(*shape)
        new.concentration = self.concentration.expand(*shape)
        new.concentration_reciprocal = new.concentration.reciprocal()
        chain = [PowerTransform(new.concentration_reciprocal), AffineTransform(0, new.scale)]
        TransformedDistribution.__init__(new, self.base_dist.expand(shape), chain,
                                         validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _raw_moment(self, n: int) -> Tensor:
        return self.scale.pow(n) * lgamma(1 + n * self.concentration_reciprocal).exp()

    @property
    def mean(self) -> Tensor:
        return self._raw_moment(1)

    @property
    def mode(self) -> Tensor:
        c = self.concentration
        return self.scale * ((c - 1) / c) ** self.concentration_reciprocal

    @property
    def variance(self) -> Tensor:
        return self._raw_moment(2) - self._raw_moment(1).pow(2)

    def entropy(self) -> Tensor:
        r = self.concentration_reciprocal
        return EULER_GAMMA * (1 - r) + (self.scale * r).log() + 1


class Pareto(TransformedDistribution):
    """Pareto type-I distribution of minimum ``scale`` and tail index ``alpha``.

    Example:
        >>> Pareto(1.0, 2.0).mean.item()
        2.0
    """

    arg_constraints = {"alpha": constraints.positive, "scale": constraints.positive}
    _expanded_params = ("scale", "alpha")

    def __init__(self, scale: Any, alpha: Any, validate_args: Optional[bool] = None) -> None:
        self.scale, self.alpha = broadcast_all(scale, alpha)
        base = Exponential(self.alpha, validate_args=validate_args)
        super().__init__(base, [ExpTransform(), AffineTransform(0, self.scale)],
                         validate_args=validate_args)

    @property
    def support(self) -> constraints.Constraint:  # type: ignore[override]
        return constraints.greater_than_eq(self.scale)

    @property
    def mean(self) -> Tensor:
        a = self.alpha.clamp(min=1)
        return a * self.scale / (a - 1)

    @property
    def mode(self) -> Tensor:
        return self.scale

    @property
    def variance(self) -> Tensor:
        a = self.alpha.clamp(min=2)
        return self.scale.pow(2) * a / ((a - 1).pow(2) * (a - 2))

    def entropy(self) -> Tensor:
        return (self.scale / self.alpha).log() + (1 + self.alpha.reciprocal())


def _kumaraswamy_moment(a: Tensor, b: Tensor, n: int) -> Tensor:
    """``E[X^n] = b B(1 + n/a, b)`` of Kumaraswamy(a, b)."""
    s = 1 + n / a
    return b * (lgamma(s) + lgamma(b) - lgamma(s + b)).exp()


class Kumaraswamy(TransformedDistribution):
    """Kumaraswamy distribution on (0, 1), ``1 - (1 - x^a)^b`` its CDF
    (``a = concentration1``, ``b = concentration0``).

    Example:
        >>> Kumaraswamy(1.0, 1.0).mean.item()
        0.5
    """

    arg_constraints = {"concentration1": constraints.positive,
                       "concentration0": constraints.positive}
    support = constraints.unit_interval  # type: ignore[assignment]
    has_rsample = True  # type: ignore[assignment]
    _expanded_params = ("concentration1", "concentration0")

    def __init__(self, concentration1: Any, concentration0: Any,
                 validate_args: Optional[bool] = None) -> None:
        self.concentration1, self.concentration0 = broadcast_all(concentration1, concentration0)
        c0 = self.concentration0
        base = Uniform(full_like(c0, 0), full_like(c0, 1), validate_args=validate_args)
        chain = [PowerTransform(c0.reciprocal()), AffineTransform(1.0, -1.0),
                 PowerTransform(self.concentration1.reciprocal())]
        super().__init__(base, chain, validate_args=validate_args)

    @property
    def mean(self) -> Tensor:
        return _kumaraswamy_moment(self.concentration1, self.concentration0, 1)

    @property
    def mode(self) -> Tensor:
        a, b = self.concentration1, self.concentration0
        log_mode = ((a - 1).log() - (a * b - 1).log()) / a
        return where((a < 1) | (b < 1), math.nan, log_mode.exp())

    @property
    def variance(self) -> Tensor:
        a, b = self.concentration1, self.concentration0
        return _kumaraswamy_moment(a, b, 2) - self.mean.pow(2)

    def entropy(self) -> Tensor:
        a, b = self.concentration1, self.concentration0
        harmonic_b = digamma(b + 1) + EULER_GAMMA
        return (1 - b.reciprocal()) + (1 - a.reciprocal()) * harmonic_b - a.log() - b.log()


class LogisticNormal(TransformedDistribution):
    """Stick-breaking of a Normal vector: ``K - 1`` normal numbers onto the ``K``-simplex.

    Example:
        >>> import mpitensor as mt
        >>> LogisticNormal(mt.zeros(2), mt.ones(2)).event_shape
        mpitensor.Size([3])
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.simplex  # type: ignore[assignment]
    has_rsample = True  # type: ignore[assignment]

    def __init__(self, loc: Any, scale: Any, validate_args: Optional[bool] = None) -> None:
        base: Distribution = Normal(loc, scale, validate_args=validate_args)
        if not base.batch_shape:
            base = base.expand([1])
        super().__init__(base, StickBreakingTransform(), validate_args=validate_args)

    loc = property(lambda self: self.base_dist.base_dist.loc, doc="The base's location.")
    scale = property(lambda self: self.base_dist.base_dist.scale, doc="The base's scale.")


def _temperature(temperature: Any, like: Tensor) -> Tensor:
    if isinstance(temperature, Tensor):
        return temperature
    return as_tensor(temperature, dtype=like.dtype, device=like.device)


class LogitRelaxedBernoulli(Distribution):
    """The logit of a relaxed Bernoulli (binary Concrete) variable: logistic noise added to
    the logits, divided by ``temperature``.

    Args:
        temperature: the relaxation temperature (> 0).
        probs, logits: exactly one of them, as :class:`~.Bernoulli`'s.
        validate_args: see :class:`Distribution`.

    Raises:
        ValueError: both or neither of ``probs`` and ``logits``; with validation, ``probs``
            outside [0, 1].
    """

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.real
    has_rsample = False  # as torch's flag, though rsample() is reparameterised

    def __init__(self, temperature: Any, probs: Any = None, logits: Any = None,
                 validate_args: Optional[bool] = None) -> None:
        if (probs is None) == (logits is None):
            raise ValueError(f"{type(self).__name__}: pass either probs or logits, not both "
                             f"and not neither")
        name, given = ("probs", probs) if probs is not None else ("logits", logits)
        self._param = broadcast_all(given)[0]
        setattr(self, name, self._param)
        self.temperature = _temperature(temperature, self._param)
        super().__init__(self._param.shape, (), validate_args)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> LogitRelaxedBernoulli:
        new = _instance if _instance is not None else type(self).__new__(type(self))
        new.temperature = self.temperature
        return Bernoulli.expand(self, batch_shape, _instance=new)  # type: ignore[arg-type]

    # the probs/logits pair and its conversions are Bernoulli's
    logits = Bernoulli.logits
    probs = Bernoulli.probs
    param_shape = Bernoulli.param_shape

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        probs = clamp_probs(self.probs.expand(*shape))
        u = clamp_probs(uniform(shape, probs))
        return (u.log() - (-u).log1p() + probs.log() - (-probs).log1p()) / self.temperature

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        diff = logits - value * self.temperature
        return self.temperature.log() + diff - 2 * softplus(diff)


class _Relaxed(TransformedDistribution):
    """A relaxed family: ``_link`` of a ``_base`` distribution set by a temperature and
    ``probs`` or ``logits``, whose parameters it shows."""

    has_rsample = True  # type: ignore[assignment]
    _base: Any
    _link: Any

    def __init__(self, temperature: Any, probs: Any = None, logits: Any = None,
                 validate_args: Optional[bool] = None) -> None:
        base = self._base(temperature, probs, logits, validate_args=validate_args)
        super().__init__(base, self._link(), validate_args=validate_args)

    temperature = property(lambda self: self.base_dist.temperature, doc="The temperature.")
    logits = property(lambda self: self.base_dist.logits, doc="The (log-odds) logits.")
    probs = property(lambda self: self.base_dist.probs, doc="The probabilities.")


class RelaxedBernoulli(_Relaxed):
    """The relaxed Bernoulli (binary Concrete) distribution on (0, 1): the sigmoid of a
    :class:`LogitRelaxedBernoulli`; ``rsample`` is reparameterised.

    Example:
        >>> import mpitensor as mt
        >>> d = RelaxedBernoulli(mt.tensor(0.5), probs=mt.tensor([0.3]))
        >>> d.batch_shape
        mpitensor.Size([1])
    """

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.unit_interval  # type: ignore[assignment]
    _base = LogitRelaxedBernoulli
    _link = SigmoidTransform


class ExpRelaxedCategorical(Distribution):
    """The log of a relaxed one-hot categorical (Concrete) variable: Gumbel noise added to
    the logits, divided by ``temperature``, normalised by log-sum-exp.

    Args:
        temperature: the relaxation temperature (> 0).
        probs, logits: exactly one, as :class:`~.Categorical`'s.
        validate_args: see :class:`Distribution`.
    """

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, temperature: Any, probs: Any = None, logits: Any = None,
                 validate_args: Optional[bool] = None) -> None:
        self._categorical = Categorical(probs, logits, validate_args=validate_args)
        self.temperature = _temperature(temperature, self._categorical._param)
        super().__init__(self._categorical.batch_shape, self._categorical.param_shape[-1:],
                         validate_args)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> ExpRelaxedCategorical:
        new = _instance if _instance is not None else type(self).__new__(type(self))
        shape = _size(batch_shape)
        new.temperature = self.temperature
        new._categorical = self._categorical.expand(shape)
        return _expanded(new, self, shape)

    param_shape = property(lambda self: self._categorical.param_shape)
    logits = property(lambda self: self._categorical.logits, doc="Normalised log-probs.")
    probs = property(lambda self: self._categorical.probs, doc="Normalised probabilities.")

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        u = clamp_probs(uniform(shape, self.logits))
        gumbels = -((-(u.log())).log())
        scores = (self.logits + gumbels) / self.temperature
        return scores - scores.logsumexp(dim=-1, keepdim=True)

    def log_prob(self, value: Any) -> Tensor:
        k = self._categorical._num_events
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        log_scale = full_like(self.temperature, float(k)).lgamma() \
            + (k - 1) * self.temperature.log()
        score = logits - value * self.temperature
        score = (score - score.logsumexp(dim=-1, keepdim=True)).sum(-1)
        return score + log_scale


class RelaxedOneHotCategorical(_Relaxed):
    """The relaxed one-hot categorical (Concrete, Gumbel-softmax) distribution on the simplex:
    ``exp`` of an :class:`ExpRelaxedCategorical`; ``rsample`` is reparameterised.

    Example:
        >>> import mpitensor as mt
        >>> d = RelaxedOneHotCategorical(mt.tensor(1.0), logits=mt.zeros(3))
        >>> d.event_shape
        mpitensor.Size([3])
    """

    arg_constraints = {"probs": constraints.simplex, "logits": constraints.real_vector}
    support = constraints.simplex  # type: ignore[assignment]
    _base = ExpRelaxedCategorical
    _link = ExpTransform


# -- KL divergences of these families (the pairs torch registers within them) --------------
# Registered here rather than in kl.py, which imports the families below this module.


@register_kl(TransformedDistribution, TransformedDistribution)
def _kl_transformed_transformed(p: TransformedDistribution, q: TransformedDistribution) -> Any:
    if p.transforms == q.transforms and p.event_shape == q.event_shape:
        return kl_divergence(p.base_dist, q.base_dist)  # the same bijection leaves KL as is
    raise NotImplementedError("kl_divergence of TransformedDistributions is only known for "
                              "equal transforms and event shapes")


@register_kl(HalfNormal, HalfNormal)
def _kl_halfnormal_halfnormal(p: HalfNormal, q: HalfNormal) -> Tensor:
    return _kl_normal_normal(p.base_dist, q.base_dist)


@register_kl(Pareto, Pareto)
def _kl_pareto_pareto(p: Pareto, q: Pareto) -> Tensor:
    alpha_ratio = q.alpha / p.alpha
    kl = q.alpha * (p.scale / q.scale).log() - alpha_ratio.log() + alpha_ratio - 1
    return where(p.scale < q.scale, math.inf, kl)


@register_kl(Gumbel, Gumbel)
def _kl_gumbel_gumbel(p: Gumbel, q: Gumbel) -> Tensor:
    ratio = p.scale / q.scale
    shift = (p.loc - q.loc) / q.scale
    return (-ratio.log() + shift + ratio * EULER_GAMMA
            + (lgamma(1 + ratio) - shift).exp() - (1 + EULER_GAMMA))


# Cross-family pairs with Gumbel and Pareto. Each finite one is E_p[log p] - E_p[log q], with
# E_p[log p] = -entropy(p) and the expectations of x, x^2, log x or exp(-x / scale) under p.

def _gumbel_cross(p: Distribution, q: Gumbel, mean_x: Tensor, mgf: Tensor) -> Tensor:
    """KL(p || Gumbel q) from E_p[x] and E_p[exp(-x / q.scale)]."""
    return (-p.entropy() + q.scale.log() + (mean_x - q.loc) / q.scale
            + mgf * (q.loc / q.scale).exp())


@register_kl(Exponential, Gumbel)
def _kl_exponential_gumbel(p: Exponential, q: Gumbel) -> Tensor:
    return _gumbel_cross(p, q, p.rate.reciprocal(), p.rate / (p.rate + q.scale.reciprocal()))


@register_kl(Gamma, Gumbel)
def _kl_gamma_gumbel(p: Gamma, q: Gumbel) -> Tensor:
    mgf = (1 + (p.rate * q.scale).reciprocal()).pow(-p.concentration)
    return _gumbel_cross(p, q, p.concentration / p.rate, mgf)


@register_kl(Normal, Gumbel)
def _kl_normal_gumbel(p: Normal, q: Gumbel) -> Tensor:
    mgf = (-p.loc / q.scale + (p.scale / q.scale).pow(2) / 2).exp()
    return _gumbel_cross(p, q, p.loc, mgf)


@register_kl(Uniform, Gumbel)
def _kl_uniform_gumbel(p: Uniform, q: Gumbel) -> Tensor:
    mgf = q.scale * ((-p.low / q.scale).exp() - (-p.high / q.scale).exp()) / (p.high - p.low)
    return _gumbel_cross(p, q, (p.low + p.high) / 2, mgf)


def _normal_cross(p: Distribution, q: Normal, mean_x: Tensor, var_x: Tensor) -> Tensor:
    """KL(p || Normal q) from the mean and variance of p."""
    sq = (var_x + (mean_x - q.loc).pow(2)) / (2 * q.scale.pow(2))
    return -p.entropy() + q.scale.log() + 0.5 * math.log(2 * math.pi) + sq


@register_kl(Gumbel, Normal)
def _kl_gumbel_normal(p: Gumbel, q: Normal) -> Tensor:
    return _normal_cross(p, q, p.mean, p.variance)


def _pareto_moments(p: Pareto) -> tuple:
    """E[x] and Var[x] of a Pareto, infinite where they do not exist."""
    a = p.alpha
    mean = where(a > 1, p.mean, math.inf)
    return mean, where(a > 2, p.variance, math.inf)


@register_kl(Pareto, Normal)
def _kl_pareto_normal(p: Pareto, q: Normal) -> Tensor:
    return _normal_cross(p, q, *_pareto_moments(p))


@register_kl(Pareto, Exponential)
def _kl_pareto_exponential(p: Pareto, q: Exponential) -> Tensor:
    return -p.entropy() - q.rate.log() + q.rate * _pareto_moments(p)[0]


@register_kl(Pareto, Gamma)
def _kl_pareto_gamma(p: Pareto, q: Gamma) -> Tensor:
    c, r = q.concentration, q.rate
    mean_log = p.scale.log() + p.alpha.reciprocal()
    log_q = c * r.log() - lgamma(c) + (c - 1) * mean_log - r * _pareto_moments(p)[0]
    return -p.entropy() - log_q


@register_kl(Uniform, Pareto)
def _kl_uniform_pareto(p: Uniform, q: Pareto) -> Tensor:
    lo, hi = p.low, p.high
    mean_log = (hi * hi.log() - lo * lo.log()) / (hi - lo) - 1
    kl = (-(hi - lo).log() - q.alpha.log() - q.alpha * q.scale.log()
          + (q.alpha + 1) * mean_log)
    return where(lo < q.scale, math.inf, kl)


def _infinite(p: Distribution, q: Distribution) -> Tensor:
    """KL where p puts mass outside q's support."""
    like = next(v for v in vars(p).values() if isinstance(v, Tensor))
    return full_like(like, math.inf).expand(*p.batch_shape)


for _pq in [(Gumbel, Beta), (Gumbel, ContinuousBernoulli), (Gumbel, Exponential),
            (Gumbel, Gamma), (Gumbel, Pareto), (Gumbel, Uniform), (Beta, Pareto),
            (ContinuousBernoulli, Pareto), (Exponential, Pareto), (Gamma, Pareto),
            (Laplace, Pareto), (Normal, Pareto), (Pareto, Beta), (Pareto, ContinuousBernoulli),
            (Pareto, Uniform)]:
    register_kl(*_pq)(_infinite)
