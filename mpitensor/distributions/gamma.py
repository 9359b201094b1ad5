"""The gamma family: :class:`Gamma`, :class:`Beta` and :class:`Dirichlet`.

Draws come from the generator's gamma sampler. ``rsample`` is reparameterised: a draw is
``standard_gamma(concentration) / rate``, and the gradient of a standard gamma draw ``x`` with
respect to its concentration ``a`` is the implicit one, ``dx/da = -(dP/da)(a, x) / p(x)``
(``P`` the regularised lower incomplete gamma function, ``p`` the density): the change of ``x``
that keeps its quantile fixed. ``dP/da`` is summed from P's power series term by term.
"""

from __future__ import annotations

from typing import Any, Optional

from mpitensor import autograd as _autograd
from mpitensor._core.opkit import given_value
from mpitensor._ops import special as _special
from mpitensor.tensor import Tensor, digamma, lgamma, stack, where, xlogy

from . import constraints
from ._common import standard_gamma
from .distribution import Distribution, ShapeLike, _size

__all__ = ["Gamma", "Beta", "Dirichlet"]


def _dx_dalpha(a: Any, x: Any) -> Any:
    """``dx/da`` of a Gamma(a, 1) draw ``x`` at a fixed quantile (arrays of one shape)."""
    xp = _autograd._xp(x)
    logx = xp.log(x)
    # P(a, x) = sum_n exp((a + n) log x - x - lgamma(a + n + 1)); its terms peak near n = x - a
    n_max = int(float(xp.max(x)) + 12 * float(xp.max(x)) ** 0.5 + 40)
    dp = xp.zeros_like(x)
    big = xp.zeros_like(x)
    for n in range(n_max + 1):
        an1 = a + n + 1
        t = xp.exp((a + n) * logx - x - _special.lgamma(an1))
        dp = dp + t * (logx - _special.digamma(an1))
        big = xp.maximum(big, t)
        if n > 8 and bool(xp.all(t <= 1e-18 * big)):
            break
    log_pdf = (a - 1) * logx - x - _special.lgamma(a)
    return -dp / xp.exp(log_pdf)


_StandardGamma = given_value(
    "_StandardGamma", lambda g, a, x: g * _dx_dalpha(a, x),
    "Standard gamma draws ``x`` (computed outside) as a function of their concentration, with "
    "the implicit gradient.")


def _gamma_draw(concentration: Tensor, shape: tuple) -> Tensor:
    """Gamma(concentration, 1) draws of ``shape``, differentiable in the concentration."""
    x = standard_gamma(concentration, shape)
    if not (concentration.requires_grad and _autograd.is_grad_enabled()):
        return x
    return _StandardGamma.apply(concentration.expand(*shape), x)


class Gamma(Distribution):
    """Gamma distribution of shape ``concentration`` (> 0) and ``rate`` (> 0).

    Raises:
        ValueError: with validation, a parameter not > 0 or a negative value.

    Example:
        >>> Gamma(2.0, 4.0).mean.item()
        0.5
    """

    _params = ("concentration", "rate")  # what expand() expands
    arg_constraints = dict.fromkeys(_params, constraints.positive)
    support = constraints.nonnegative
    has_rsample = True

    def __init__(self, concentration: Any, rate: Any, validate_args: Optional[bool] = None) -> None:
        self._init_params((concentration, rate), validate_args)

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
        shape = tuple(self._extended_shape(sample_shape))
        return _gamma_draw(self.concentration, shape) / self.rate

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
    _params = ("concentration",)  # what expand() expands

    def __init__(self, concentration: Tensor, validate_args: Optional[bool] = None) -> None:
        if not isinstance(concentration, Tensor) or concentration.dim() < 1:
            raise ValueError("Dirichlet: concentration must be a tensor of at least one "
                             "dimension")
        self.concentration = concentration
        super().__init__(concentration.shape[:-1], concentration.shape[-1:], validate_args)

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
        g = _gamma_draw(self.concentration, tuple(self._extended_shape(sample_shape)))
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
    _params = ("concentration1", "concentration0")  # what expand() expands

    def __init__(self, concentration1: Any, concentration0: Any,
                 validate_args: Optional[bool] = None) -> None:
        self._init_params((concentration1, concentration0), validate_args)

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
        shape = tuple(_size(self._extended_shape(sample_shape)))
        ga, gb = _gamma_draw(a, shape), _gamma_draw(b, shape)
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
