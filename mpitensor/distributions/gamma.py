"""The gamma family: :class:`Gamma`, :class:`Beta` and :class:`Dirichlet`.

Draws come from the generator's gamma sampler. ``rsample`` passes gradients into ``rate``
(a draw is ``standard_gamma / rate``); the implicit gradient with respect to a concentration
is not implemented, and asking for it raises ``NotImplementedError``.
"""

from __future__ import annotations

from typing import Any, Optional

from mpitensor import autograd as _autograd
from mpitensor.tensor import Tensor, digamma, lgamma, stack, where, xlogy

from . import constraints
from ._common import standard_gamma
from .distribution import Distribution, ShapeLike, _expand_params, _size, broadcast_all

__all__ = ["Gamma", "Beta", "Dirichlet"]


def _no_concentration_grad(name: str, *concentrations: Tensor) -> None:
    if _autograd.is_grad_enabled() and any(c.requires_grad for c in concentrations):
        raise NotImplementedError(
            f"{name}.rsample(): gradients with respect to the concentration are not "
            f"implemented; detach it, or use sample() and a score-function estimator")


class Gamma(Distribution):
    """Gamma distribution of shape ``concentration`` (> 0) and ``rate`` (> 0).

    Raises:
        ValueError: with validation, a parameter not > 0 or a negative value.

    Example:
        >>> Gamma(2.0, 4.0).mean.item()
        0.5
    """

    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True

    def __init__(self, concentration: Any, rate: Any,
                 validate_args: Optional[bool] = None) -> None:
        self.concentration, self.rate = broadcast_all(concentration, rate)
        super().__init__(self.concentration.shape, (), validate_args)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> Gamma:
        """Return this distribution with its parameters expanded to ``batch_shape``."""
        return _expand_params(self, Gamma, ("concentration", "rate"), batch_shape, _instance)

    @property
    def mean(self) -> Tensor:
        return self.concentration / self.rate

    @property
    def mode(self) -> Tensor:
        return ((self.concentration - 1) / self.rate).clamp(min=0)

    @property
    def variance(self) -> Tensor:
        return self.concentration / self.rate ** 2

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        _no_concentration_grad("Gamma", self.concentration)
        shape = tuple(self._extended_shape(sample_shape))
        return standard_gamma(self.concentration, shape) / self.rate

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        c, r = self.concentration, self.rate
        return xlogy(c, r) + xlogy(c - 1, value) - r * value - lgamma(c)

    def entropy(self) -> Tensor:
        c = self.concentration
        return c - self.rate.log() + lgamma(c) + (1.0 - c) * digamma(c)


def _dirichlet_mode(c: Tensor) -> Tensor:
    """The mode of Dirichlet(c): ``(c - 1)+`` normalised; where every concentration is below 1
    (the density grows towards the corners), the corner of the largest one."""
    cm1 = (c - 1).clamp(min=0)
    mode = cm1 / cm1.sum(-1, keepdim=True)
    corner = (c == c.max(-1, keepdim=True).values).to(c.dtype)
    return where((c < 1).all(-1, keepdim=True), corner, mode)


class Dirichlet(Distribution):
    """Dirichlet distribution over the simplex of the last dimension of ``concentration``.

    Raises:
        ValueError: with validation, a concentration not > 0 or a value off the simplex.

    Example:
        >>> import mpitensor as mt
        >>> Dirichlet(mt.tensor([1.0, 3.0])).mean.tolist()
        [0.25, 0.75]
    """

    arg_constraints = {"concentration": constraints.independent(constraints.positive, 1)}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, concentration: Tensor, validate_args: Optional[bool] = None) -> None:
        if not isinstance(concentration, Tensor) or concentration.dim() < 1:
            raise ValueError("Dirichlet: concentration must be a tensor of at least one "
                             "dimension")
        self.concentration = concentration
        super().__init__(concentration.shape[:-1], concentration.shape[-1:], validate_args)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> Dirichlet:
        """Return this distribution with its concentration expanded to ``batch_shape``."""
        return _expand_params(self, Dirichlet, ("concentration",), batch_shape, _instance)

    @property
    def mean(self) -> Tensor:
        return self.concentration / self.concentration.sum(-1, keepdim=True)

    @property
    def mode(self) -> Tensor:
        return _dirichlet_mode(self.concentration)

    @property
    def variance(self) -> Tensor:
        c = self.concentration
        c0 = c.sum(-1, keepdim=True)
        return c * (c0 - c) / (c0 ** 2 * (c0 + 1))

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        _no_concentration_grad("Dirichlet", self.concentration)
        g = standard_gamma(self.concentration, tuple(self._extended_shape(sample_shape)))
        return g / g.sum(-1, keepdim=True)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        c = self.concentration
        return (xlogy(c - 1.0, value).sum(-1) + lgamma(c.sum(-1)) - lgamma(c).sum(-1))

    def entropy(self) -> Tensor:
        c = self.concentration
        k = c.shape[-1]
        c0 = c.sum(-1)
        return (lgamma(c).sum(-1) - lgamma(c0) - (k - c0) * digamma(c0)
                - ((c - 1.0) * digamma(c)).sum(-1))


class Beta(Distribution):
    """Beta distribution on [0, 1] of concentrations ``concentration1`` (alpha) and
    ``concentration0`` (beta), both > 0.

    Raises:
        ValueError: with validation, a concentration not > 0 or a value outside [0, 1].

    Example:
        >>> Beta(1.0, 3.0).mean.item()
        0.25
    """

    arg_constraints = {"concentration1": constraints.positive,
                       "concentration0": constraints.positive}
    support = constraints.unit_interval
    has_rsample = True

    def __init__(self, concentration1: Any, concentration0: Any,
                 validate_args: Optional[bool] = None) -> None:
        self.concentration1, self.concentration0 = broadcast_all(concentration1, concentration0)
        super().__init__(self.concentration1.shape, (), validate_args)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> Beta:
        """Return this distribution with its parameters expanded to ``batch_shape``."""
        return _expand_params(self, Beta, ("concentration1", "concentration0"), batch_shape,
                              _instance)

    @property
    def mean(self) -> Tensor:
        return self.concentration1 / (self.concentration1 + self.concentration0)

    @property
    def mode(self) -> Tensor:
        return _dirichlet_mode(self._dirichlet_concentration)[..., 0]

    @property
    def variance(self) -> Tensor:
        a, b = self.concentration1, self.concentration0
        t = a + b
        return a * b / (t ** 2 * (t + 1))

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        a, b = self.concentration1, self.concentration0
        _no_concentration_grad("Beta", a, b)
        shape = tuple(_size(self._extended_shape(sample_shape)))
        ga, gb = standard_gamma(a, shape), standard_gamma(b, shape)
        return ga / (ga + gb)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        a, b = self.concentration1, self.concentration0
        return (xlogy(a - 1, value) + xlogy(b - 1, 1 - value)
                - (lgamma(a) + lgamma(b) - lgamma(a + b)))

    def entropy(self) -> Tensor:
        a, b = self.concentration1, self.concentration0
        t = a + b
        return (lgamma(a) + lgamma(b) - lgamma(t) - (a - 1) * digamma(a)
                - (b - 1) * digamma(b) + (t - 2) * digamma(t))

    @property
    def _dirichlet_concentration(self) -> Tensor:
        return stack([self.concentration1, self.concentration0], -1)
