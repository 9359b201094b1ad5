"""The :class:`Distribution` base class and the helpers its families share.

A distribution has a ``batch_shape`` (independent, differently parameterised copies) and an
``event_shape`` (the shape of one draw of one copy). ``sample(sample_shape)`` returns a tensor
of shape ``sample_shape + batch_shape + event_shape``; ``log_prob(value)`` one number per
batch element. ``rsample`` is the reparameterised draw (gradients flow into the parameters)
where ``has_rsample`` is True.

With argument validation on (the default, as in torch; see
:meth:`Distribution.set_default_validate_args`), parameters outside their constraint and
values outside the support raise ``ValueError`` before anything is computed.

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.distributions import Normal
    >>> Normal(mt.zeros(3), 1.0).sample((2,)).shape
    mpitensor.Size([2, 3])
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Dict, Optional, Sequence

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor.tensor import Size, Tensor, as_tensor, broadcast_tensors

from . import constraints

__all__ = ["Distribution"]

ShapeLike = Any


def _size(shape: ShapeLike) -> Size:
    if isinstance(shape, int):
        return Size((shape,))
    return Size(tuple(int(s) for s in shape))


def broadcast_all(*values: Any) -> tuple:
    """Return ``values`` as tensors broadcast to one shape (numbers take the dtype of the
    first tensor among them, else the default dtype).

    Raises:
        ValueError: a value that is neither a tensor nor a number.
    """
    ref = next((v for v in values if isinstance(v, Tensor)), None)
    for v in values:
        if not isinstance(v, (Tensor, int, float, np.number)):
            raise ValueError(f"expected tensors or numbers as parameters, got {type(v).__name__}")
    if ref is None:
        dt = _dt.get_default_dtype()
        return tuple(broadcast_tensors(*[as_tensor(float(v), dtype=dt) for v in values]))
    conv = [v if isinstance(v, Tensor) else as_tensor(v, dtype=ref.dtype, device=ref.device)
            for v in values]
    return tuple(broadcast_tensors(*conv))


class lazy_property:  # noqa: N801 - a decorator, named like property
    """A property computed on first access and then kept in the instance (so a parameter given
    as ``probs`` yields ``logits`` only when asked, and the other way round)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.name = fn.__name__

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is None:
            return self
        value = self.fn(obj)
        obj.__dict__[self.name] = value
        return value


def _finfo(t: Tensor) -> Any:
    return _dt.finfo(t.dtype)


