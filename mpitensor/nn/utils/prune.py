"""``nn.utils.prune``: zeroing parts of a parameter through a mask, as torch's pruning does.

Pruning ``module.weight`` moves the parameter to ``weight_orig``, adds the buffer
``weight_mask`` and a forward pre-hook (the pruning method itself) that sets the plain
attribute ``weight = weight_orig * weight_mask`` before every forward. Pruning the same tensor
again gathers the methods in a :class:`PruningContainer`, each new mask computed on the entries
(or, for structured methods, the channels) still unpruned. :func:`remove` makes the pruning
permanent (``weight`` a parameter again, holding the masked values).

Amounts: a float in [0, 1] is a fraction, ``round(amount * n)`` entries (Python's rounding,
halves to even); an int is a count. Scores: absolute values (L1, unstructured) or the
``n``-norm of each slice along ``dim`` (structured). Ties among equal scores go to the lowest
index first (torch's order among ties is its sort kernel's, not documented).

Example:
    >>> import mpitensor as mt
    >>> m = l1_unstructured(mt.nn.Linear(4, 2), "weight", amount=3)
    >>> int((m.weight == 0).sum())
    3
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, Optional

from mpitensor._ops.functions import argsort as _argsort
from mpitensor._ops.random import rand as _rand
from mpitensor.tensor import Tensor

from ..modules.module import Module
from .convert_parameters import parameters_to_vector

__all__ = ["BasePruningMethod", "PruningContainer", "Identity", "RandomUnstructured",
           "L1Unstructured", "RandomStructured", "LnStructured", "CustomFromMask",
           "identity", "random_unstructured", "l1_unstructured", "random_structured",
           "ln_structured", "global_unstructured", "custom_from_mask", "remove", "is_pruned"]


def _pruning_hooks(module: Module) -> list:
    """``(hook key, method)`` of the pruning methods among ``module``'s forward pre-hooks."""
    return [(h.key, h.fn) for h in module._forward_pre_hooks
            if isinstance(h.fn, BasePruningMethod)]


class BasePruningMethod(ABC):
    """A way of pruning one tensor: :meth:`compute_mask` says which entries stay (1) or go (0).

    Subclasses set ``PRUNING_TYPE`` ("unstructured", "structured" with a ``dim``, or "global")
    and define ``compute_mask(t, default_mask)``.
    """

    PRUNING_TYPE: str = "unstructured"
    _tensor_name: Optional[str] = None

    def __call__(self, module: Module, inputs: Any) -> None:
        setattr(module, self._tensor_name, self.apply_mask(module))

    @abstractmethod
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """The new mask for ``t``, combining with ``default_mask`` (the mask so far)."""

    def apply_mask(self, module: Module) -> Tensor:
        """``<name>_orig`` times ``<name>_mask``: the pruned tensor, through autograd."""
        if self._tensor_name is None:
            raise RuntimeError(f"{type(self).__name__} was not applied to a module yet")
        orig = getattr(module, self._tensor_name + "_orig")
        mask = getattr(module, self._tensor_name + "_mask")
        return mask.to(dtype=orig.dtype) * orig

    @classmethod
    def apply(cls, module: Module, name: str, *args: Any,
              importance_scores: Optional[Tensor] = None, **kwargs: Any) -> BasePruningMethod:
        """Prune ``module.<name>`` with a new ``cls(*args, **kwargs)``; returns the method
        (a :class:`PruningContainer` when the tensor was pruned before)."""
        method = cls(*args, **kwargs)
        method._tensor_name = name
        old = [(k, m) for k, m in _pruning_hooks(module) if m._tensor_name == name]
        for k, _ in old:
            module._forward_pre_hooks.discard(k)
        if old:
            previous = old[0][1]
            container = previous if isinstance(previous, PruningContainer) \
                else PruningContainer(previous)
            container.add_pruning_method(method)
            method = container
        orig = getattr(module, name)
        scores = orig if importance_scores is None else importance_scores
        if tuple(scores.shape) != tuple(orig.shape):
            raise ValueError(f"importance_scores should have the shape of parameter {name} "
                             f"({list(orig.shape)}), got {list(scores.shape)}")
        first = not old
        if first:
            module.register_parameter(name + "_orig", orig)
            del module._parameters[name]
            default_mask = orig.detach().new_ones(*orig.shape)
        else:
            default_mask = getattr(module, name + "_mask").detach().clone()
        try:
            mask = method.compute_mask(scores.detach(), default_mask=default_mask)
            module.register_buffer(name + "_mask", mask)
            setattr(module, name, method.apply_mask(module))
            module.register_forward_pre_hook(method)
        except Exception:
            if first:
                module.register_parameter(name, module._parameters.pop(name + "_orig"))
            raise
        return method

    def prune(self, t: Tensor, default_mask: Optional[Tensor] = None,
              importance_scores: Optional[Tensor] = None) -> Tensor:
        """``t`` times the mask computed from ``importance_scores`` (default: ``t``)."""
        scores = t if importance_scores is None else importance_scores
        mask = t.new_ones(*t.shape) if default_mask is None else default_mask
        return t * self.compute_mask(scores, default_mask=mask)

    def remove(self, module: Module) -> None:
        """Make the pruning permanent: ``<name>`` a parameter holding the masked values."""
        name = self._tensor_name
        weight = self.apply_mask(module)
        module.__dict__.pop(name, None)
        orig = module._parameters.pop(name + "_orig")
        orig._data = weight.detach()._data
        del module._buffers[name + "_mask"]
        module.register_parameter(name, orig)


