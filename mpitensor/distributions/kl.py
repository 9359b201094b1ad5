"""Kullback-Leibler divergence between distributions: :func:`kl_divergence` and the
:func:`register_kl` decorator that adds a pair of families.

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.distributions import Normal
    >>> kl_divergence(Normal(0.0, 1.0), Normal(0.0, 1.0)).item()
    0.0
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Tuple

from mpitensor.tensor import Tensor, digamma, full, lgamma, where

from ._common import softplus
from .bernoulli import Bernoulli
from .categorical import Categorical, OneHotCategorical
from .continuous_more import (
    Cauchy,
    ContinuousBernoulli,
    ExponentialFamily,
    LowRankMultivariateNormal,
)
from .discrete_more import Binomial, Geometric
from .distribution import Distribution
from .gamma import Beta, Dirichlet, Gamma
from .independent import Independent, _sum_right
from .laplace import Exponential, Laplace
from .multivariate_normal import MultivariateNormal, _batch_mahalanobis, _SolveLower
from .normal import Normal
from .poisson import Poisson
from .uniform import Uniform

__all__ = ["kl_divergence", "register_kl"]

_KL: Dict[Tuple[type, type], Callable] = {}


def register_kl(type_p: type, type_q: type) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn(p, q)`` as the KL divergence of a ``type_p`` from a ``type_q``.

    The most specific registered pair (by the classes' method resolution orders) is used.

    Raises:
        TypeError: a type that is not a subclass of :class:`Distribution`.

    Example:
        >>> @register_kl(Normal, Normal)
        ... def my_kl(p, q): ...
        >>> _ = _KL.pop((Normal, Normal)); _KL[(Normal, Normal)] = _kl_normal_normal
    """
    for t in (type_p, type_q):
        if not (isinstance(t, type) and issubclass(t, Distribution)):
            raise TypeError(f"register_kl() takes Distribution subclasses, got {t!r}")

    def deco(fn: Callable) -> Callable:
        _KL[(type_p, type_q)] = fn
        return fn

    return deco


def _lookup(tp: type, tq: type) -> Callable:
    best, rank = None, None
    for (a, b), fn in _KL.items():
        if issubclass(tp, a) and issubclass(tq, b):
            r = (tp.__mro__.index(a), tq.__mro__.index(b))
            if rank is None or r < rank:
                best, rank = fn, r
    if best is None:
        raise NotImplementedError(f"no KL divergence is registered for {tp.__name__} and "
                                  f"{tq.__name__}; register one with @register_kl")
    return best


def kl_divergence(p: Distribution, q: Distribution) -> Tensor:
    """Return KL(p || q), one number per batch element.

    Raises:
        NotImplementedError: no function is registered for the pair of types.
    """
    return _lookup(type(p), type(q))(p, q)


def _inf_where(mask: Tensor, t: Tensor) -> Tensor:
    return where(mask, math.inf, t)


@register_kl(Normal, Normal)
def _kl_normal_normal(p: Normal, q: Normal) -> Tensor:
    var_ratio = (p.scale / q.scale) ** 2
    t1 = ((p.loc - q.loc) / q.scale) ** 2
    return 0.5 * (var_ratio + t1 - 1 - var_ratio.log())


@register_kl(Categorical, Categorical)
def _kl_categorical_categorical(p: Categorical, q: Categorical) -> Tensor:
    t = p.probs * (p.logits - q.logits)
    zero_q = (q.probs == 0).expand(*t.shape)
    t = _inf_where(zero_q, t)
    t = where((p.probs == 0).expand(*t.shape), 0.0, t)
    return t.sum(-1)


@register_kl(OneHotCategorical, OneHotCategorical)
def _kl_onehot_onehot(p: OneHotCategorical, q: OneHotCategorical) -> Tensor:
    return _kl_categorical_categorical(p._categorical, q._categorical)


@register_kl(Bernoulli, Bernoulli)
def _kl_bernoulli_bernoulli(p: Bernoulli, q: Bernoulli) -> Tensor:
    pp, qp = p.probs, q.probs
    t1 = pp * (softplus(-q.logits) - softplus(-p.logits))
    t1 = where(pp == 0, 0.0, _inf_where(qp == 0, t1))
    t2 = (1 - pp) * (softplus(q.logits) - softplus(p.logits))
    t2 = where(pp == 1, 0.0, _inf_where(qp == 1, t2))
    return t1 + t2


@register_kl(Uniform, Uniform)
def _kl_uniform_uniform(p: Uniform, q: Uniform) -> Tensor:
    r = ((q.high - q.low) / (p.high - p.low)).log()
    return _inf_where((q.low > p.low) | (q.high < p.high), r)


@register_kl(Exponential, Exponential)
def _kl_exponential_exponential(p: Exponential, q: Exponential) -> Tensor:
    ratio = q.rate / p.rate
    return -ratio.log() + ratio - 1