class Distribution:
    """Base class of probability distributions, with torch's API.

    Subclasses set ``arg_constraints`` (parameter name -> :mod:`constraints` object),
    ``support``, ``has_rsample`` and implement what they offer among ``rsample``/``sample``,
    ``log_prob``, ``entropy``, ``mean``, ``mode``, ``variance``, ``cdf``, ``icdf``,
    ``enumerate_support`` and ``expand``.

    Args:
        batch_shape: the shape of the batch of distributions.
        event_shape: the shape of one draw.
        validate_args: check parameters (here) and values (in ``log_prob``/``cdf``); None
            takes the default set by :meth:`set_default_validate_args` (True at start).

    Raises:
        ValueError: with validation on, a parameter outside its constraint.
    """

    has_rsample = False
    has_enumerate_support = False
    _validate_args = True
    arg_constraints: Dict[str, constraints.Constraint] = {}
    support: Optional[constraints.Constraint] = None

    @staticmethod
    def set_default_validate_args(value: bool) -> None:
        """Turn the default argument validation of new distributions on or off.

        Raises:
            ValueError: ``value`` is not a bool.
        """
        if value not in (True, False):
            raise ValueError(f"set_default_validate_args() takes True or False, got {value!r}")
        Distribution._validate_args = value

    def __init__(self, batch_shape: ShapeLike = (), event_shape: ShapeLike = (),
                 validate_args: Optional[bool] = None) -> None:
        self._batch_shape = _size(batch_shape)
        self._event_shape = _size(event_shape)
        if validate_args is not None:
            self._validate_args = validate_args
        if self._validate_args:
            for name, constraint in self.arg_constraints.items():
                if constraints.is_dependent(constraint):
                    continue
                if name not in self.__dict__ and isinstance(
                        getattr(type(self), name, None), (property, lazy_property)):
                    continue  # a parameter given another way (probs for logits, ...)
                value = getattr(self, name)
                if not bool(constraint.check(value).all()):
                    raise ValueError(
                        f"{type(self).__name__}: parameter {name} of shape {tuple(value.shape)} "
                        f"must satisfy {constraint!r}, but it has values outside it; pass "
                        f"valid parameters (or validate_args=False to skip this check)")

    batch_shape = property(attrgetter("_batch_shape"),
                           doc="The shape over which parameters are batched.")
    event_shape = property(attrgetter("_event_shape"),
                           doc="The shape of one sample of one distribution of the batch.")

    # a family whose parameters all have the batch shape (and the event's) names them here
    _params: tuple = ()

    def _init_params(self, values: tuple, validate_args: Optional[bool]) -> None:
        """Initialise a family of scalar events whose parameters are ``values``, in the
        order of ``_params``: broadcast together, they are kept under those names and their
        shape is the batch shape."""
        values = broadcast_all(*values)
        for name, value in zip(self._params, values):
            setattr(self, name, value)
        Distribution.__init__(self, values[0].shape, (), validate_args)

    def expand(self, batch_shape: ShapeLike, _instance: Any = None) -> Distribution:
        """Return a new distribution of this kind with its parameters expanded to
        ``batch_shape`` (no copy).

        Raises:
            NotImplementedError: the family does not offer it.
        """
        if not self._params:
            raise NotImplementedError(f"{type(self).__name__} does not implement expand()")
        new = _instance if _instance is not None else type(self).__new__(type(self))
        shape = _size(batch_shape)
        for n in self._params:
            if n in self.__dict__:
                setattr(new, n, self.__dict__[n].expand(*shape, *self.event_shape))
        return _expanded(new, self, shape)

    # -- what families implement ---------------------------------------------------------

    @property
    def mean(self) -> Tensor:
        """The mean of the distribution."""
        raise NotImplementedError(f"{type(self).__name__} does not implement mean")

    @property
    def mode(self) -> Tensor:
        """The mode of the distribution."""
        raise NotImplementedError(f"{type(self).__name__} does not implement mode")

    @property
    def variance(self) -> Tensor:
        """The variance of the distribution."""
        raise NotImplementedError(f"{type(self).__name__} does not implement variance")

    @property
    def stddev(self) -> Tensor:
        """The standard deviation (the square root of :attr:`variance`)."""
        return self.variance.sqrt()

    def sample(self, sample_shape: ShapeLike = ()) -> Tensor:
        """Draw ``sample_shape`` samples (no gradient), of shape ``sample_shape + batch_shape
        + event_shape``."""
        from mpitensor.autograd import no_grad

        with no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape: ShapeLike = ()) -> Tensor:
        """Draw reparameterised samples: gradients flow into the parameters.

        Raises:
            NotImplementedError: the family has no reparameterised sampler.
        """
        raise NotImplementedError(f"{type(self).__name__} has no rsample()")

    def sample_n(self, n: int) -> Tensor:
        """Draw ``n`` samples (the old spelling of ``sample((n,))``)."""
        return self.sample((n,))

    def log_prob(self, value: Any) -> Tensor:
        """Return the log density (or log mass) of ``value``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement log_prob()")

    def cdf(self, value: Any) -> Tensor:
        """Return the cumulative distribution function at ``value``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement cdf()")

    def icdf(self, value: Any) -> Tensor:
        """Return the inverse of the cumulative distribution function at ``value``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement icdf()")

    def entropy(self) -> Tensor:
        """Return the entropy, one number per batch element."""
        raise NotImplementedError(f"{type(self).__name__} does not implement entropy()")

    def enumerate_support(self, expand: bool = True) -> Tensor:
        """Return every value of a discrete support, along a new leading dimension."""
        raise NotImplementedError(f"{type(self).__name__} does not implement "
                                  f"enumerate_support()")

    def perplexity(self) -> Tensor:
        """Return ``exp(entropy)``."""
        return self.entropy().exp()

    # -- helpers ----------------------------------------------------------------------------

    def _extended_shape(self, sample_shape: ShapeLike = ()) -> Size:
        return Size(tuple(_size(sample_shape)) + tuple(self._batch_shape)
                    + tuple(self._event_shape))

    def _validate_sample(self, value: Any) -> None:
        """Raise ValueError unless ``value`` is a tensor broadcastable to this distribution
        whose entries lie in the support."""
        if not isinstance(value, Tensor):
            raise ValueError(f"{type(self).__name__}: the value must be a tensor, got "
                             f"{type(value).__name__}")
        shape = tuple(value.shape)
        ev = tuple(self._event_shape)
        if ev and shape[len(shape) - len(ev):] != ev:
            raise ValueError(f"{type(self).__name__}: the value's rightmost dimensions "
                             f"{shape} must be the event shape {ev}")
        try:
            np.broadcast_shapes(shape, tuple(self._batch_shape) + ev)
        except ValueError:
            raise ValueError(f"{type(self).__name__}: a value of shape {shape} does not "
                             f"broadcast with batch shape {tuple(self._batch_shape)} and event "
                             f"shape {ev}") from None
        support = self.support
        if support is None or constraints.is_dependent(support):
            return
        if not bool(support.check(value).all()):
            raise ValueError(f"{type(self).__name__}: the value has entries outside the "
                             f"support {support!r}; pass values in the support (or "
                             f"validate_args=False to skip this check)")

    def _new(self, cls: type) -> Any:
        return cls.__new__(cls)

    def __repr__(self) -> str:
        names = [k for k in self.arg_constraints if k in self.__dict__]
        parts = []
        for k in names:
            v = self.__dict__[k]
            parts.append(f"{k}: {v if v.numel() == 1 else v.size()}")
        return f"{type(self).__name__}({', '.join(parts)})"


def _expanded(new: Distribution, dist: Distribution, batch_shape: Sequence[int]) -> Any:
    """Finish an ``expand``: ``new`` (its parameters already expanded) takes ``batch_shape``,
    ``dist``'s event shape and ``dist``'s validation switch, with no validation on the way."""
    Distribution.__init__(new, batch_shape, dist.event_shape, validate_args=False)
    new._validate_args = dist._validate_args
    return new
