"""Probability distributions with the API of ``torch.distributions``.

Families: :class:`Categorical`, :class:`OneHotCategorical`, :class:`Bernoulli`,
:class:`Normal`, :class:`Uniform`, :class:`Laplace`, :class:`Exponential`, :class:`Gamma`,
:class:`Beta`, :class:`Dirichlet`, :class:`Poisson`, :class:`MultivariateNormal`, and the
:class:`Independent` wrapper; :func:`kl_divergence` with :func:`register_kl`; the
:mod:`constraints` objects. Everything is composed of differentiable tensor ops, so a
policy-gradient loss such as ``-dist.log_prob(action) * reward`` backpropagates into the
parameters.

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.distributions import Categorical
    >>> logits = mt.zeros(3, requires_grad=True)
    >>> (-Categorical(logits=logits).log_prob(mt.tensor(1))).backward()
    >>> [round(g, 4) for g in logits.grad.tolist()]
    [0.3333, -0.6667, 0.3333]
"""

from __future__ import annotations

from . import (
    constraint_registry,
    constraints,
    continuous_more,
    discrete_more,
    kl,
    transformed_distribution,
    transforms,
)
from .bernoulli import Bernoulli
from .categorical import Categorical, OneHotCategorical
from .constraint_registry import *  # noqa: F403 - biject_to, transform_to
from .continuous_more import *  # noqa: F403
from .discrete_more import *  # noqa: F403
from .distribution import Distribution
from .gamma import Beta, Dirichlet, Gamma
from .independent import Independent
from .kl import kl_divergence, register_kl
from .laplace import Exponential, Laplace
from .multivariate_normal import MultivariateNormal
from .normal import Normal
from .poisson import Poisson
from .transformed_distribution import *  # noqa: F403
from .transforms import *  # noqa: F403
from .uniform import Uniform

__all__ = [
    "Distribution", "Categorical", "OneHotCategorical", "Bernoulli", "Normal", "Uniform",
    "Laplace", "Exponential", "Gamma", "Beta", "Dirichlet", "Poisson", "MultivariateNormal",
    "Independent", "kl_divergence", "register_kl", "constraints", "kl", "transforms",
    "constraint_registry", *constraint_registry.__all__, *continuous_more.__all__,
    *discrete_more.__all__, *transformed_distribution.__all__, *transforms.__all__,
]