class PruningContainer(BasePruningMethod):
    """The sequence of pruning methods applied to one tensor; its mask is the last method's,
    computed on what the earlier ones left."""

    def __init__(self, *args: Any) -> None:
        self._pruning_methods: tuple = ()
        methods = args[0] if len(args) == 1 and not isinstance(args[0], BasePruningMethod) \
            else args
        for i, method in enumerate(methods):
            if i == 0:
                self._tensor_name = method._tensor_name
            self.add_pruning_method(method)

    def add_pruning_method(self, method: BasePruningMethod) -> None:
        """Append ``method`` (it must prune the same tensor)."""
        if not isinstance(method, BasePruningMethod):
            raise TypeError(f"{type(method).__name__} is not a BasePruningMethod subclass")
        if method._tensor_name != self._tensor_name:
            raise ValueError(f"can only add pruning methods of the tensor "
                             f"{self._tensor_name!r} to this container, got "
                             f"{method._tensor_name!r}")
        self._pruning_methods += (method,)

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self) -> Any:
        return iter(self._pruning_methods)

    def __getitem__(self, idx: int) -> BasePruningMethod:
        return self._pruning_methods[idx]

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        method = self._pruning_methods[-1]
        mask = default_mask.to(dtype=t.dtype)
        if method.PRUNING_TYPE == "unstructured":
            where: Any = default_mask == 1
        elif method.PRUNING_TYPE == "structured":
            dim = method.dim + t.dim() if method.dim < 0 else method.dim
            if not 0 <= dim < t.dim():
                raise IndexError(f"pruning dim {method.dim} is out of range for a "
                                 f"{t.dim()}-D tensor")
            others = [d for d in range(t.dim()) if d != dim]
            alive = default_mask.sum(dim=others) != 0
            where = tuple([slice(None)] * dim + [alive])
        elif method.PRUNING_TYPE == "global":
            where = (...,)
        else:
            raise ValueError(f"unknown PRUNING_TYPE {method.PRUNING_TYPE!r}")
        part = method.compute_mask(t[where], default_mask=default_mask[where])
        mask[where] = part.to(dtype=mask.dtype)
        return mask


def _validate_amount_init(amount: Any) -> None:
    if not isinstance(amount, numbers.Real) or isinstance(amount, bool):
        raise TypeError(f"invalid type for amount: {amount!r}; an int (a count) or a float "
                        f"in [0, 1] (a fraction) is required")
    if (isinstance(amount, numbers.Integral) and amount < 0) or (
            not isinstance(amount, numbers.Integral) and not 0.0 <= float(amount) <= 1.0):
        raise ValueError(f"amount={amount} should either be a float in the range [0, 1] or "
                         f"a non-negative integer")


