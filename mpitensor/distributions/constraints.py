"""Constraints: the sets a distribution's parameters and values live in, with torch's names.

Each constraint is an object with ``check(value)``, which returns a boolean tensor telling,
per element (per event for constraints over events, such as :data:`simplex`), whether
``value`` lies in the set. Distributions name theirs in ``arg_constraints`` and ``support``.

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.distributions import constraints
    >>> constraints.positive.check(mt.tensor([1.0, -1.0])).tolist()
    [True, False]
"""

from __future__ import annotations

from typing import Any

from mpitensor.tensor import Tensor, as_tensor

__all__ = [
    "Constraint", "boolean", "real", "real_vector", "positive", "nonnegative",
    "greater_than", "greater_than_eq", "less_than", "interval", "half_open_interval",
    "unit_interval", "simplex", "integer_interval", "nonnegative_integer", "positive_integer",
    "independent", "lower_cholesky", "positive_definite", "one_hot", "dependent",
    "is_dependent", "multinomial",
]


def _t(value: Any) -> Tensor:
    return value if isinstance(value, Tensor) else as_tensor(value)


class Constraint:
    """A set of values; ``check(value)`` answers, element by element, whether ``value`` is in it.

    ``is_discrete`` says whether the set is countable; ``event_dim`` how many rightmost
    dimensions make one point of it (0 for elementwise constraints).
    """

    is_discrete = False
    event_dim = 0

    def check(self, value: Any) -> Tensor:
        """Return a boolean tensor: True where ``value`` satisfies the constraint."""
        return self._holds(_t(value))

    def _holds(self, v: Tensor) -> Tensor:
        """:meth:`check` of ``v``, already a tensor (what the built-in sets define)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return type(self).__name__.lstrip("_") + "()"


class _Dependent(Constraint):
    """A set that depends on other parameters (a support that cannot be checked alone)."""

    def check(self, value: Any) -> Tensor:
        raise ValueError("a dependent constraint cannot be checked on its own")


def is_dependent(constraint: Any) -> bool:
    """True when ``constraint`` is a dependent one (it cannot be checked on its own)."""
    return isinstance(constraint, _Dependent)


class _Boolean(Constraint):
    is_discrete = True

    def _holds(self, v: Tensor) -> Tensor:
        return (v == 0) | (v == 1)


class _Real(Constraint):
    def _holds(self, v: Tensor) -> Tensor:
        return v == v  # False at NaN only


class _GreaterThan(Constraint):
    def __init__(self, lower_bound: Any) -> None:
        self.lower_bound = lower_bound

    def _holds(self, v: Tensor) -> Tensor:
        return self.lower_bound < v

    def __repr__(self) -> str:
        return f"GreaterThan(lower_bound={self.lower_bound})"


class _GreaterThanEq(_GreaterThan):
    def _holds(self, v: Tensor) -> Tensor:
        return self.lower_bound <= v

    def __repr__(self) -> str:
        return f"GreaterThanEq(lower_bound={self.lower_bound})"


class _LessThan(Constraint):
    def __init__(self, upper_bound: Any) -> None:
        self.upper_bound = upper_bound

    def _holds(self, v: Tensor) -> Tensor:
        return v < self.upper_bound

    def __repr__(self) -> str:
        return f"LessThan(upper_bound={self.upper_bound})"


class _Interval(Constraint):
    def __init__(self, lower_bound: Any, upper_bound: Any) -> None:
        self.lower_bound, self.upper_bound = lower_bound, upper_bound

    def _holds(self, v: Tensor) -> Tensor:
        return (self.lower_bound <= v) & (v <= self.upper_bound)

    def __repr__(self) -> str:
        return f"Interval(lower_bound={self.lower_bound}, upper_bound={self.upper_bound})"


class _HalfOpenInterval(_Interval):
    def _holds(self, v: Tensor) -> Tensor:
        return (self.lower_bound <= v) & (v < self.upper_bound)

    def __repr__(self) -> str:
        return f"HalfOpenInterval(lower_bound={self.lower_bound}, upper_bound={self.upper_bound})"


class _IntegerInterval(_Interval):
    is_discrete = True

    def _holds(self, v: Tensor) -> Tensor:
        return (v % 1 == 0) & (self.lower_bound <= v) & (v <= self.upper_bound)

    def __repr__(self) -> str:
        return f"IntegerInterval(lower_bound={self.lower_bound}, upper_bound={self.upper_bound})"


class _IntegerGreaterThan(Constraint):
    is_discrete = True

    def __init__(self, lower_bound: int) -> None:
        self.lower_bound = lower_bound

    def _holds(self, v: Tensor) -> Tensor:
        return (v % 1 == 0) & (v >= self.lower_bound)

    def __repr__(self) -> str:
        return f"IntegerGreaterThan(lower_bound={self.lower_bound})"


class _Simplex(Constraint):
    event_dim = 1

    def _holds(self, v: Tensor) -> Tensor:
        return (v >= 0).all(dim=-1) & ((v.sum(-1) - 1).abs() < 1e-6)


class _OneHot(Constraint):
    is_discrete = True
    event_dim = 1

    def _holds(self, v: Tensor) -> Tensor:
        return ((v == 0) | (v == 1)).all(dim=-1) & (v.sum(-1) == 1)


class _Multinomial(Constraint):
    """Vectors of non-negative counts summing to at most ``upper_bound``."""

    is_discrete = True
    event_dim = 1

    def __init__(self, upper_bound: int) -> None:
        self.upper_bound = upper_bound

    def _holds(self, v: Tensor) -> Tensor:
        return (v >= 0).all(dim=-1) & (v.sum(dim=-1) <= self.upper_bound)

    def __repr__(self) -> str:
        return f"Multinomial(upper_bound={self.upper_bound})"


class _Independent(Constraint):
    """A constraint over the ``reinterpreted_batch_ndims`` rightmost dimensions as one event."""

    def __init__(self, base_constraint: Constraint, reinterpreted_batch_ndims: int) -> None:
        self.base_constraint = base_constraint
        self.reinterpreted_batch_ndims = reinterpreted_batch_ndims
        self.is_discrete = base_constraint.is_discrete
        self.event_dim = base_constraint.event_dim + reinterpreted_batch_ndims

    def check(self, value: Any) -> Tensor:
        ok = self.base_constraint.check(value)
        for _ in range(self.reinterpreted_batch_ndims):
            ok = ok.all(dim=-1)
        return ok

    def __repr__(self) -> str:
        return f"IndependentConstraint({self.base_constraint!r}, {self.reinterpreted_batch_ndims})"


class _LowerCholesky(Constraint):
    event_dim = 2

    def _holds(self, v: Tensor) -> Tensor:
        lower = (v.tril() == v).all(dim=-1).all(dim=-1)
        return lower & (v.diagonal(dim1=-2, dim2=-1) > 0).all(dim=-1)


class _PositiveDefinite(Constraint):
    event_dim = 2

    def _holds(self, v: Tensor) -> Tensor:
        import numpy as np

        from mpitensor import backend as _backend

        a = v.detach()._data
        xp = _backend.array_module(a)
        sym = xp.all(xp.abs(a - xp.swapaxes(a, -1, -2)) <= 1e-6 * (1 + xp.abs(a)), axis=(-2, -1))
        eig = xp.linalg.eigvalsh(a)
        ok = sym & xp.all(eig > 0, axis=-1)
        return Tensor._wrap(xp.asarray(ok, dtype=np.bool_))


class _CorrCholesky(Constraint):
    """Lower-triangular factors of correlation matrices: positive diagonal, unit-norm rows."""

    event_dim = 2

    def _holds(self, v: Tensor) -> Tensor:
        tol = 10 * _finfo_eps(v) * v.size(-1)
        unit = ((v.norm(dim=-1) - 1).abs() <= tol).all(dim=-1)
        return _LowerCholesky()._holds(v) & unit


class _PositiveSemidefinite(_PositiveDefinite):
    def _holds(self, v: Tensor) -> Tensor:
        from mpitensor import backend as _backend

        a = v.detach()._data
        xp = _backend.array_module(a)
        sym = xp.all(xp.abs(a - xp.swapaxes(a, -1, -2)) <= 1e-6 * (1 + xp.abs(a)), axis=(-2, -1))
        ok = sym & xp.all(xp.linalg.eigvalsh(a) >= 0, axis=-1)
        return Tensor._wrap(xp.asarray(ok, dtype=bool))


def _finfo_eps(v: Tensor) -> float:
    from mpitensor import dtypes as _dt

    return _dt.finfo(v.dtype).eps if v.is_floating_point() else 0.0


class _Joined(Constraint):
    """Constraints ``cseq`` on parts of a value (``_Cat``, ``_Stack``): discrete where any
    part is."""

    cseq: list

    @property
    def is_discrete(self) -> bool:  # type: ignore[override]
        return any(c.is_discrete for c in self.cseq)


class _Cat(_Joined):
    """Constraints ``cseq`` on consecutive slices of ``dim`` of sizes ``lengths``."""

    def __init__(self, cseq: Any, dim: int = 0, lengths: Any = None) -> None:
        self.cseq = list(cseq)
        self.lengths = [1] * len(self.cseq) if lengths is None else list(lengths)
        if len(self.lengths) != len(self.cseq):
            raise ValueError(f"cat: {len(self.lengths)} lengths for {len(self.cseq)} constraints")
        self.dim = dim

    @property
    def event_dim(self) -> int:  # type: ignore[override]
        return max(c.event_dim for c in self.cseq)

    def _holds(self, v: Tensor) -> Tensor:
        from mpitensor.tensor import cat as _cat

        parts, start = [], 0
        for c, n in zip(self.cseq, self.lengths):
            parts.append(c.check(v.narrow(self.dim, start, n)))
            start += n
        return _cat(parts, self.dim)


class _Stack(_Joined):
    """Constraints ``cseq`` on the slices ``value.select(dim, i)``."""

    def __init__(self, cseq: Any, dim: int = 0) -> None:
        self.cseq = list(cseq)
        self.dim = dim

    @property
    def event_dim(self) -> int:  # type: ignore[override]
        d = max(c.event_dim for c in self.cseq)
        return d + 1 if self.dim + d < 0 else d

    def _holds(self, v: Tensor) -> Tensor:
        from mpitensor.tensor import stack as _stack

        n = v.size(self.dim)
        return _stack([self.cseq[i].check(v.select(self.dim, i)) for i in range(n)], self.dim)


dependent = _Dependent()
boolean = _Boolean()
real = _Real()
real_vector = _Independent(real, 1)
positive = _GreaterThan(0.0)
nonnegative = _GreaterThanEq(0.0)
unit_interval = _Interval(0.0, 1.0)
simplex = _Simplex()
one_hot = _OneHot()
nonnegative_integer = _IntegerGreaterThan(0)
positive_integer = _IntegerGreaterThan(1)
lower_cholesky = _LowerCholesky()
positive_definite = _PositiveDefinite()
positive_semidefinite = _PositiveSemidefinite()
corr_cholesky = _CorrCholesky()
cat = _Cat
stack = _Stack
greater_than = _GreaterThan
greater_than_eq = _GreaterThanEq
less_than = _LessThan
interval = _Interval
half_open_interval = _HalfOpenInterval
integer_interval = _IntegerInterval
independent = _Independent
multinomial = _Multinomial
