"""Registries from constraints to transforms, as ``torch.distributions.constraint_registry``.

``biject_to(c)`` returns a bijective :class:`~.transforms.Transform` from the reals (or
real vectors) onto the set ``c``, with a log-det; ``transform_to(c)`` any transform onto it
(not necessarily injective, e.g. softmax for the simplex). Variational inference keeps an
unconstrained parameter ``u`` and uses ``biject_to(constraints.positive)(u)`` as a scale.

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.distributions import constraints
    >>> biject_to(constraints.positive)(mt.tensor([0.0])).tolist()
    [1.0]
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Dict, Optional

from . import constraints, transforms

__all__ = ["ConstraintRegistry", "biject_to", "transform_to"]


class ConstraintRegistry:
    """A map from constraint types to factories ``factory(constraint) -> Transform``."""

    def __init__(self) -> None:
        self._registry: Dict[type, Callable] = {}

    def register(self, constraint: Any, factory: Optional[Callable] = None) -> Any:
        """Register ``factory`` for ``constraint`` (a Constraint subclass, or an instance,
        which stands for its class); used as a decorator when ``factory`` is omitted.

        Raises:
            TypeError: ``constraint`` is neither a Constraint subclass nor an instance of one.
        """
        if factory is None:
            return lambda f: self.register(constraint, f)
        if isinstance(constraint, constraints.Constraint):
            constraint = type(constraint)
        if not (isinstance(constraint, type) and issubclass(constraint, constraints.Constraint)):
            raise TypeError(f"register() expects a Constraint subclass or instance, got "
                            f"{constraint!r}")
        self._registry[constraint] = factory
        return factory

    def __call__(self, constraint: Any) -> transforms.Transform:
        """Return the transform registered for ``constraint``'s type.

        Raises:
            NotImplementedError: no factory is registered for that type.
        """
        factory = self._registry.get(type(constraint))
        if factory is None:
            raise NotImplementedError(f"no transform is registered for constraints of type "
                                      f"{type(constraint).__name__}; register one with "
                                      f".register()")
        return factory(constraint)


biject_to = ConstraintRegistry()
transform_to = ConstraintRegistry()


def _both(*cs: Any) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        for c in cs:
            biject_to.register(c, fn)
            transform_to.register(c, fn)
        return fn

    return deco


@_both(constraints.real)
def _to_real(constraint: Any) -> transforms.Transform:
    return transforms.identity_transform


@biject_to.register(constraints.independent)
def _biject_to_independent(constraint: Any) -> transforms.Transform:
    return transforms.IndependentTransform(biject_to(constraint.base_constraint),
                                           constraint.reinterpreted_batch_ndims)


@transform_to.register(constraints.independent)
def _transform_to_independent(constraint: Any) -> transforms.Transform:
    return transforms.IndependentTransform(transform_to(constraint.base_constraint),
                                           constraint.reinterpreted_batch_ndims)


@_both(constraints.greater_than, constraints.greater_than_eq)
def _to_greater_than(constraint: Any) -> transforms.Transform:
    return transforms.ComposeTransform(
        [transforms.ExpTransform(), transforms.AffineTransform(constraint.lower_bound, 1)])


@_both(constraints.less_than)
def _to_less_than(constraint: Any) -> transforms.Transform:
    return transforms.ComposeTransform(
        [transforms.ExpTransform(), transforms.AffineTransform(constraint.upper_bound, -1)])


@_both(constraints.interval, constraints.half_open_interval)
def _to_interval(constraint: Any) -> transforms.Transform:
    lo, hi = constraint.lower_bound, constraint.upper_bound
    if isinstance(lo, numbers.Number) and isinstance(hi, numbers.Number) and lo == 0 \
            and hi == 1:
        return transforms.SigmoidTransform()
    return transforms.ComposeTransform(
        [transforms.SigmoidTransform(), transforms.AffineTransform(lo, hi - lo)])


@biject_to.register(constraints.simplex)
def _biject_to_simplex(constraint: Any) -> transforms.Transform:
    return transforms.StickBreakingTransform()


@transform_to.register(constraints.simplex)
def _transform_to_simplex(constraint: Any) -> transforms.Transform:
    return transforms.SoftmaxTransform()


@transform_to.register(constraints.lower_cholesky)
def _transform_to_lower_cholesky(constraint: Any) -> transforms.Transform:
    return transforms.LowerCholeskyTransform()


@transform_to.register(constraints.positive_definite)
@transform_to.register(constraints.positive_semidefinite)
def _transform_to_positive_definite(constraint: Any) -> transforms.Transform:
    return transforms.PositiveDefiniteTransform()


@_both(constraints.corr_cholesky)
def _to_corr_cholesky(constraint: Any) -> transforms.Transform:
    return transforms.CorrCholeskyTransform()


@biject_to.register(constraints.cat)
def _biject_to_cat(constraint: Any) -> transforms.Transform:
    return transforms.CatTransform([biject_to(c) for c in constraint.cseq], constraint.dim,
                                   constraint.lengths)


@transform_to.register(constraints.cat)
def _transform_to_cat(constraint: Any) -> transforms.Transform:
    return transforms.CatTransform([transform_to(c) for c in constraint.cseq], constraint.dim,
                                   constraint.lengths)


@biject_to.register(constraints.stack)
def _biject_to_stack(constraint: Any) -> transforms.Transform:
    return transforms.StackTransform([biject_to(c) for c in constraint.cseq], constraint.dim)


@transform_to.register(constraints.stack)
def _transform_to_stack(constraint: Any) -> transforms.Transform:
    return transforms.StackTransform([transform_to(c) for c in constraint.cseq], constraint.dim)
