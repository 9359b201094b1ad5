"""More continuous families of ``torch.distributions``: :class:`Cauchy`, :class:`StudentT`,
:class:`Chi2`, :class:`FisherSnedecor`, :class:`InverseGamma`, :class:`VonMises`,
:class:`ContinuousBernoulli`, :class:`GeneralizedPareto`,
:class:`LowRankMultivariateNormal`, the matrix families :class:`Wishart` and
:class:`LKJCholesky` (written in ``_matrix_families``) and the :class:`ExponentialFamily`
base class.

Every density is composed of differentiable tensor ops; reparameterised samplers
(``rsample``) pass gradients into the parameters, through the gamma sampler's implicit
gradient where a family is built on gamma draws (StudentT, FisherSnedecor, InverseGamma).

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.distributions import Cauchy
    >>> round(Cauchy(0.0, 1.0).cdf(mt.tensor(1.0)).item(), 6)
    0.75
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

from mpitensor import autograd as _autograd
from mpitensor import dtypes as _dt
from mpitensor import special as _special
from mpitensor.tensor import (
    Tensor,
    broadcast_shapes,
    digamma,
    eye,
    full,
    lgamma,
    ones_like,
    where,
    zeros_like,
)

from . import constraints
from ._common import (
    LOG_SQRT_2PI,
    clamp_probs,
    logits_to_probs,
    normal,
    probs_to_logits,
    softplus,
    uniform,
    uniform_open,
)
from ._location import CenteredAtLoc, LocScale
from ._matrix_families import LKJCholesky, Wishart
from .distribution import Distribution, ShapeLike, _expanded, _size, broadcast_all, lazy_property
from .gamma import Gamma, _gamma_draw
from .multivariate_normal import _Cholesky, _SolveLower

__all__ = [
    "ExponentialFamily", "Cauchy", "StudentT", "Chi2", "FisherSnedecor", "InverseGamma",
    "VonMises", "ContinuousBernoulli", "GeneralizedPareto", "LowRankMultivariateNormal",
    "Wishart", "LKJCholesky",
]


def _filled(like: Tensor, shape: Any, value: float) -> Tensor:
    return full(tuple(shape), value, dtype=like.dtype, device=like.device)


class ExponentialFamily(Distribution):
    """Base class of exponential families, densities ``exp(<t(x), theta> - F(theta) + k(x))``.

    A subclass defines ``_natural_params`` (the tuple ``theta``), ``_log_normalizer(*theta)``
    (``F``) and ``_mean_carrier_measure`` (``E[k(x)]``); :meth:`entropy` then follows as
    ``F(theta) - <theta, grad F(theta)> - E[k(x)]``.

    mpitensor's autograd has no higher-order gradients, so this entropy is a value only: with
    gradients recorded and a natural parameter that requires grad it raises (a family that
    needs a differentiable entropy writes it in closed form, as :class:`ContinuousBernoulli`
    does).
    """

    @property
    def _natural_params(self) -> Tuple[Tensor, ...]:
        raise NotImplementedError(f"{type(self).__name__} does not define _natural_params")

    def _log_normalizer(self, *natural_params: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not define _log_normalizer")

    @property
    def _mean_carrier_measure(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define "
                                  f"_mean_carrier_measure")

    def entropy(self) -> Tensor:
        """The entropy through the log-normalizer's gradient (Bregman divergence form).

        Raises:
            NotImplementedError: gradients are recorded and a natural parameter requires
                grad (this entropy would not be differentiable).
        """
        lg, params, grads = self._log_normalizer_and_grad("entropy()", self._natural_params)
        result = lg - self._mean_carrier_measure
        for p, g in zip(params, grads):
            result = result - (p * g).reshape(*self._batch_shape, -1).sum(-1)
        return result

    def _log_normalizer_and_grad(self, what: str, params: Tuple[Tensor, ...],
                                 others: Tuple[Tensor, ...] = ()) -> tuple:
        """``F(theta)``, ``theta`` and ``grad F(theta)`` for ``theta = params``, all detached.

        Raises:
            NotImplementedError: gradients are recorded and a parameter (of ``params`` or
                ``others``, tensors the caller combines with them) requires grad.
        """
        if _autograd.is_grad_enabled() and any(p.requires_grad for p in (*params, *others)):
            raise NotImplementedError(
                f"{type(self).__name__}.{what}: the log-normalizer form needs higher-order "
                f"gradients to be differentiable, which mpitensor's autograd lacks; call it "
                f"under no_grad() or with detached parameters")
        leaves = [p.detach().requires_grad_() for p in params]
        with _autograd.enable_grad():
            lg = self._log_normalizer(*leaves)
            grads = _autograd.grad(lg.sum(), leaves)
        return lg.detach(), [p.detach() for p in leaves], grads


class Cauchy(LocScale):
    """Cauchy (Lorentz) distribution of median ``loc`` and half width ``scale`` (> 0).

    The mean and the variance do not exist: they are NaN and infinity, as in torch.

    Raises:
        ValueError: with validation, a ``scale`` not > 0.

    Example:
        >>> round(Cauchy(0.0, 2.0).entropy().item(), 6) == round(math.log(8 * math.pi), 6)
        True
    """

    @property
    def mean(self) -> Tensor:
        return _filled(self.loc, self._extended_shape(), math.nan)

    @property
    def variance(self) -> Tensor:
        return _filled(self.loc, self._extended_shape(), math.inf)

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        u = uniform(tuple(self._extended_shape(sample_shape)), self.loc)
        return self.icdf(u)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        z = (value - self.loc) / self.scale
        return -math.log(math.pi) - self.scale.log() - (z * z).log1p()

    def cdf(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return ((value - self.loc) / self.scale).atan() / math.pi + 0.5

    def icdf(self, value: Any) -> Tensor:
        return (math.pi * (value - 0.5)).tan() * self.scale + self.loc

    def entropy(self) -> Tensor:
        return math.log(4 * math.pi) + self.scale.log()


class StudentT(Distribution):
    """Student's t distribution of ``df`` (> 0) degrees of freedom, location ``loc`` and
    scale ``scale`` (> 0). ``rsample`` is ``loc + scale * N / sqrt(G / df)`` with ``G`` a
    chi-squared (gamma) draw, differentiable in all three.

    Raises:
        ValueError: with validation, ``df`` or ``scale`` not > 0.

    Example:
        >>> StudentT(3.0).variance.item()
        3.0
    """

    arg_constraints = {"df": constraints.positive, "loc": constraints.real,
                       "scale": constraints.positive}
    support = constraints.real
    has_rsample = True
    _params = ("df", "loc", "scale")  # what expand() expands

    def __init__(self, df: Any, loc: Any = 0.0, scale: Any = 1.0,
                 validate_args: Optional[bool] = None) -> None:
        self._init_params((df, loc, scale), validate_args)

    @property
    def mean(self) -> Tensor:
        return where(self.df > 1, self.loc, math.nan)

    @property
    def mode(self) -> Tensor:
        return self.loc

    @property
    def variance(self) -> Tensor:
        df = self.df
        var = self.scale ** 2 * df / where(df > 2, df - 2, 1.0)
        return where(df > 2, var, where(df > 1, math.inf, math.nan))

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        x = normal(shape, self.df)
        z = _gamma_draw(0.5 * self.df, shape) * 2  # chi-squared with df degrees of freedom
        return self.loc + self.scale * x * (self.df / z).sqrt()

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        df = self.df
        y = (value - self.loc) / self.scale
        log_norm = (self.scale.log() + 0.5 * df.log() + 0.5 * math.log(math.pi)
                    + lgamma(0.5 * df) - lgamma(0.5 * (df + 1.0)))
        return -0.5 * (df + 1.0) * (y ** 2 / df).log1p() - log_norm

    def entropy(self) -> Tensor:
        df = self.df
        half = 0.5 * (df + 1)
        lbeta = lgamma(0.5 * df) + 0.5 * math.log(math.pi) - lgamma(half)
        return (self.scale.log() + half * (digamma(half) - digamma(0.5 * df))
                + 0.5 * df.log() + lbeta)


class Chi2(Gamma):
    """Chi-squared distribution of ``df`` (> 0) degrees of freedom: ``Gamma(df / 2, 1 / 2)``.

    Raises:
        ValueError: with validation, a ``df`` not > 0.

    Example:
        >>> Chi2(4.0).mean.item()
        4.0
    """

    arg_constraints = {"df": constraints.positive}
    _params = ("concentration", "rate", "df")  # what expand() expands

    def __init__(self, df: Any, validate_args: Optional[bool] = None) -> None:
        (df,) = broadcast_all(df)
        self._init_params((0.5 * df, 0.5, df), validate_args)


class FisherSnedecor(Distribution):
    """Fisher-Snedecor (F) distribution of ``df1`` and ``df2`` (> 0) degrees of freedom: the
    ratio of two scaled chi-squared draws (``rsample`` is differentiable in both).

    Raises:
        ValueError: with validation, a degree of freedom not > 0 or a value not > 0.

    Example:
        >>> FisherSnedecor(2.0, 6.0).mean.item()
        1.5
    """

    arg_constraints = {"df1": constraints.positive, "df2": constraints.positive}
    support = constraints.positive
    has_rsample = True
    _params = ("df1", "df2")  # what expand() expands

    def __init__(self, df1: Any, df2: Any, validate_args: Optional[bool] = None) -> None:
        self._init_params((df1, df2), validate_args)

    @property
    def mean(self) -> Tensor:
        d2 = self.df2
        return where(d2 > 2, d2 / where(d2 > 2, d2 - 2, 1.0), math.nan)

    @property
    def mode(self) -> Tensor:
        d1, d2 = self.df1, self.df2
        return where(d1 > 2, (d1 - 2) / d1 * d2 / (d2 + 2), math.nan)

    @property
    def variance(self) -> Tensor:
        d1, d2 = self.df1, self.df2
        ok = d2 > 4
        safe = where(ok, d2, 5.0)
        var = 2 * safe ** 2 * (d1 + safe - 2) / (d1 * (safe - 2) ** 2 * (safe - 4))
        return where(ok, var, math.nan)

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        tiny = _dt.finfo(self.df1.dtype).tiny
        x1 = (_gamma_draw(0.5 * self.df1, shape) / self.df1).clamp(min=tiny)
        x2 = (_gamma_draw(0.5 * self.df2, shape) / self.df2).clamp(min=tiny)
        return x1 / x2

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        h1, h2 = 0.5 * self.df1, 0.5 * self.df2
        ratio = self.df1 / self.df2
        return (lgamma(h1 + h2) - lgamma(h1) - lgamma(h2) + h1 * ratio.log()
                + (h1 - 1) * value.log() - (h1 + h2) * (ratio * value).log1p())


class InverseGamma(Distribution):
    """Inverse gamma distribution: ``1 / X`` for ``X ~ Gamma(concentration, rate)``.

    torch builds it as a ``TransformedDistribution``; here it is a family of its own with
    the same parameters, moments, density and (differentiable) ``rsample``.

    Raises:
        ValueError: with validation, a parameter not > 0 or a value not > 0.

    Example:
        >>> InverseGamma(3.0, 2.0).mean.item()
        1.0
    """

    _params, arg_constraints = Gamma._params, Gamma.arg_constraints  # Gamma's parameters
    support = constraints.positive
    has_rsample = True

    def __init__(self, concentration: Any, rate: Any,
                 validate_args: Optional[bool] = None) -> None:
        self._init_params((concentration, rate), validate_args)

    @property
    def base_dist(self) -> Gamma:
        """The gamma distribution whose reciprocal this is."""
        return Gamma(self.concentration, self.rate, validate_args=False)

    @property
    def mean(self) -> Tensor:
        c = self.concentration
        return where(c > 1, self.rate / where(c > 1, c - 1, 1.0), math.inf)

    @property
    def mode(self) -> Tensor:
        return self.rate / (self.concentration + 1)

    @property
    def variance(self) -> Tensor:
        c = self.concentration
        safe = where(c > 2, c, 3.0)
        return where(c > 2, self.rate ** 2 / ((safe - 1) ** 2 * (safe - 2)), math.inf)

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        return self.rate / _gamma_draw(self.concentration, shape)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        c, r = self.concentration, self.rate
        return c * r.log() - lgamma(c) - (c + 1) * value.log() - r / value

    def entropy(self) -> Tensor:
        c = self.concentration
        return c + self.rate.log() + lgamma(c) - (1 + c) * digamma(c)


def _log_i0(k: Tensor) -> Tensor:
    """``log I0(k)`` for ``k >= 0``, through the scaled Bessel function (no overflow)."""
    return _special.i0e(k).log() + k


def _von_mises_draw(loc: Tensor, conc: Tensor, shape: tuple) -> Tensor:
    """Von Mises draws of ``shape`` by Best and Fisher's rejection from a wrapped Cauchy
    envelope (in float64; ``loc``/``conc`` without gradient)."""
    k = conc.double().expand(*shape)
    tau = 1 + (1 + 4 * k * k).sqrt()
    rho_big = (tau - (2 * tau).sqrt()) / (2 * k.clamp(min=1e-300))
    rho = where(k < 1e-5, k / 2 + k ** 3 / 16 - 3 * k ** 5 / 64, rho_big)  # series at 0
    r = where(k < 1e-5, 1 / rho.clamp(min=1e-300), (1 + rho * rho) / (2 * rho.clamp(min=1e-300)))
    out = zeros_like(k)
    todo = ones_like(k, dtype=_dt.bool)
    while bool(todo.any()):
        u1, u2, u3 = (uniform_open(shape, k) for _ in range(3))
        z = (math.pi * u1).cos()
        f = (1 + r * z) / (r + z)
        c = k * (r - f)
        ok = (c * (2 - c) > u2) | ((c / u2).log() + 1 - c >= 0)
        theta = where(u3 > 0.5, f.clamp(-1, 1).acos(), -f.clamp(-1, 1).acos())
        take = ok & todo
        out = where(take, theta, out)
        todo = todo & ~ok
    x = (out + loc.double() + math.pi).remainder(2 * math.pi) - math.pi
    return x.to(loc.dtype)


class VonMises(CenteredAtLoc, Distribution):
    """Von Mises (circular normal) distribution of mean direction ``loc`` and concentration
    ``concentration`` (> 0), on the circle, values taken in [-pi, pi).

    ``sample`` uses a rejection sampler (no ``rsample``). ``log I0`` is computed from the
    scaled Bessel function ``special.i0e`` to full precision, where torch uses a polynomial
    approximation (relative error ~1e-7).

    Raises:
        ValueError: with validation, a ``concentration`` not > 0.

    Example:
        >>> VonMises(0.0, 1.0).mode.item()
        0.0
    """

    arg_constraints = {"loc": constraints.real, "concentration": constraints.positive}
    support = constraints.real
    has_rsample = False
    _params = ("loc", "concentration")  # what expand() expands

    def __init__(self, loc: Any, concentration: Any,
                 validate_args: Optional[bool] = None) -> None:
        self._init_params((loc, concentration), validate_args)

    @lazy_property
    def variance(self) -> Tensor:  # type: ignore[override]
        """The circular variance ``1 - I1(k) / I0(k)``."""
        k = self.concentration
        return 1 - _special.i1e(k) / _special.i0e(k)

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        return _von_mises_draw(self.loc.detach(), self.concentration.detach(), shape)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        k = self.concentration
        return k * (value - self.loc).cos() - math.log(2 * math.pi) - _log_i0(k)


class ContinuousBernoulli(ExponentialFamily):
    """Continuous Bernoulli distribution on [0, 1] (Loaiza-Ganem and Cunningham, 2019) of
    shape ``probs`` or ``logits``; ``rsample`` is reparameterised through :meth:`icdf`.

    Near ``probs = 0.5`` (inside ``lims``) the normaliser, the mean and the variance are taken
    from their Taylor series, as in torch.

    Args:
        probs: the parameter in [0, 1] (clamped off 0 and 1 by the dtype's eps).
        logits: its log odds (exactly one of the two).
        lims: the interval around 0.5 where the series are used.
        validate_args: see :class:`Distribution`.

    Raises:
        ValueError: both or neither of ``probs`` and ``logits``; with validation, ``probs``
            outside [0, 1] or a value outside [0, 1].

    Example:
        >>> round(ContinuousBernoulli(0.2).mean.item(), 6)
        0.388014
    """

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.unit_interval
    has_rsample = True
    _params = ("probs", "logits")  # what expand() expands

    def __init__(self, probs: Any = None, logits: Any = None,
                 lims: Tuple[float, float] = (0.499, 0.501),
                 validate_args: Optional[bool] = None) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("ContinuousBernoulli: pass either probs or logits, not both and "
                             "not neither")
        if probs is not None:
            (p,) = broadcast_all(probs)
            check = validate_args if validate_args is not None else Distribution._validate_args
            if check and not bool(constraints.unit_interval.check(p).all()):
                raise ValueError(f"ContinuousBernoulli: parameter probs must satisfy "
                                 f"{constraints.unit_interval!r}, but it has values outside "
                                 f"it; pass valid parameters (or validate_args=False)")
            self.probs = clamp_probs(p)  # its logs stay finite
        else:
            (self.logits,) = broadcast_all(logits)
        self._lims = lims
        shape = (self.probs if probs is not None else self.logits).shape
        super().__init__(shape, (), validate_args)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> ContinuousBernoulli:
        new = super().expand(batch_shape, _instance)
        new._lims = self._lims
        return new

    @lazy_property
    def logits(self) -> Tensor:
        """The log odds."""
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self) -> Tensor:
        """The parameter in (0, 1)."""
        return clamp_probs(logits_to_probs(self.logits, is_binary=True))

    @property
    def param_shape(self) -> Any:
        """The shape of the parameter."""
        return self.probs.shape

    def _outside_unstable_region(self) -> Tensor:
        return (self.probs <= self._lims[0]) | (self.probs > self._lims[1])

    def _cut_probs(self) -> Tensor:
        return where(self._outside_unstable_region(), self.probs, self._lims[0])

    def _cont_bern_log_norm(self) -> Tensor:
        """The log of the normaliser ``C(p)``, the density being ``C(p) p^x (1-p)^(1-x)``."""
        cut = self._cut_probs()
        below = where(cut <= 0.5, cut, 0.0)
        above = where(cut >= 0.5, cut, 1.0)
        log_norm = ((-cut).log1p() - cut.log()).abs().log() - where(
            cut <= 0.5, (-2.0 * below).log1p(), (2.0 * above - 1.0).log())
        x = (self.probs - 0.5) ** 2
        taylor = math.log(2.0) + (4.0 / 3.0 + 104.0 / 45.0 * x) * x
        return where(self._outside_unstable_region(), log_norm, taylor)

    @property
    def mean(self) -> Tensor:
        cut = self._cut_probs()
        mus = cut / (2.0 * cut - 1.0) + 1.0 / ((-cut).log1p() - cut.log())
        x = self.probs - 0.5
        taylor = 0.5 + (1.0 / 3.0 + 16.0 / 45.0 * x ** 2) * x
        return where(self._outside_unstable_region(), mus, taylor)

    @property
    def variance(self) -> Tensor:
        cut = self._cut_probs()
        var = (cut * (cut - 1.0) / (1.0 - 2.0 * cut) ** 2
               + 1.0 / ((-cut).log1p() - cut.log()) ** 2)
        x = (self.probs - 0.5) ** 2
        taylor = 1.0 / 12.0 - (1.0 / 15.0 - 128.0 / 945.0 * x) * x
        return where(self._outside_unstable_region(), var, taylor)

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        u = uniform(tuple(self._extended_shape(sample_shape)), self.probs)
        return self.icdf(u)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return value * logits - softplus(logits) + self._cont_bern_log_norm()

    def cdf(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        cut = self._cut_probs()
        cdfs = (cut ** value * (1.0 - cut) ** (1.0 - value) + cut - 1.0) / (2.0 * cut - 1.0)
        inner = where(self._outside_unstable_region(), cdfs, value)
        return where(value <= 0.0, 0.0, where(value >= 1.0, 1.0, inner))

    def icdf(self, value: Any) -> Tensor:
        cut = self._cut_probs()
        x = (((-cut + value * (2.0 * cut - 1.0)).log1p() - (-cut).log1p())
             / (cut.log() - (-cut).log1p()))
        return where(self._outside_unstable_region(), x, value)

    def entropy(self) -> Tensor:
        log_p0, log_p1 = (-self.probs).log1p(), self.probs.log()
        return self.mean * (log_p0 - log_p1) - self._cont_bern_log_norm() - log_p0

    @property
    def _natural_params(self) -> Tuple[Tensor, ...]:
        return (self.logits,)

    def _log_normalizer(self, x: Tensor) -> Tensor:
        """``log((exp(x) - 1) / x)``, by its series near 0."""
        small = x.abs() < 5e-4
        safe = where(small, ones_like(x), x)
        exact = (safe.exp() - 1).abs().log() - safe.abs().log()
        taylor = 0.5 * x + x ** 2 / 24.0 - x ** 4 / 2880.0
        return where(small, taylor, exact)

    @property
    def _mean_carrier_measure(self) -> Any:
        return 0.0


def _isclose_zero(c: Tensor) -> Tensor:
    return c.abs() <= 1e-8  # torch's isclose(c, 0) with its default tolerances


class GeneralizedPareto(Distribution):
    """Generalized Pareto distribution of location ``loc``, scale ``scale`` (> 0) and shape
    ``concentration``: support ``[loc, inf)`` for ``concentration >= 0``, else
    ``[loc, loc - scale / concentration]``; ``rsample`` goes through :meth:`icdf`.

    Raises:
        ValueError: with validation, a ``scale`` not > 0 or a value outside the support.

    Example:
        >>> GeneralizedPareto(0.0, 1.0, 0.0).mean.item()
        1.0
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive,
                       "concentration": constraints.real}
    has_rsample = True
    _params = ("loc", "scale", "concentration")  # what expand() expands

    def __init__(self, loc: Any, scale: Any, concentration: Any,
                 validate_args: Optional[bool] = None) -> None:
        self._init_params((loc, scale, concentration), validate_args)

    @property
    def support(self) -> constraints.Constraint:  # type: ignore[override]
        """``[loc, upper]``, the upper end infinite unless ``concentration < 0``."""
        c = self.concentration
        upper = where(c < 0, self.loc - self.scale / where(c < 0, c, -1.0), math.inf)
        return constraints.interval(self.loc, upper)

    def _safe_conc(self) -> Tuple[Tensor, Tensor]:
        zero = _isclose_zero(self.concentration)
        return zero, where(zero, ones_like(self.concentration), self.concentration)

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        return self.icdf(uniform(tuple(self._extended_shape(sample_shape)), self.loc))

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        z = (value - self.loc) / self.scale
        zero, c = self._safe_conc()
        y = 1 / c + ones_like(z)
        nonzero = where(y == 0, y, y * (c * z).log1p())
        return -self.scale.log() - where(zero, z, nonzero)

    def log_survival_function(self, value: Any) -> Tensor:
        """``log(1 - cdf(value))``."""
        if self._validate_args:
            self._validate_sample(value)
        z = (value - self.loc) / self.scale
        zero, c = self._safe_conc()
        return where(zero, -z, -(c * z).log1p() / c)

    def log_cdf(self, value: Any) -> Tensor:
        """``log(cdf(value))``."""
        return (-self.log_survival_function(value).exp()).log1p()

    def cdf(self, value: Any) -> Tensor:
        return self.log_cdf(value).exp()

    def icdf(self, value: Any) -> Tensor:
        zero, c = self._safe_conc()
        logu = (-value).log1p()
        return where(zero, self.loc - self.scale * logu,
                     self.loc + self.scale / c * (-c * logu).expm1())

    @property
    def mean(self) -> Tensor:
        c = self.concentration
        safe = where(c < 1, c, 0.5)
        return where(c < 1, self.loc + self.scale / (1 - safe), math.nan)

    @property
    def variance(self) -> Tensor:
        c = self.concentration
        safe = where(c < 0.5, c, 0.25)
        return where(c < 0.5, self.scale ** 2 / ((1 - safe) ** 2 * (1 - 2 * safe)), math.nan)

    @property
    def mode(self) -> Tensor:
        return self.loc

    def entropy(self) -> Tensor:
        return (self.scale.log() + self.concentration + 1).expand(*self._batch_shape)


