"""The multivariate normal distribution, parameterised by a covariance matrix, its lower
Cholesky factor or its inverse (the precision matrix).

The two matrix ops it needs with gradients (the Cholesky factor and the solve by a lower
triangular matrix) are defined here as autograd Functions on raw arrays.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from mpitensor import autograd as _autograd
from mpitensor import linalg as _linalg
from mpitensor.tensor import Tensor, broadcast_shapes

from . import constraints
from ._common import normal
from ._location import CenteredAtLoc
from .distribution import Distribution, ShapeLike, _expanded, _size, lazy_property

__all__ = ["MultivariateNormal"]


def _tril(xp: Any, a: Any) -> Any:
    n = a.shape[-1]
    return a * xp.tril(xp.ones((n, n), dtype=a.dtype))


def _mT(xp: Any, a: Any) -> Any:  # noqa: N802 - torch's name for a batched transpose
    return xp.swapaxes(a, -1, -2)


def _solve_lower(xp: Any, L: Any, B: Any) -> Any:  # noqa: N803 - matrices
    shape = broadcast_shapes(L.shape[:-2], B.shape[:-2])
    L = xp.broadcast_to(L, (*shape, *L.shape[-2:]))
    B = xp.broadcast_to(B, (*shape, *B.shape[-2:]))
    return xp.linalg.solve(L, B)


class _Cholesky(_autograd.ArrayFunction):
    """``L`` with ``A = L L^T``; the gradient is symmetrised, as for a symmetric input."""

    @staticmethod
    def forward(ctx: Any, a: Any) -> Any:
        xp = _autograd._xp(a)
        try:
            L = xp.linalg.cholesky(a)
        except Exception as e:  # noqa: BLE001 - NumPy's LinAlgError, CuPy's
            raise ValueError("cholesky: the matrix is not positive definite") from e
        ctx.save_for_backward(L)
        return L

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (L,) = ctx.saved_tensors
        xp = _autograd._xp(g)
        P = _tril(xp, _mT(xp, L) @ g)
        n = L.shape[-1]
        P = P - 0.5 * P * xp.eye(n, dtype=P.dtype)
        # S = L^-T P L^-1, by two solves with the upper triangular L^T
        Y = xp.linalg.solve(_mT(xp, L), P)                   # L^-T P
        S = _mT(xp, xp.linalg.solve(_mT(xp, L), _mT(xp, Y)))  # (L^-T (L^-T P)^T)^T
        return (0.5 * (S + _mT(xp, S)),)


class _SolveLower(_autograd.ArrayFunction):
    """``X = L^-1 B`` for a lower triangular ``L`` (batched, broadcast)."""

    @staticmethod
    def forward(ctx: Any, L: Any, B: Any) -> Any:  # noqa: N803 - matrices
        xp = _autograd._xp(L)
        X = _solve_lower(xp, L, B)
        ctx.save_for_backward(L, X)
        ctx.shapes = (L.shape, B.shape)
        return X

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        L, X = ctx.saved_tensors
        xp = _autograd._xp(g)
        Lb = xp.broadcast_to(L, (*X.shape[:-2], *L.shape[-2:]))
        gB = xp.linalg.solve(_mT(xp, Lb), g)
        gL = -_tril(xp, gB @ _mT(xp, X))
        return _reduce_to(xp, gL, ctx.shapes[0]), _reduce_to(xp, gB, ctx.shapes[1])


def _reduce_to(xp: Any, g: Any, shape: tuple) -> Any:
    extra = g.ndim - len(shape)
    if extra:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g


def _batch_mahalanobis(L: Tensor, x: Tensor) -> Tensor:
    """``|| L^-1 x ||^2`` over the last dimension of ``x``."""
    y = _SolveLower.apply(L, x.unsqueeze(-1)).squeeze(-1)
    return (y ** 2).sum(-1)


class MultivariateNormal(CenteredAtLoc, Distribution):
    """Multivariate normal of mean ``loc`` (``batch_shape + (n,)``) and one of
    ``covariance_matrix``, ``scale_tril`` (its lower Cholesky factor, positive diagonal) or
    ``precision_matrix`` (its inverse); ``rsample`` is reparameterised (``loc + L eps``).

    Raises:
        ValueError: not exactly one matrix; ``loc`` with no dimension or a matrix of the wrong
            shape; with validation, a matrix that is not positive definite (or lower
            triangular with a positive diagonal, for ``scale_tril``).

    Example:
        >>> import mpitensor as mt
        >>> d = MultivariateNormal(mt.zeros(2), covariance_matrix=mt.eye(2))
        >>> tuple(d.sample((5,)).shape)
        (5, 2)
    """

    arg_constraints = {"loc": constraints.real_vector,
                       "covariance_matrix": constraints.positive_definite,
                       "precision_matrix": constraints.positive_definite,
                       "scale_tril": constraints.lower_cholesky}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc: Tensor, covariance_matrix: Optional[Tensor] = None,
                 precision_matrix: Optional[Tensor] = None, scale_tril: Optional[Tensor] = None,
                 validate_args: Optional[bool] = None) -> None:
        given = [m for m in (covariance_matrix, precision_matrix, scale_tril) if m is not None]
        if len(given) != 1:
            raise ValueError("MultivariateNormal: pass exactly one of covariance_matrix, "
                             "precision_matrix and scale_tril")
        if not isinstance(loc, Tensor) or loc.dim() < 1:
            raise ValueError("MultivariateNormal: loc must be a tensor of at least one dimension")
        m = given[0]
        if m.dim() < 2 or m.shape[-1] != m.shape[-2] or m.shape[-1] != loc.shape[-1]:
            raise ValueError(f"MultivariateNormal: the matrix must be of shape (..., n, n) with "
                             f"n = loc.shape[-1] = {loc.shape[-1]}, got {tuple(m.shape)}")
        batch = tuple(broadcast_shapes(tuple(m.shape[:-2]), tuple(loc.shape[:-1])))
        n = loc.shape[-1]
        self.loc = loc.expand(*batch, n)
        if scale_tril is not None:
            self.scale_tril = scale_tril.expand(*batch, n, n)
            self._unbroadcasted_scale_tril = scale_tril
        elif covariance_matrix is not None:
            self.covariance_matrix = covariance_matrix.expand(*batch, n, n)
            self._given = covariance_matrix
        else:
            self.precision_matrix = precision_matrix.expand(*batch, n, n)
            self._given = precision_matrix
        super().__init__(batch, (n,), validate_args)
        if scale_tril is None:
            given_m = self._given
            cov = given_m if covariance_matrix is not None else _linalg.inv(given_m)
            self._unbroadcasted_scale_tril = _Cholesky.apply(cov)

    @lazy_property
    def scale_tril(self) -> Tensor:
        """The lower Cholesky factor of the covariance."""
        n = self._event_shape[0]
        return self._unbroadcasted_scale_tril.expand(*self._batch_shape, n, n)

    @lazy_property
    def covariance_matrix(self) -> Tensor:
        """The covariance matrix."""
        L = self._unbroadcasted_scale_tril
        n = self._event_shape[0]
        return (L @ L.mT).expand(*self._batch_shape, n, n)

    @lazy_property
    def precision_matrix(self) -> Tensor:
        """The inverse of the covariance matrix."""
        L = self._unbroadcasted_scale_tril
        n = self._event_shape[0]
        return _linalg.inv(L @ L.mT).expand(*self._batch_shape, n, n)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> MultivariateNormal:
        """Return this distribution with its parameters expanded to ``batch_shape``."""
        new = _instance if _instance is not None else type(self).__new__(type(self))
        shape = tuple(_size(batch_shape))
        n = self._event_shape[0]
        new.loc = self.loc.expand(*shape, n)
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril
        for k in ("covariance_matrix", "scale_tril", "precision_matrix"):
            if k in self.__dict__:
                setattr(new, k, self.__dict__[k].expand(*shape, n, n))
        return _expanded(new, self, shape)

    @property
    def variance(self) -> Tensor:
        return (self._unbroadcasted_scale_tril ** 2).sum(-1).expand(*self._batch_shape,
                                                                     *self._event_shape)

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        eps = normal(tuple(self._extended_shape(sample_shape)), self.loc)
        return self.loc + (self._unbroadcasted_scale_tril @ eps.unsqueeze(-1)).squeeze(-1)

    def log_prob(self, value: Any) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        diff = value - self.loc
        M = _batch_mahalanobis(self._unbroadcasted_scale_tril, diff)  # noqa: N806
        half_log_det = self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        n = self._event_shape[0]
        return -0.5 * (n * math.log(2 * math.pi) + M) - half_log_det

    def entropy(self) -> Tensor:
        n = self._event_shape[0]
        half_log_det = self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        h = 0.5 * n * (1.0 + math.log(2 * math.pi)) + half_log_det
        return h.expand(*self._batch_shape) if self._batch_shape else h