@register_kl(Laplace, Laplace)
def _kl_laplace_laplace(p: Laplace, q: Laplace) -> Tensor:
    scale_ratio = p.scale / q.scale
    d = (p.loc - q.loc).abs()
    return -scale_ratio.log() + d / q.scale + scale_ratio * (-d / p.scale).exp() - 1


@register_kl(Gamma, Gamma)
def _kl_gamma_gamma(p: Gamma, q: Gamma) -> Tensor:
    pc, qc, pr, qr = p.concentration, q.concentration, p.rate, q.rate
    return (qc * (pr / qr).log() + lgamma(qc) - lgamma(pc) + (pc - qc) * digamma(pc)
            + (qr - pr) * (pc / pr))


def _kl_dirichlet_concentrations(pc: Tensor, qc: Tensor) -> Tensor:
    sp, sq = pc.sum(-1), qc.sum(-1)
    t1 = lgamma(sp) - lgamma(sq)
    t2 = (lgamma(pc) - lgamma(qc)).sum(-1)
    t4 = digamma(pc) - digamma(sp).unsqueeze(-1)
    return t1 - t2 + ((pc - qc) * t4).sum(-1)


@register_kl(Dirichlet, Dirichlet)
def _kl_dirichlet_dirichlet(p: Dirichlet, q: Dirichlet) -> Tensor:
    return _kl_dirichlet_concentrations(p.concentration, q.concentration)


@register_kl(Beta, Beta)
def _kl_beta_beta(p: Beta, q: Beta) -> Tensor:
    return _kl_dirichlet_concentrations(p._dirichlet_concentration, q._dirichlet_concentration)


@register_kl(Poisson, Poisson)
def _kl_poisson_poisson(p: Poisson, q: Poisson) -> Tensor:
    return p.rate * (p.rate.log() - q.rate.log()) - (p.rate - q.rate)


@register_kl(Independent, Independent)
def _kl_independent_independent(p: Independent, q: Independent) -> Any:
    if p.reinterpreted_batch_ndims != q.reinterpreted_batch_ndims:
        raise NotImplementedError("kl_divergence of Independent distributions with different "
                                  "reinterpreted_batch_ndims is not implemented")
    return _sum_right(kl_divergence(p.base_dist, q.base_dist), p.reinterpreted_batch_ndims)


@register_kl(MultivariateNormal, MultivariateNormal)
def _kl_mvn_mvn(p: MultivariateNormal, q: MultivariateNormal) -> Tensor:
    if p.event_shape != q.event_shape:
        raise ValueError(f"kl_divergence: MultivariateNormals of different event shapes "
                         f"{tuple(p.event_shape)} and {tuple(q.event_shape)}")
    lp, lq = p._unbroadcasted_scale_tril, q._unbroadcasted_scale_tril
    half_log_det = (lq.diagonal(dim1=-2, dim2=-1).log().sum(-1)
                    - lp.diagonal(dim1=-2, dim2=-1).log().sum(-1))
    trace = (_SolveLower.apply(lq, lp) ** 2).sum((-2, -1))  # tr(Sq^-1 Sp) = |Lq^-1 Lp|_F^2
    maha = _batch_mahalanobis(lq, q.loc - p.loc)
    return half_log_det + 0.5 * (trace + maha - p.event_shape[0])


# -- the families of continuous_more and discrete_more --------------------------------------


@register_kl(Binomial, Binomial)
def _kl_binomial_binomial(p: Binomial, q: Binomial) -> Tensor:
    if bool((p.total_count < q.total_count).any()):
        raise NotImplementedError("kl_divergence of Binomials where q.total_count > "
                                  "p.total_count is not implemented")
    kl = p.total_count * _kl_bernoulli_bernoulli(p, q)  # n trials, each a Bernoulli KL
    return _inf_where(p.total_count > q.total_count, kl)


@register_kl(Geometric, Geometric)
def _kl_geometric_geometric(p: Geometric, q: Geometric) -> Tensor:
    # E_p[log p] = -H(p); E_p[log q] = E_p[x] log(1 - q) + log q
    return -p.entropy() - (-q.probs).log1p() / p.probs - q.logits


@register_kl(Cauchy, Cauchy)
def _kl_cauchy_cauchy(p: Cauchy, q: Cauchy) -> Tensor:
    num = (p.scale + q.scale) ** 2 + (p.loc - q.loc) ** 2
    return (num / (4 * p.scale * q.scale)).log()


@register_kl(ContinuousBernoulli, ContinuousBernoulli)
def _kl_cb_cb(p: ContinuousBernoulli, q: ContinuousBernoulli) -> Tensor:
    t1 = p.mean * (p.logits - q.logits)
    t2 = p._cont_bern_log_norm() + (-p.probs).log1p()
    t3 = -q._cont_bern_log_norm() - (-q.probs).log1p()
    return t1 + t2 + t3