def _cov_diag_solve(cov_diag: Tensor, cov_factor: Tensor) -> Tensor:
    """``D^-1 W`` for the diagonal ``D`` and the factor ``W`` (n x r)."""
    return cov_factor / cov_diag.unsqueeze(-1)


class LowRankMultivariateNormal(CenteredAtLoc, Distribution):
    """Multivariate normal whose covariance is ``W W^T + diag(D)`` with ``W = cov_factor``
    (``batch + (n, r)``) and ``D = cov_diag`` (``batch + (n,)``, > 0).

    ``log_prob`` and ``entropy`` use the Woodbury identity and the matrix determinant lemma
    through the r x r capacitance ``C = I + W^T D^-1 W`` (its Cholesky factor), so they cost
    O(n r^2), not O(n^3).

    Raises:
        ValueError: shapes that do not fit; with validation, a ``cov_diag`` not > 0.

    Example:
        >>> import mpitensor as mt
        >>> d = LowRankMultivariateNormal(mt.zeros(3), mt.ones(3, 1), mt.ones(3))
        >>> d.variance.tolist()
        [2.0, 2.0, 2.0]
    """

    arg_constraints = {"loc": constraints.real_vector,
                       "cov_factor": constraints.independent(constraints.real, 2),
                       "cov_diag": constraints.independent(constraints.positive, 1)}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc: Tensor, cov_factor: Tensor, cov_diag: Tensor,
                 validate_args: Optional[bool] = None) -> None:
        if loc.dim() < 1 or cov_factor.dim() < 2 or cov_diag.dim() < 1:
            raise ValueError("LowRankMultivariateNormal: loc and cov_diag need at least one "
                             "dimension and cov_factor two")
        n = loc.shape[-1]
        if cov_factor.shape[-2] != n or cov_diag.shape[-1] != n:
            raise ValueError(f"LowRankMultivariateNormal: cov_factor must be (..., {n}, r) "
                             f"and cov_diag (..., {n}) for loc (..., {n}); got "
                             f"{tuple(cov_factor.shape)} and {tuple(cov_diag.shape)}")
        r = cov_factor.shape[-1]
        batch = tuple(broadcast_shapes(tuple(loc.shape[:-1]), tuple(cov_factor.shape[:-2]),
                                       tuple(cov_diag.shape[:-1])))
        self.loc = loc.expand(*batch, n)
        self.cov_factor = cov_factor.expand(*batch, n, r)
        self.cov_diag = cov_diag.expand(*batch, n)
        self._unbroadcasted_cov_factor = cov_factor
        self._unbroadcasted_cov_diag = cov_diag
        super().__init__(batch, (n,), validate_args)
        self._capacitance_tril = self._capacitance(cov_factor, cov_diag)

    @staticmethod
    def _capacitance(w: Tensor, d: Tensor) -> Tensor:
        """The lower Cholesky factor of ``I + W^T D^-1 W``."""
        r = w.shape[-1]
        k = w.mT @ _cov_diag_solve(d, w)
        eye = _eye_like(w, r)
        return _Cholesky.apply(k + eye)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> Any:
        new = _instance if _instance is not None else type(self).__new__(type(self))
        shape = tuple(_size(batch_shape))
        n, r = self.cov_factor.shape[-2:]
        new.loc = self.loc.expand(*shape, n)
        new.cov_factor = self.cov_factor.expand(*shape, n, r)
        new.cov_diag = self.cov_diag.expand(*shape, n)
        new._unbroadcasted_cov_factor = self._unbroadcasted_cov_factor
        new._unbroadcasted_cov_diag = self._unbroadcasted_cov_diag
        new._capacitance_tril = self._capacitance_tril
        return _expanded(new, self, shape)

    @lazy_property
    def variance(self) -> Tensor:  # type: ignore[override]
        """The diagonal of the covariance."""
        w, d = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        return ((w ** 2).sum(-1) + d).expand(*self._batch_shape, *self._event_shape)

    @lazy_property
    def covariance_matrix(self) -> Tensor:
        """``W W^T + diag(D)``."""
        w, d = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        n = self._event_shape[0]
        cov = w @ w.mT + d.unsqueeze(-1) * _eye_like(d, n)
        return cov.expand(*self._batch_shape, n, n)

    @lazy_property
    def precision_matrix(self) -> Tensor:
        """The inverse covariance, by Woodbury: ``D^-1 - D^-1 W C^-1 W^T D^-1``."""
        w, d = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        n = self._event_shape[0]
        a = _SolveLower.apply(self._capacitance_tril, _cov_diag_solve(d, w).mT)
        prec = (1 / d).unsqueeze(-1) * _eye_like(d, n) - a.mT @ a
        return prec.expand(*self._batch_shape, n, n)

    @lazy_property
    def scale_tril(self) -> Tensor:
        """The lower Cholesky factor of the covariance."""
        return _Cholesky.apply(self.covariance_matrix)

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        w = self._unbroadcasted_cov_factor
        eps_w = normal((*shape[:-1], w.shape[-1]), self.loc)
        eps_d = normal(shape, self.loc)
        return (self.loc + (w @ eps_w.unsqueeze(-1)).squeeze(-1)
                + self._unbroadcasted_cov_diag.sqrt() * eps_d)

    def _log_det(self) -> Tensor:
        c = self._capacitance_tril
        return (2 * c.diagonal(dim1=-2, dim2=-1).log().sum(-1)
                + self._unbroadcasted_cov_diag.log().sum(-1))

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        diff = value - self.loc
        w, d = self._unbroadcasted_cov_factor, self._unbroadcasted_cov_diag
        wt_dinv_x = (_cov_diag_solve(d, w).mT @ diff.unsqueeze(-1))  # (..., r, 1)
        y = _SolveLower.apply(self._capacitance_tril, wt_dinv_x).squeeze(-1)
        maha = (diff ** 2 / d).sum(-1) - (y ** 2).sum(-1)
        n = self._event_shape[0]
        return -0.5 * (n * 2 * LOG_SQRT_2PI + maha + self._log_det())

    def entropy(self) -> Tensor:
        n = self._event_shape[0]
        h = 0.5 * (n * (1.0 + 2 * LOG_SQRT_2PI) + self._log_det())
        return h.expand(*self._batch_shape) if self._batch_shape else h


def _eye_like(t: Tensor, n: int) -> Tensor:
    return eye(n, dtype=t.dtype, device=t.device)
