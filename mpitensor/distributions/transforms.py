"""Invertible maps between constrained sets, with the API of ``torch.distributions.transforms``.

A :class:`Transform` maps points of its ``domain`` to points of its ``codomain``; ``t(x)``
applies it, ``t.inv(y)`` inverts it and ``t.log_abs_det_jacobian(x, y)`` gives the log of the
absolute Jacobian determinant, summed over the ``event_dim`` rightmost dimensions. With
``cache_size=1`` a transform remembers its last ``x -> y`` pair (by identity), so inverting a
value it just produced returns the exact input: this is what keeps ``log_prob`` of a
tanh-squashed sample finite at the edges. Everything is made of differentiable tensor ops.

Example:
    >>> import mpitensor as mt
    >>> t = ComposeTransform([ExpTransform(), AffineTransform(1.0, 2.0)])
    >>> y = t(mt.tensor([0.0]))
    >>> y.tolist(), t.inv(y).tolist()
    ([3.0], [0.0])
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
from typing import Any, Optional, Sequence

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor.tensor import Size, Tensor, as_tensor, atanh, cat, eye, full_like, stack

from . import constraints
from ._common import softplus
from ._transform_base import (  # noqa: F401 - Transform, ComposeTransform: torch's names
    ComposeTransform,
    Transform,
    _clipped_sigmoid,
    _InverseTransform,
    _pad_last,
    identity_transform,
)
from .distribution import broadcast_all
from .independent import _sum_right

__all__ = [
    "Transform", "ComposeTransform", "IndependentTransform", "ReshapeTransform", "ExpTransform",
    "PowerTransform", "SigmoidTransform", "TanhTransform", "AbsTransform", "AffineTransform",
    "SoftplusTransform", "SoftmaxTransform", "StickBreakingTransform",
    "LowerCholeskyTransform", "PositiveDefiniteTransform", "CorrCholeskyTransform",
    "CatTransform", "StackTransform", "CumulativeDistributionTransform", "identity_transform",
]


class IndependentTransform(Transform):
    """``base_transform`` with its ``reinterpreted_batch_ndims`` rightmost batch dimensions
    made part of the event (the log-det is summed over them).

    Args:
        base_transform: the elementwise (or event) transform.
        reinterpreted_batch_ndims: how many more dimensions form one event.
        cache_size: 0 or 1.
    """

    def __init__(self, base_transform: Transform, reinterpreted_batch_ndims: int,
                 cache_size: int = 0) -> None:
        super().__init__(cache_size=cache_size)
        self.base_transform = base_transform.with_cache(cache_size)
        self.reinterpreted_batch_ndims = reinterpreted_batch_ndims

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return IndependentTransform(self.base_transform, self.reinterpreted_batch_ndims,
                                    cache_size=cache_size)

    domain = property(lambda self: constraints.independent(
        self.base_transform.domain, self.reinterpreted_batch_ndims))
    codomain = property(lambda self: constraints.independent(
        self.base_transform.codomain, self.reinterpreted_batch_ndims))
    bijective = property(lambda self: self.base_transform.bijective)
    sign = property(lambda self: self.base_transform.sign)

    def _need_dims(self, x: Tensor, which: constraints.Constraint) -> None:
        if x.dim() < which.event_dim:
            raise ValueError(f"IndependentTransform: the value has {x.dim()} dimensions, "
                             f"fewer than the event's {which.event_dim}")

    def _call(self, x: Tensor) -> Tensor:
        self._need_dims(x, self.domain)
        return self.base_transform(x)

    def _inverse(self, y: Tensor) -> Tensor:
        self._need_dims(y, self.codomain)
        return self.base_transform.inv(y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return _sum_right(self.base_transform.log_abs_det_jacobian(x, y),
                          self.reinterpreted_batch_ndims)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.base_transform!r}, "
                f"{self.reinterpreted_batch_ndims})")

    def forward_shape(self, shape: Sequence[int]) -> Any:
        return self.base_transform.forward_shape(shape)

    def inverse_shape(self, shape: Sequence[int]) -> Any:
        return self.base_transform.inverse_shape(shape)


class ReshapeTransform(Transform):
    """Reshape the rightmost ``in_shape`` dimensions of the event to ``out_shape``.

    Args:
        in_shape, out_shape: event shapes with the same number of elements.
        cache_size: 0 or 1.

    Raises:
        ValueError: the shapes hold different numbers of elements.
    """

    bijective = True

    def __init__(self, in_shape: Sequence[int], out_shape: Sequence[int],
                 cache_size: int = 0) -> None:
        self.in_shape = Size(tuple(in_shape))
        self.out_shape = Size(tuple(out_shape))
        if self.in_shape.numel() != self.out_shape.numel():
            raise ValueError(f"ReshapeTransform: in_shape {tuple(in_shape)} and out_shape "
                             f"{tuple(out_shape)} hold different numbers of elements")
        super().__init__(cache_size=cache_size)

    domain = property(lambda self: constraints.independent(constraints.real,
                                                           len(self.in_shape)))
    codomain = property(lambda self: constraints.independent(constraints.real,
                                                             len(self.out_shape)))

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return ReshapeTransform(self.in_shape, self.out_shape, cache_size=cache_size)

    def _call(self, x: Tensor) -> Tensor:
        batch = tuple(x.shape[:x.dim() - len(self.in_shape)])
        return x.reshape(batch + tuple(self.out_shape))

    def _inverse(self, y: Tensor) -> Tensor:
        batch = tuple(y.shape[:y.dim() - len(self.out_shape)])
        return y.reshape(batch + tuple(self.in_shape))

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return x.new_zeros(tuple(x.shape[:x.dim() - len(self.in_shape)]))

    @staticmethod
    def _swap(shape: Sequence[int], old: Size, new: Size) -> Size:
        shape = tuple(shape)
        if len(shape) < len(old) or shape[len(shape) - len(old):] != tuple(old):
            raise ValueError(f"ReshapeTransform: a shape {shape} whose right end is not "
                             f"{tuple(old)}")
        return Size(shape[:len(shape) - len(old)] + tuple(new))

    def forward_shape(self, shape: Sequence[int]) -> Any:
        return self._swap(shape, self.in_shape, self.out_shape)

    def inverse_shape(self, shape: Sequence[int]) -> Any:
        return self._swap(shape, self.out_shape, self.in_shape)


class _Monotone(Transform):
    """An increasing elementwise bijection (sign +1) whose equality is its type."""

    bijective = True
    sign = +1

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, type(self))

    __hash__ = object.__hash__


class ExpTransform(_Monotone):
    """``y = exp(x)``, from the reals to the positive reals."""

    domain = constraints.real
    codomain = constraints.positive

    def _call(self, x: Tensor) -> Tensor:
        return x.exp()

    def _inverse(self, y: Tensor) -> Tensor:
        return y.log()

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return x


class PowerTransform(Transform):
    """``y = x ** exponent`` on the positive reals.

    Args:
        exponent: a tensor or number (broadcast with the input).
        cache_size: 0 or 1.
    """

    domain = constraints.positive
    codomain = constraints.positive
    bijective = True

    def __init__(self, exponent: Any, cache_size: int = 0) -> None:
        super().__init__(cache_size=cache_size)
        (self.exponent,) = broadcast_all(exponent)

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return PowerTransform(self.exponent, cache_size=cache_size)

    @property
    def sign(self) -> Any:
        return self.exponent.sign()

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, PowerTransform) and bool(self.exponent.eq(other.exponent).all())

    __hash__ = object.__hash__

    def _call(self, x: Tensor) -> Tensor:
        return x.pow(self.exponent)

    def _inverse(self, y: Tensor) -> Tensor:
        return y.pow(1 / self.exponent)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return (self.exponent * y / x).abs().log()

    def forward_shape(self, shape: Sequence[int]) -> Any:
        return Size(np.broadcast_shapes(tuple(shape), tuple(self.exponent.shape)))

    inverse_shape = forward_shape


class SigmoidTransform(_Monotone):
    """``y = 1 / (1 + exp(-x))``, kept inside (0, 1) at the dtype's resolution."""

    domain = constraints.real
    codomain = constraints.unit_interval

    def _call(self, x: Tensor) -> Tensor:
        return _clipped_sigmoid(x)

    def _inverse(self, y: Tensor) -> Tensor:
        fi = _dt.finfo(y.dtype)
        y = y.clamp(min=fi.tiny, max=1.0 - fi.eps)
        return y.log() - (-y).log1p()

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return -softplus(-x) - softplus(x)


