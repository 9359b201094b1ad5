"""The :class:`Transform` base, its inverse and the composition of transforms (the part of
:mod:`~.transforms` the others are built on)."""

from __future__ import annotations

import functools
import operator
import weakref
from typing import Any, List, Sequence

from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor, cat

from . import constraints
from .independent import _sum_right

__all__: list = []


def _pad_last(x: Tensor, before: int, after: int, value: float) -> Tensor:
    """``x`` with ``before``/``after`` entries of ``value`` added on its last dimension."""
    parts = []
    if before:
        parts.append(x.new_full((*x.shape[:-1], before), value))
    parts.append(x)
    if after:
        parts.append(x.new_full((*x.shape[:-1], after), value))
    return cat(parts, -1)


def _clipped_sigmoid(x: Tensor) -> Tensor:
    fi = _dt.finfo(x.dtype)
    return x.sigmoid().clamp(min=fi.tiny, max=1.0 - fi.eps)


class Transform:
    """Base class of invertible (or at least computable) maps with a tractable Jacobian.

    Subclasses set ``domain``, ``codomain``, ``bijective`` and implement ``_call``,
    ``_inverse`` and ``log_abs_det_jacobian`` where they have them.

    Args:
        cache_size: 0 (no cache) or 1 (remember the last ``x -> y`` pair).

    Raises:
        ValueError: a ``cache_size`` other than 0 or 1.
    """

    bijective = False
    domain: constraints.Constraint
    codomain: constraints.Constraint

    def __init__(self, cache_size: int = 0) -> None:
        if cache_size not in (0, 1):
            raise ValueError(f"{type(self).__name__}: cache_size must be 0 or 1, got "
                             f"{cache_size!r}")
        self._cache_size = cache_size
        self._inv: Any = None
        self._cached_x_y: tuple = (None, None)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_inv"] = None
        return state

    @property
    def event_dim(self) -> int:
        """The number of rightmost dimensions that make one event (domain's = codomain's).

        Raises:
            ValueError: the domain and codomain have different event dimensions.
        """
        if self.domain.event_dim == self.codomain.event_dim:
            return self.domain.event_dim
        raise ValueError(f"{type(self).__name__}: event_dim is ambiguous (domain "
                         f"{self.domain.event_dim}, codomain {self.codomain.event_dim}); read "
                         f"domain.event_dim or codomain.event_dim")

    @property
    def inv(self) -> Transform:
        """The inverse transform (kept while referenced, so ``t.inv.inv is t``)."""
        inv = self._inv() if self._inv is not None else None
        if inv is None:
            inv = _InverseTransform(self)
            self._inv = weakref.ref(inv)
        return inv

    @property
    def sign(self) -> Any:
        """+1 or -1: whether a monotone bijection increases or decreases.

        Raises:
            NotImplementedError: the transform is not monotone.
        """
        raise NotImplementedError(f"{type(self).__name__} has no sign (not monotone)")

    def with_cache(self, cache_size: int = 1) -> Transform:
        """Return this transform with ``cache_size`` (itself when it already has it).

        Raises:
            NotImplementedError: a transform with constructor arguments that does not
                override this.
        """
        if self._cache_size == cache_size:
            return self
        if type(self).__init__ is Transform.__init__:
            return type(self)(cache_size=cache_size)
        raise NotImplementedError(f"{type(self).__name__}.with_cache is not implemented")

    def __eq__(self, other: Any) -> bool:
        return self is other

    def __ne__(self, other: Any) -> bool:
        return not self.__eq__(other)

    __hash__ = object.__hash__

    def __call__(self, x: Tensor) -> Tensor:
        """Apply the transform (from the cache when ``x`` is the last input seen)."""
        if self._cache_size == 0:
            return self._call(x)
        x_old, y_old = self._cached_x_y
        if x is x_old:
            return y_old
        y = self._call(x)
        self._cached_x_y = (x, y)
        return y

    def _inv_call(self, y: Tensor) -> Tensor:
        """Apply the inverse (from the cache when ``y`` is the last output seen)."""
        if self._cache_size == 0:
            return self._inverse(y)
        x_old, y_old = self._cached_x_y
        if y is y_old:
            return x_old
        x = self._inverse(y)
        self._cached_x_y = (x, y)
        return x

    def _call(self, x: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not implement the forward map")

    def _inverse(self, y: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} is not invertible")

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        """Return ``log |dy/dx|`` at the pair ``x``, ``y = t(x)``."""
        raise NotImplementedError(f"{type(self).__name__} has no log_abs_det_jacobian")

    def forward_shape(self, shape: Sequence[int]) -> Any:
        """The shape of ``t(x)`` for an ``x`` of ``shape``."""
        return shape

    def inverse_shape(self, shape: Sequence[int]) -> Any:
        """The shape of ``t.inv(y)`` for a ``y`` of ``shape``."""
        return shape

    def __repr__(self) -> str:
        return type(self).__name__ + "()"


class _InverseTransform(Transform):
    """The inverse of a transform: its calls go to the forward transform's inverse methods."""

    def __init__(self, transform: Transform) -> None:
        super().__init__(cache_size=transform._cache_size)
        self._inv = transform  # a strong reference: the inverse keeps its forward alive

    domain = property(lambda self: self._inv.codomain)
    codomain = property(lambda self: self._inv.domain)
    bijective = property(lambda self: self._inv.bijective)
    sign = property(lambda self: self._inv.sign)

    @property
    def inv(self) -> Transform:
        return self._inv

    def with_cache(self, cache_size: int = 1) -> Transform:
        return self.inv.with_cache(cache_size).inv

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _InverseTransform) and self._inv == other._inv

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inv!r})"

    def __call__(self, x: Tensor) -> Tensor:
        return self._inv._inv_call(x)

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        return -self._inv.log_abs_det_jacobian(y, x)

    def forward_shape(self, shape: Sequence[int]) -> Any:
        return self._inv.inverse_shape(shape)

    def inverse_shape(self, shape: Sequence[int]) -> Any:
        return self._inv.forward_shape(shape)