def _count_to_prune(amount: Any, size: int) -> int:
    """``amount`` as a number of entries out of ``size`` (checked against it)."""
    if isinstance(amount, numbers.Integral):
        if amount > size:
            raise ValueError(f"amount={amount} should be smaller than the number of "
                             f"parameters to prune={size}")
        return int(amount)
    return round(amount * size)


def _lowest(scores: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` smallest entries of the 1-D ``scores`` (ties: lowest index)."""
    return _argsort(scores, stable=True)[:k]


class Identity(BasePruningMethod):
    """Prunes nothing: the mask is all ones (or the existing one)."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return default_mask

    @classmethod
    def apply(cls, module: Module, name: str) -> BasePruningMethod:  # type: ignore[override]
        return super().apply(module, name)


class _Unstructured(BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: Any) -> None:
        _validate_amount_init(amount)
        self.amount = amount

    def _scores(self, t: Tensor) -> Tensor:
        raise NotImplementedError

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        k = _count_to_prune(self.amount, t.numel())
        mask = default_mask.clone()
        if k:
            flat = mask.reshape(-1)
            flat[_lowest(self._scores(t).reshape(-1), k)] = 0
            mask = flat.reshape(*mask.shape)
        return mask

    @classmethod
    def apply(cls, module: Module, name: str, amount: Any,  # type: ignore[override]
              importance_scores: Optional[Tensor] = None) -> BasePruningMethod:
        return super().apply(module, name, amount=amount, importance_scores=importance_scores)


class RandomUnstructured(_Unstructured):
    """Prunes ``amount`` entries chosen at random."""

    def _scores(self, t: Tensor) -> Tensor:
        return _rand(*t.shape, dtype=t.dtype, device=t.device)


class L1Unstructured(_Unstructured):
    """Prunes the ``amount`` entries of smallest absolute value."""

    def _scores(self, t: Tensor) -> Tensor:
        return t.abs()


class _Structured(BasePruningMethod):
    PRUNING_TYPE = "structured"

    def _channel_scores(self, t: Tensor) -> Tensor:
        raise NotImplementedError

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        if t.dim() <= 1:
            raise ValueError(f"structured pruning needs a tensor of at least 2 dimensions, got "
                             f"shape {list(t.shape)}; use unstructured pruning instead")
        dim = self.dim + t.dim() if self.dim < 0 else self.dim
        if not 0 <= dim < t.dim():
            raise IndexError(f"invalid dim {self.dim} for a {t.dim()}-D tensor")
        channels = t.shape[dim]
        k = _count_to_prune(self.amount, channels)
        if not k:
            return default_mask
        pruned = _lowest(self._channel_scores(t, dim), k)
        keep = t.new_ones(channels)
        keep[pruned] = 0
        view = [1] * t.dim()
        view[dim] = channels
        return keep.reshape(*view).expand(*t.shape) * default_mask.to(dtype=t.dtype)


class RandomStructured(_Structured):
    """Prunes ``amount`` channels along ``dim`` chosen at random."""

    def __init__(self, amount: Any, dim: int = -1) -> None:
        _validate_amount_init(amount)
        self.amount = amount
        self.dim = dim

    def _channel_scores(self, t: Tensor, dim: int) -> Tensor:
        return _rand(t.shape[dim], device=t.device)

    @classmethod
    def apply(cls, module: Module, name: str, amount: Any,  # type: ignore[override]
              dim: int = -1) -> BasePruningMethod:
        return super().apply(module, name, amount=amount, dim=dim)


class LnStructured(_Structured):
    """Prunes the ``amount`` channels along ``dim`` of smallest ``n``-norm."""

    def __init__(self, amount: Any, n: Any, dim: int = -1) -> None:
        _validate_amount_init(amount)
        self.amount = amount
        self.n = n
        self.dim = dim

    def _channel_scores(self, t: Tensor, dim: int) -> Tensor:
        others = [d for d in range(t.dim()) if d != dim]
        return t.norm(p=self.n, dim=others)

    @classmethod
    def apply(cls, module: Module, name: str, amount: Any, n: Any,  # type: ignore[override]
              dim: int, importance_scores: Optional[Tensor] = None) -> BasePruningMethod:
        return super().apply(module, name, amount=amount, n=n, dim=dim,
                             importance_scores=importance_scores)


class CustomFromMask(BasePruningMethod):
    """Prunes where a given mask is 0."""

    PRUNING_TYPE = "global"

    def __init__(self, mask: Tensor) -> None:
        self.mask = mask

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        if tuple(default_mask.shape) != tuple(self.mask.shape):
            raise ValueError(f"the mask's shape {list(self.mask.shape)} differs from the "
                             f"tensor's {list(default_mask.shape)}")
        return default_mask * self.mask.to(dtype=default_mask.dtype)

    @classmethod
    def apply(cls, module: Module, name: str, mask: Tensor) -> BasePruningMethod:  # type: ignore[override]
        return super().apply(module, name, mask=mask)


def identity(module: Module, name: str) -> Module:
    """Add pruning's reparametrization to ``module.<name>`` without pruning anything."""
    Identity.apply(module, name)
    return module


def random_unstructured(module: Module, name: str, amount: Any) -> Module:
    """Prune ``amount`` random entries of ``module.<name>``."""
    RandomUnstructured.apply(module, name, amount)
    return module


def l1_unstructured(module: Module, name: str, amount: Any,
                    importance_scores: Optional[Tensor] = None) -> Module:
    """Prune the ``amount`` entries of ``module.<name>`` with the smallest absolute scores."""
    L1Unstructured.apply(module, name, amount=amount, importance_scores=importance_scores)
    return module


def random_structured(module: Module, name: str, amount: Any, dim: int) -> Module:
    """Prune ``amount`` random channels of ``module.<name>`` along ``dim``."""
    RandomStructured.apply(module, name, amount, dim)
    return module


def ln_structured(module: Module, name: str, amount: Any, n: Any, dim: int,
                  importance_scores: Optional[Tensor] = None) -> Module:
    """Prune the ``amount`` channels along ``dim`` with the smallest ``n``-norms."""
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def custom_from_mask(module: Module, name: str, mask: Tensor) -> Module:
    """Prune ``module.<name>`` where ``mask`` is 0."""
    CustomFromMask.apply(module, name, mask)
    return module


def global_unstructured(parameters: Iterable, pruning_method: type,
                        importance_scores: Optional[dict] = None, **kwargs: Any) -> None:
    """Prune the ``(module, name)`` tensors together, as one vector, with an unstructured
    method (``amount`` then counts over all of them).

    Raises:
        TypeError: ``parameters`` is not iterable, or the method is not unstructured.
    """
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    parameters = list(parameters)
    scores = importance_scores if importance_scores is not None else {}
    if not isinstance(scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    vector = parameters_to_vector([scores.get((m, n), getattr(m, n)) for m, n in parameters])
    default_mask = parameters_to_vector([
        getattr(m, n + "_mask", None) if hasattr(m, n + "_mask")
        else getattr(m, n).detach().new_ones(*getattr(m, n).shape) for m, n in parameters])
    method = pruning_method(**kwargs)
    method._tensor_name = "temp"
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(f"only unstructured methods prune globally, got "
                        f"{pruning_method.__name__} ({method.PRUNING_TYPE})")
    container = PruningContainer(method)
    final = container.compute_mask(vector.detach(), default_mask.detach())
    start = 0
    for module, name in parameters:
        param = getattr(module, name)
        count = param.numel()
        custom_from_mask(module, name, final[start:start + count].reshape(*param.shape))
        start += count


def remove(module: Module, name: str) -> Module:
    """Make the pruning of ``module.<name>`` permanent.

    Raises:
        ValueError: ``module.<name>`` is not pruned.
    """
    for key, method in _pruning_hooks(module):
        if method._tensor_name == name:
            method.remove(module)
            module._forward_pre_hooks.discard(key)
            return module
    raise ValueError(f"Parameter '{name}' of module {module} has to be pruned before pruning "
                     f"can be removed")


def is_pruned(module: Module) -> bool:
    """Whether ``module`` or any sub-module has a pruning pre-hook."""
    return any(_pruning_hooks(m) for m in module.modules())