class SoftplusTransform(_Monotone):
    """``y = log(1 + exp(x))``, from the reals to the positive reals."""

    domain = constraints.real
    codomain = constraints.positive

    def _call(self, x: Tensor) -> Tensor:
        return softplus(x)

    def _inverse(self, y: Tensor) -> Tensor:
        return (-y).expm1().neg().log() + y

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return -softplus(-x)


class TanhTransform(_Monotone):
    """``y = tanh(x)``, onto (-1, 1); the log-det ``2 (log 2 - x - softplus(-2x))`` stays
    finite for large ``|x|``. Use ``cache_size=1`` so ``log_prob`` of a sample near +-1
    inverts from the cache instead of through ``atanh``."""

    domain = constraints.real
    codomain = constraints.interval(-1.0, 1.0)

    def _call(self, x: Tensor) -> Tensor:
        return x.tanh()

    def _inverse(self, y: Tensor) -> Tensor:
        return atanh(y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return 2.0 * (math.log(2.0) - x - softplus(-2.0 * x))


class AbsTransform(Transform):
    """``y = |x|`` (not injective: the inverse returns the positive root)."""

    domain = constraints.real
    codomain = constraints.positive

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AbsTransform)

    __hash__ = object.__hash__

    def _call(self, x: Tensor) -> Tensor:
        return x.abs()

    def _inverse(self, y: Tensor) -> Tensor:
        return y


