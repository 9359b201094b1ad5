"""What the location families share: a ``loc`` that is both mean and mode, and for the
univariate ones (Normal, Laplace) a ``scale > 0`` broadcast with it; and the families set by
one ``rate`` (Exponential, Poisson)."""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Optional

from mpitensor.tensor import Tensor

from . import constraints
from .distribution import Distribution

__all__ = ["CenteredAtLoc", "LocScale", "Rated"]


class CenteredAtLoc:
    """Mixin: the distribution's mean and mode are its ``loc`` (it is symmetric about it)."""

    loc: Tensor

    mean = property(attrgetter("loc"), doc="The mean: ``loc``.")
    mode = property(attrgetter("loc"), doc="The mode: ``loc``.")


class LocScale(CenteredAtLoc, Distribution):
    """A distribution on the real line set by a location ``loc`` and a scale ``scale > 0``,
    broadcast together into the batch shape (the event is a scalar)."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True
    _params = ("loc", "scale")  # what expand() expands

    def __init__(self, loc: Any, scale: Any, validate_args: Optional[bool] = None) -> None:
        self._init_params((loc, scale), validate_args)


class Rated(Distribution):
    """A distribution set by one ``rate`` tensor, whose shape is the batch shape (the event is
    a scalar); a family declares the rate's constraint."""

    _params = ("rate",)  # what expand() expands

    def __init__(self, rate: Any, validate_args: Optional[bool] = None) -> None:
        self._init_params((rate,), validate_args)