def _gaussian_log_det(d: Any) -> Tensor:
    if isinstance(d, LowRankMultivariateNormal):
        return d._log_det()
    return 2 * d._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)


def _kl_gaussians(p: Any, q: Any) -> Tensor:
    """KL of two multivariate normals, either kind, through q's precision and p's covariance
    (dense n x n products; q's precision is a Woodbury product for a low-rank q)."""
    if p.event_shape != q.event_shape:
        raise ValueError(f"kl_divergence: multivariate normals of different event shapes "
                         f"{tuple(p.event_shape)} and {tuple(q.event_shape)}")
    prec = q.precision_matrix
    diff = (q.loc - p.loc).unsqueeze(-1)
    trace = (prec * p.covariance_matrix).sum((-2, -1))
    maha = (diff.mT @ prec @ diff).squeeze(-1).squeeze(-1)
    return 0.5 * (trace + maha - p.event_shape[0] + _gaussian_log_det(q)
                  - _gaussian_log_det(p))


register_kl(LowRankMultivariateNormal, LowRankMultivariateNormal)(_kl_gaussians)
register_kl(LowRankMultivariateNormal, MultivariateNormal)(_kl_gaussians)
register_kl(MultivariateNormal, LowRankMultivariateNormal)(_kl_gaussians)


# -- ContinuousBernoulli against the other families (support [0, 1]) ------------------------


def _minus_cross_entropy_cb(p: Distribution, q: ContinuousBernoulli) -> Tensor:
    """``-H(p) - E_p[log q]`` for a ContinuousBernoulli q: ``log q(x)`` is linear in x."""
    return (-p.entropy() - p.mean * q.logits - (-q.probs).log1p()
            - q._cont_bern_log_norm())


@register_kl(Beta, ContinuousBernoulli)
def _kl_beta_cb(p: Beta, q: ContinuousBernoulli) -> Tensor:
    return _minus_cross_entropy_cb(p, q)


@register_kl(Uniform, ContinuousBernoulli)
def _kl_uniform_cb(p: Uniform, q: ContinuousBernoulli) -> Tensor:
    return _inf_where((p.high > 1) | (p.low < 0), _minus_cross_entropy_cb(p, q))


@register_kl(ContinuousBernoulli, Exponential)
def _kl_cb_exponential(p: ContinuousBernoulli, q: Exponential) -> Tensor:
    return -p.entropy() - q.rate.log() + q.rate * p.mean


@register_kl(ContinuousBernoulli, Normal)
def _kl_cb_normal(p: ContinuousBernoulli, q: Normal) -> Tensor:
    second_moment = p.variance + (p.mean - q.loc) ** 2  # E_p[(x - loc)^2]
    return (-p.entropy() + 0.5 * math.log(2 * math.pi) + q.scale.log()
            + second_moment / (2 * q.scale ** 2))


@register_kl(ContinuousBernoulli, Uniform)
def _kl_cb_uniform(p: ContinuousBernoulli, q: Uniform) -> Tensor:
    return _inf_where((q.low > 0) | (q.high < 1), -p.entropy() + (q.high - q.low).log())


def _kl_infinite(p: Distribution, q: Distribution) -> Tensor:
    """p puts mass where q has none: the divergence is infinite (one per batch element)."""
    like = p.mean
    return full(tuple(p.batch_shape), math.inf, dtype=like.dtype, device=like.device)


for _p in (Exponential, Gamma, Laplace, Normal):  # supports beyond [0, 1]
    register_kl(_p, ContinuousBernoulli)(_kl_infinite)
register_kl(Poisson, Binomial)(_kl_infinite)  # unbounded counts against at most n


@register_kl(ExponentialFamily, ExponentialFamily)
def _kl_expfamily_expfamily(p: ExponentialFamily, q: ExponentialFamily) -> Tensor:
    """The Bregman divergence of the log-normalizer ``F``:
    ``F(theta_q) - F(theta_p) - <theta_q - theta_p, grad F(theta_p)>`` (a value only, as
    :meth:`ExponentialFamily.entropy`).

    Raises:
        NotImplementedError: p and q of different families; gradients recorded and a
            parameter that requires grad.
    """
    if type(p) is not type(q):
        raise NotImplementedError(f"kl_divergence: {type(p).__name__} and {type(q).__name__} "
                                  f"are different exponential families; the Bregman form "
                                  f"needs one family")
    q_params = q._natural_params
    lg, p_params, grads = p._log_normalizer_and_grad("kl_divergence()", p._natural_params,
                                                     q_params)
    result = q._log_normalizer(*q_params) - lg
    for pp, qp, g in zip(p_params, q_params, grads):
        result = result - _sum_right((qp - pp) * g, len(q.event_shape))
    return result