def _scalar_eq(a: Any, b: Any) -> bool:
    if isinstance(a, numbers.Number) and isinstance(b, numbers.Number):
        return a == b
    if isinstance(a, numbers.Number) or isinstance(b, numbers.Number):
        t, n = (b, a) if isinstance(a, numbers.Number) else (a, b)
        return bool((t == n).all())
    return bool((a == b).all())


class AffineTransform(Transform):
    """``y = loc + scale * x``, elementwise or over ``event_dim`` rightmost dimensions.

    Args:
        loc, scale: tensors or numbers.
        event_dim: how many rightmost dimensions form one event (the log-det sums them).
        cache_size: 0 or 1.
    """

    bijective = True

    def __init__(self, loc: Any, scale: Any, event_dim: int = 0, cache_size: int = 0) -> None:
        super().__init__(cache_size=cache_size)
        self.loc, self.scale = loc, scale
        self._event_dim = event_dim

    @property
    def event_dim(self) -> int:  # type: ignore[override]
        return self._event_dim

    @property
    def domain(self) -> constraints.Constraint:  # type: ignore[override]
        if self._event_dim == 0:
            return constraints.real
        return constraints.independent(constraints.real, self._event_dim)

    codomain = domain

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return AffineTransform(self.loc, self.scale, self._event_dim, cache_size=cache_size)

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, AffineTransform) and _scalar_eq(self.loc, other.loc)
                and _scalar_eq(self.scale, other.scale))

    __hash__ = object.__hash__

    @property
    def sign(self) -> Any:
        if isinstance(self.scale, numbers.Real):
            s = float(self.scale)
            return 1 if s > 0 else -1 if s < 0 else 0
        return self.scale.sign()

    def _call(self, x: Tensor) -> Tensor:
        return self.loc + self.scale * x

    def _inverse(self, y: Tensor) -> Tensor:
        return (y - self.loc) / self.scale

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        shape = tuple(x.shape)
        if isinstance(self.scale, numbers.Real):
            result = full_like(x, math.log(abs(self.scale)))
        else:
            result = self.scale.abs().log()
        if self._event_dim:
            k = self._event_dim
            result = result.reshape(tuple(result.shape[:result.dim() - k]) + (-1,)).sum(-1)
            shape = shape[:len(shape) - k]
        return result.expand(*shape)

    def _shape(self, shape: Sequence[int]) -> Any:
        return Size(np.broadcast_shapes(tuple(shape), tuple(getattr(self.loc, "shape", ())),
                                        tuple(getattr(self.scale, "shape", ()))))

    forward_shape = _shape
    inverse_shape = _shape


class SoftmaxTransform(Transform):
    """``y = softmax(x)`` over the last dimension, onto the simplex (not injective; the
    inverse returns ``log y``)."""

    domain = constraints.real_vector
    codomain = constraints.simplex

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, SoftmaxTransform)

    __hash__ = object.__hash__

    def _call(self, x: Tensor) -> Tensor:
        probs = (x - x.max(-1, keepdim=True)[0]).exp()
        return probs / probs.sum(-1, keepdim=True)

    def _inverse(self, y: Tensor) -> Tensor:
        return y.log()

    def forward_shape(self, shape: Sequence[int]) -> Any:
        if len(shape) < 1:
            raise ValueError(f"SoftmaxTransform: a shape {tuple(shape)} with no event dim")
        return shape

    inverse_shape = forward_shape