class ComposeTransform(Transform):
    """The transforms ``parts`` applied one after the other (the empty chain is the identity).

    Args:
        parts: the transforms, first applied first.
        cache_size: 0 or 1, given to every part.
    """

    def __init__(self, parts: List[Transform], cache_size: int = 0) -> None:
        if cache_size:
            parts = [part.with_cache(cache_size) for part in parts]
        super().__init__(cache_size=cache_size)
        self.parts = list(parts)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ComposeTransform) and self.parts == other.parts

    __hash__ = object.__hash__

    def _end(self, forward: bool) -> constraints.Constraint:
        """The domain (``forward`` False) or codomain, widened to the chain's event dims."""
        if not self.parts:
            return constraints.real
        parts = self.parts[::-1] if not forward else self.parts
        end = parts[-1].codomain if forward else parts[-1].domain
        event_dim = parts[0].domain.event_dim if forward else parts[0].codomain.event_dim
        for part in parts:
            if forward:
                event_dim += part.codomain.event_dim - part.domain.event_dim
                event_dim = max(event_dim, part.codomain.event_dim)
            else:
                event_dim += part.domain.event_dim - part.codomain.event_dim
                event_dim = max(event_dim, part.domain.event_dim)
        if event_dim > end.event_dim:
            end = constraints.independent(end, event_dim - end.event_dim)
        return end

    domain = property(lambda self: self._end(False))
    codomain = property(lambda self: self._end(True))

    @property
    def bijective(self) -> bool:  # type: ignore[override]
        return all(p.bijective for p in self.parts)

    @property
    def sign(self) -> Any:
        sign = 1
        for p in self.parts:
            sign = sign * p.sign
        return sign

    @property
    def inv(self) -> Transform:
        inv = self._inv() if self._inv is not None else None
        if inv is None:
            inv = ComposeTransform([p.inv for p in reversed(self.parts)])
            self._inv = weakref.ref(inv)
            inv._inv = weakref.ref(self)
        return inv

    def with_cache(self, cache_size: int = 1) -> Transform:
        if self._cache_size == cache_size:
            return self
        return ComposeTransform(self.parts, cache_size=cache_size)

    def __call__(self, x: Tensor) -> Tensor:
        for part in self.parts:
            x = part(x)
        return x

    def log_abs_det_jacobian(self, x: Tensor, y: Tensor) -> Tensor:
        if not self.parts:
            return x.new_zeros(x.shape)
        xs = [x]
        for part in self.parts[:-1]:
            xs.append(part(xs[-1]))
        xs.append(y)
        terms = []
        event_dim = self.domain.event_dim
        for part, xi, yi in zip(self.parts, xs[:-1], xs[1:]):
            terms.append(_sum_right(part.log_abs_det_jacobian(xi, yi),
                                    event_dim - part.domain.event_dim))
            event_dim += part.codomain.event_dim - part.domain.event_dim
        return functools.reduce(operator.add, terms)

    def forward_shape(self, shape: Sequence[int]) -> Any:
        for part in self.parts:
            shape = part.forward_shape(shape)
        return shape

    def inverse_shape(self, shape: Sequence[int]) -> Any:
        for part in reversed(self.parts):
            shape = part.inverse_shape(shape)
        return shape

    def __repr__(self) -> str:
        inner = ",\n    ".join(repr(p) for p in self.parts)
        return f"{type(self).__name__}(\n    {inner}\n)"


identity_transform = ComposeTransform([])
