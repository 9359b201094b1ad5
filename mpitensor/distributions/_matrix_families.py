"""Distributions over matrices: :class:`Wishart` (positive definite matrices) and
:class:`LKJCholesky` (Cholesky factors of correlation matrices). Exported by
:mod:`continuous_more`.

Wishart draws use Bartlett's decomposition: ``X = L A A^T L^T`` with ``L`` the scale's
Cholesky factor and ``A`` lower triangular, chi-distributed on the diagonal (``sqrt`` of
chi-squared draws of ``df - i`` degrees of freedom) and standard normal below it; the
chi-squared draws are gamma draws, so ``rsample`` is differentiable in ``df`` too.
LKJCholesky draws use the onion method (Lewandowski, Kurowicka and Joe, 2009, section 3.2):
row k is a direction on the sphere of R^k scaled by the square root of a Beta(k / 2, .) draw,
so every correlation has the same marginal law (torch 2.13's sampler uses Beta((2k - 1) / 2,
.) for the rows below the second, which skews the later rows; see tests).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from mpitensor import dtypes as _dt
from mpitensor import linalg as _linalg
from mpitensor.tensor import (
    Tensor,
    arange,
    as_tensor,
    broadcast_shapes,
    digamma,
)

from . import constraints
from ._common import normal
from .distribution import Distribution, ShapeLike, _expanded, _size, lazy_property
from .gamma import Beta, _gamma_draw
from .multivariate_normal import _Cholesky, _SolveLower

__all__ = ["Wishart", "LKJCholesky"]


def _log_diag_sum(tril: Tensor) -> Tensor:
    return tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)


def _mvdigamma(x: Tensor, p: int) -> Tensor:
    """The multivariate digamma ``sum_{i < p} digamma(x - i / 2)``."""
    offsets = as_tensor([-0.5 * i for i in range(p)], dtype=x.dtype, device=x.device)
    return digamma(x.unsqueeze(-1) + offsets).sum(-1)


class Wishart(Distribution):
    """Wishart distribution of ``df`` degrees of freedom (> p - 1) and scale given by one of
    ``covariance_matrix``, ``precision_matrix`` or ``scale_tril`` (p x p); ``rsample`` is
    reparameterised (Bartlett's decomposition).

    Raises:
        ValueError: not exactly one matrix; a matrix that is not square; ``df <= p - 1``;
            with validation, a matrix that is not positive definite (or lower Cholesky).

    Example:
        >>> import mpitensor as mt
        >>> Wishart(mt.tensor(4.0), covariance_matrix=mt.eye(2)).mean.tolist()
        [[4.0, 0.0], [0.0, 4.0]]
    """

    arg_constraints = {"covariance_matrix": constraints.positive_definite,
                       "precision_matrix": constraints.positive_definite,
                       "scale_tril": constraints.lower_cholesky,
                       "df": constraints.greater_than(0)}
    support = constraints.positive_definite
    has_rsample = True

    def __init__(self, df: Any, covariance_matrix: Optional[Tensor] = None,
                 precision_matrix: Optional[Tensor] = None, scale_tril: Optional[Tensor] = None,
                 validate_args: Optional[bool] = None) -> None:
        given = [m for m in (covariance_matrix, precision_matrix, scale_tril) if m is not None]
        if len(given) != 1:
            raise ValueError("Wishart: pass exactly one of covariance_matrix, "
                             "precision_matrix and scale_tril")
        m = given[0]
        if m.dim() < 2 or m.shape[-1] != m.shape[-2]:
            raise ValueError(f"Wishart: the matrix must be of shape (..., p, p), got "
                             f"{tuple(m.shape)}")
        p = m.shape[-1]
        df = df if isinstance(df, Tensor) else as_tensor(float(df), dtype=m.dtype,
                                                          device=m.device)
        batch = tuple(broadcast_shapes(tuple(m.shape[:-2]), tuple(df.shape)))
        self.df = df.expand(*batch)
        if bool((self.df <= p - 1).any()):
            raise ValueError(f"Wishart: df must be greater than p - 1 = {p - 1}, got values "
                             f"{self.df.tolist()}")
        if scale_tril is not None:
            self.scale_tril = scale_tril.expand(*batch, p, p)
        elif covariance_matrix is not None:
            self.covariance_matrix = covariance_matrix.expand(*batch, p, p)
        else:
            self.precision_matrix = precision_matrix.expand(*batch, p, p)
        super().__init__(batch, (p, p), validate_args)
        if scale_tril is not None:
            self._unbroadcasted_scale_tril = scale_tril
        else:
            cov = covariance_matrix if covariance_matrix is not None else _linalg.inv(m)
            self._unbroadcasted_scale_tril = _Cholesky.apply(cov)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> Wishart:
        new = _instance if _instance is not None else type(self).__new__(type(self))
        shape = tuple(_size(batch_shape))
        p = self._event_shape[-1]
        new.df = self.df.expand(*shape)
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril
        for k in ("covariance_matrix", "scale_tril", "precision_matrix"):
            if k in self.__dict__:
                setattr(new, k, self.__dict__[k].expand(*shape, p, p))
        return _expanded(new, self, shape)

    @lazy_property
    def scale_tril(self) -> Tensor:
        """The lower Cholesky factor of the scale matrix."""
        return self._unbroadcasted_scale_tril.expand(*self._batch_shape, *self._event_shape)

    @lazy_property
    def covariance_matrix(self) -> Tensor:
        """The scale matrix."""
        L = self._unbroadcasted_scale_tril  # noqa: N806 - a matrix
        return (L @ L.mT).expand(*self._batch_shape, *self._event_shape)

    @lazy_property
    def precision_matrix(self) -> Tensor:
        """The inverse of the scale matrix."""
        L = self._unbroadcasted_scale_tril  # noqa: N806 - a matrix
        return _linalg.inv(L @ L.mT).expand(*self._batch_shape, *self._event_shape)

    def _df(self) -> Tensor:
        return self.df.unsqueeze(-1).unsqueeze(-1)

    @property
    def mean(self) -> Tensor:
        return self._df() * self.covariance_matrix

    @property
    def mode(self) -> Tensor:
        factor = self.df - self._event_shape[-1] - 1
        factor = factor.masked_fill(factor <= 0, math.nan)
        return factor.unsqueeze(-1).unsqueeze(-1) * self.covariance_matrix

    @property
    def variance(self) -> Tensor:
        v = self.covariance_matrix
        d = v.diagonal(dim1=-2, dim2=-1)
        return self._df() * (v ** 2 + d.unsqueeze(-1) * d.unsqueeze(-2))

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        p = self._event_shape[-1]
        lead = shape[:-2]
        df = self.df.expand(*lead)
        # chi-squared draws of df - i degrees of freedom on the diagonal (Bartlett)
        dof = df.unsqueeze(-1) - arange(p, dtype=df.dtype, device=df.device)
        chi = (_gamma_draw(0.5 * dof, (*lead, p)) * 2).sqrt()
        a = normal(shape, self.df).tril(-1) + chi.diag_embed()
        la = self._unbroadcasted_scale_tril @ a
        return la @ la.mT

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        nu, p = self.df, self._event_shape[-1]
        lv = _Cholesky.apply(value)
        # tr(S^-1 X) = |L^-1 chol(X)|_F^2
        trace = (_SolveLower.apply(self._unbroadcasted_scale_tril, lv) ** 2).sum((-2, -1))
        return (-nu * (p * math.log(2) / 2 + _log_diag_sum(self._unbroadcasted_scale_tril))
                - (nu / 2).mvlgamma(p) + (nu - p - 1) * _log_diag_sum(lv) - trace / 2)

    def entropy(self) -> Tensor:
        nu, p = self.df, self._event_shape[-1]
        return ((p + 1) * (p * math.log(2) / 2 + _log_diag_sum(self._unbroadcasted_scale_tril))
                + (nu / 2).mvlgamma(p) - (nu - p - 1) / 2 * _mvdigamma(nu / 2, p) + nu * p / 2)


class LKJCholesky(Distribution):
    """LKJ distribution over lower Cholesky factors of ``dim x dim`` correlation matrices,
    of ``concentration`` (> 0; 1 is uniform over correlation matrices).

    Raises:
        ValueError: ``dim < 2``; with validation, a concentration not > 0.

    Example:
        >>> LKJCholesky(3, 1.0).sample().shape
        mpitensor.Size([3, 3])
    """

    arg_constraints = {"concentration": constraints.positive}
    support = constraints.corr_cholesky

    def __init__(self, dim: int, concentration: Any = 1.0,
                 validate_args: Optional[bool] = None) -> None:
        if dim < 2:
            raise ValueError(f"LKJCholesky: dim must be at least 2, got {dim}")
        self.dim = dim
        c = concentration if isinstance(concentration, Tensor) else as_tensor(
            float(concentration), dtype=_dt.get_default_dtype())
        self.concentration = c
        super().__init__(c.shape, (dim, dim), validate_args)
        self._beta = self._marginal_betas()

    def _marginal_betas(self) -> Beta:
        """The beta laws of the squared norms of the rows' off-diagonal parts (onion)."""
        c = self.concentration
        marginal = c + 0.5 * (self.dim - 2)
        # row k (k >= 1) is sqrt(y) times a direction in R^k, y ~ Beta(k / 2, marginal -
        # (k - 1) / 2); row 0 is (1, 0, ...) whatever its draw
        k = arange(self.dim, dtype=c.dtype, device=c.device)
        offset = (k - 1).clamp(min=0)
        return Beta((k / 2).clamp(min=0.5), marginal.unsqueeze(-1) - 0.5 * offset,
                    validate_args=False)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> LKJCholesky:
        new = _instance if _instance is not None else type(self).__new__(type(self))
        shape = tuple(_size(batch_shape))
        new.dim = self.dim
        new.concentration = self.concentration.expand(*shape)
        new._beta = self._beta.expand((*shape, self.dim))
        return _expanded(new, self, shape)

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        shape = tuple(self._extended_shape(sample_shape))
        y = self._beta.sample(sample_shape).unsqueeze(-1).detach()
        u = normal(shape, self.concentration).tril(-1)
        norm = (u ** 2).sum(-1, keepdim=True).sqrt()
        first = arange(self.dim, device=u.device).reshape(-1, 1) == 0
        u = (u / norm.masked_fill(norm == 0, 1.0)).masked_fill(first, 0.0)
        w = y.sqrt() * u
        tiny = _dt.finfo(w.dtype).tiny
        diag = (1 - (w ** 2).sum(-1)).clamp(min=tiny).sqrt()
        return w + diag.diag_embed()

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        d, c = self.dim, self.concentration
        diag = value.diagonal(dim1=-2, dim2=-1)[..., 1:]
        order = arange(2, d + 1, dtype=c.dtype, device=c.device)
        power = 2 * (c - 1).unsqueeze(-1) + d - order
        unnormalised = (power * diag.log()).sum(-1)
        dm1 = d - 1
        alpha = c + 0.5 * dm1
        log_norm = (0.5 * dm1 * math.log(math.pi) + (alpha - 0.5).mvlgamma(dm1)
                    - dm1 * (alpha.lgamma()))
        return unnormalised - log_norm