class StickBreakingTransform(Transform):
    """A bijection from vectors of ``K - 1`` reals onto the ``K``-simplex by stick breaking
    (a shifted sigmoid per step, so zero maps to the simplex's centre)."""

    domain = constraints.real_vector
    codomain = constraints.simplex
    bijective = True

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, StickBreakingTransform)

    __hash__ = object.__hash__

    @staticmethod
    def _offset(t: Tensor, n: int, top: int) -> Tensor:
        return top - t.new_ones((n,)).cumsum(-1)

    def _call(self, x: Tensor) -> Tensor:
        n = x.shape[-1]
        z = _clipped_sigmoid(x - self._offset(x, n, n + 1).log())
        z_cumprod = (1 - z).cumprod(-1)
        return _pad_last(z, 0, 1, 1.0) * _pad_last(z_cumprod, 1, 0, 1.0)

    def _inverse(self, y: Tensor) -> Tensor:
        y_crop = y[..., :-1]
        offset = self._offset(y, y_crop.shape[-1], y.shape[-1])
        sf = (1 - y_crop.cumsum(-1)).clamp(min=_dt.finfo(y.dtype).tiny)
        return y_crop.log() - sf.log() + offset.log()

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        n = x.shape[-1]
        x = x - self._offset(x, n, n + 1).log()
        return (-x - softplus(-x) + y[..., :-1].log()).sum(-1)

    def forward_shape(self, shape: Sequence[int]) -> Any:
        if len(shape) < 1:
            raise ValueError(f"StickBreakingTransform: a shape {tuple(shape)} with no event dim")
        return Size(tuple(shape[:-1]) + (shape[-1] + 1,))

    def inverse_shape(self, shape: Sequence[int]) -> Any:
        if len(shape) < 1:
            raise ValueError(f"StickBreakingTransform: a shape {tuple(shape)} with no event dim")
        return Size(tuple(shape[:-1]) + (shape[-1] - 1,))


class LowerCholeskyTransform(Transform):
    """Square matrices to lower-triangular ones with a positive diagonal: the strict lower
    triangle is kept and the diagonal exponentiated (not injective)."""

    domain = constraints.independent(constraints.real, 2)
    codomain = constraints.lower_cholesky

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, LowerCholeskyTransform)

    __hash__ = object.__hash__

    def _call(self, x: Tensor) -> Tensor:
        return x.tril(-1) + x.diagonal(dim1=-2, dim2=-1).exp().diag_embed()

    def _inverse(self, y: Tensor) -> Tensor:
        return y.tril(-1) + y.diagonal(dim1=-2, dim2=-1).log().diag_embed()


class PositiveDefiniteTransform(Transform):
    """Square matrices to positive-definite ones: ``L L^T`` of their
    :class:`LowerCholeskyTransform` (not injective; the inverse goes through Cholesky)."""

    domain = constraints.independent(constraints.real, 2)
    codomain = constraints.positive_definite

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, PositiveDefiniteTransform)

    __hash__ = object.__hash__

    def _call(self, x: Tensor) -> Tensor:
        low = LowerCholeskyTransform()(x)
        return low @ low.mT

    def _inverse(self, y: Tensor) -> Tensor:
        return LowerCholeskyTransform().inv(y.cholesky())


def _tril_flat_index(n: int, diag: int) -> np.ndarray:
    """Row-major flat indices of the entries of an ``n x n`` matrix on or below diagonal
    ``diag``."""
    r = np.arange(n)
    return np.flatnonzero((r[None, :] < r[:, None] + (diag + 1)).ravel())


def _tril_matrix_to_vec(mat: Tensor, diag: int = 0) -> Tensor:
    n = mat.shape[-1]
    idx = as_tensor(_tril_flat_index(n, diag), device=mat.device)
    return mat.reshape(tuple(mat.shape[:-2]) + (n * n,))[..., idx]


def _vec_to_tril_matrix(vec: Tensor, diag: int = 0) -> Tensor:
    m = vec.shape[-1]
    b = 1 + 2 * diag
    n = (-b + math.sqrt(b * b + 8 * m + 4 * abs(diag) * (diag + 1))) / 2
    if abs(round(n) - n) > 1e-9:
        raise ValueError(f"a vector of {m} entries is no triangle of a square matrix")
    n = round(n)
    where_ = np.full(n * n, m, dtype=np.int64)  # m points at the zero appended below
    where_[_tril_flat_index(n, diag)] = np.arange(m)
    padded = _pad_last(vec, 0, 1, 0.0)
    idx = as_tensor(where_, device=vec.device)
    return padded[..., idx].reshape(tuple(vec.shape[:-1]) + (n, n))


class CorrCholeskyTransform(Transform):
    """Vectors of ``D(D-1)/2`` reals onto Cholesky factors of ``D x D`` correlation matrices:
    ``tanh`` to (-1, 1), then stick breaking row by row so every row has unit norm."""

    domain = constraints.real_vector
    codomain = constraints.corr_cholesky
    bijective = True

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, CorrCholeskyTransform)

    __hash__ = object.__hash__

    def _call(self, x: Tensor) -> Tensor:
        eps = _dt.finfo(x.dtype).eps
        x = x.tanh().clamp(min=-1 + eps, max=1 - eps)
        r = _vec_to_tril_matrix(x, diag=-1)
        z1m_cumprod_sqrt = (1 - r ** 2).sqrt().cumprod(-1)
        r = r + eye(r.shape[-1], dtype=r.dtype, device=r.device)
        return r * _pad_last(z1m_cumprod_sqrt[..., :-1], 1, 0, 1.0)

    def _inverse(self, y: Tensor) -> Tensor:
        y_cumsum = 1 - (y * y).cumsum(-1)
        y_cumsum_shifted = _pad_last(y_cumsum[..., :-1], 1, 0, 1.0)
        y_vec = _tril_matrix_to_vec(y, diag=-1)
        t = y_vec / _tril_matrix_to_vec(y_cumsum_shifted, diag=-1).sqrt()
        return (t.log1p() - (-t).log1p()) / 2

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor, intermediates: Any = None) -> Tensor:
        y1m_cumsum = 1 - (y * y).cumsum(-1)
        stick = 0.5 * _tril_matrix_to_vec(y1m_cumsum, diag=-2).log().sum(-1)
        tanh_part = -2 * (x + softplus(-2 * x) - math.log(2.0)).sum(-1)
        return stick + tanh_part

    def forward_shape(self, shape: Sequence[int]) -> Any:
        if len(shape) < 1:
            raise ValueError(f"CorrCholeskyTransform: a shape {tuple(shape)} with no event dim")
        m = shape[-1]
        d = round((0.25 + 2 * m) ** 0.5 + 0.5)
        if d * (d - 1) // 2 != m:
            raise ValueError(f"CorrCholeskyTransform: {m} entries are no D*(D-1)/2")
        return Size(tuple(shape[:-1]) + (d, d))

    def inverse_shape(self, shape: Sequence[int]) -> Any:
        if len(shape) < 2 or shape[-2] != shape[-1]:
            raise ValueError(f"CorrCholeskyTransform: a shape {tuple(shape)} that is not of "
                             f"square matrices")
        n = shape[-1]
        return Size(tuple(shape[:-2]) + (n * (n - 1) // 2,))


class CatTransform(Transform):
    """Transforms applied to consecutive slices of ``dim`` (of ``lengths``), concatenated.

    Args:
        tseq: the transforms.
        dim: the dimension that is cut.
        lengths: the slices' sizes (1 each by default).
        cache_size: 0 or 1.
    """

    def __init__(self, tseq: Sequence[Transform], dim: int = 0,
                 lengths: Optional[Sequence[int]] = None, cache_size: int = 0) -> None:
        if not all(isinstance(t, Transform) for t in tseq):
            raise TypeError("CatTransform: every element of tseq must be a Transform")
        if cache_size:
            tseq = [t.with_cache(cache_size) for t in tseq]
        super().__init__(cache_size=cache_size)
        self.transforms = list(tseq)
        self.lengths = [1] * len(self.transforms) if lengths is None else list(lengths)
        if len(self.lengths) != len(self.transforms):
            raise ValueError(f"CatTransform: {len(self.lengths)} lengths for "
                             f"{len(self.transforms)} transforms")
        self.dim = dim

    @functools.cached_property
    def event_dim(self) -> int:  # type: ignore[override]
        return max(t.event_dim for t in self.transforms)

    @functools.cached_property
    def length(self) -> int:
        return sum(self.lengths)

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return CatTransform(self.transforms, self.dim, self.lengths, cache_size)

    def _slices(self, x: Tensor) -> list:
        if not -x.dim() <= self.dim < x.dim() or x.size(self.dim) != self.length:
            raise ValueError(f"CatTransform: dim {self.dim} of a value of shape "
                             f"{tuple(x.shape)} must have size {self.length}")
        out, start = [], 0
        for n in self.lengths:
            out.append(x.narrow(self.dim, start, n))
            start += n
        return out

    def _call(self, x: Tensor) -> Tensor:
        return cat([t(s) for t, s in zip(self.transforms, self._slices(x))], self.dim)

    def _inverse(self, y: Tensor) -> Tensor:
        return cat([t.inv(s) for t, s in zip(self.transforms, self._slices(y))], self.dim)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        parts = []
        for t, xs, ys in zip(self.transforms, self._slices(x), self._slices(y)):
            parts.append(_sum_right(t.log_abs_det_jacobian(xs, ys),
                                    self.event_dim - t.event_dim))
        dim = self.dim - x.dim() if self.dim >= 0 else self.dim
        dim = dim + self.event_dim
        if dim < 0:
            return cat(parts, dim)
        return functools.reduce(operator.add, parts)

    bijective = property(lambda self: all(t.bijective for t in self.transforms))
    domain = property(lambda self: constraints.cat(
        [t.domain for t in self.transforms], self.dim, self.lengths))
    codomain = property(lambda self: constraints.cat(
        [t.codomain for t in self.transforms], self.dim, self.lengths))


class StackTransform(Transform):
    """Transforms applied to the slices ``x.select(dim, i)``, stacked back along ``dim``.

    Args:
        tseq: one transform per slice.
        dim: the dimension along which the slices lie.
        cache_size: 0 or 1.
    """

    def __init__(self, tseq: Sequence[Transform], dim: int = 0, cache_size: int = 0) -> None:
        if not all(isinstance(t, Transform) for t in tseq):
            raise TypeError("StackTransform: every element of tseq must be a Transform")
        if cache_size:
            tseq = [t.with_cache(cache_size) for t in tseq]
        super().__init__(cache_size=cache_size)
        self.transforms = list(tseq)
        self.dim = dim

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return StackTransform(self.transforms, self.dim, cache_size)

    def _slices(self, z: Tensor) -> list:
        if not -z.dim() <= self.dim < z.dim() or z.size(self.dim) != len(self.transforms):
            raise ValueError(f"StackTransform: dim {self.dim} of a value of shape "
                             f"{tuple(z.shape)} must have size {len(self.transforms)}")
        return [z.select(self.dim, i) for i in range(z.size(self.dim))]

    def _call(self, x: Tensor) -> Tensor:
        return stack([t(s) for t, s in zip(self.transforms, self._slices(x))], self.dim)

    def _inverse(self, y: Tensor) -> Tensor:
        return stack([t.inv(s) for t, s in zip(self.transforms, self._slices(y))], self.dim)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return stack([t.log_abs_det_jacobian(xs, ys) for t, xs, ys
                      in zip(self.transforms, self._slices(x), self._slices(y))], self.dim)

    bijective = property(lambda self: all(t.bijective for t in self.transforms))
    domain = property(lambda self: constraints.stack(
        [t.domain for t in self.transforms], self.dim))
    codomain = property(lambda self: constraints.stack(
        [t.codomain for t in self.transforms], self.dim))


class CumulativeDistributionTransform(Transform):
    """``y = distribution.cdf(x)``: the support onto the unit interval (the log-det is the
    log density).

    Args:
        distribution: a univariate distribution with ``cdf``, ``icdf`` and ``log_prob``.
        cache_size: 0 or 1.
    """

    bijective = True
    codomain = constraints.unit_interval
    sign = +1

    def __init__(self, distribution: Any, cache_size: int = 0) -> None:
        super().__init__(cache_size=cache_size)
        self.distribution = distribution

    @property
    def domain(self) -> constraints.Constraint:  # type: ignore[override]
        return self.distribution.support

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return CumulativeDistributionTransform(self.distribution, cache_size=cache_size)

    def _call(self, x: Tensor) -> Tensor:
        return self.distribution.cdf(x)

    def _inverse(self, y: Tensor) -> Tensor:
        return self.distribution.icdf(y)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return self.distribution.log_prob(x)
