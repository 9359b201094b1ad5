"""``nn.utils.parametrize``: a module's tensor computed from stored originals on every access.

``register_parametrization(module, "weight", P)`` moves the parameter to
``module.parametrizations.weight.original`` and gives the module's class (a subclass made for
this module alone, ``Parametrized<Class>``) a property ``weight`` whose getter returns
``P(original)`` through autograd, so gradients reach the original. Several parametrizations on
one name chain (``P2(P1(original))``); when the first one defines ``right_inverse``, assigning
``module.weight = value`` stores ``right_inverse(value)`` in the original(s); a
``right_inverse`` that returns several tensors gives ``original0``, ``original1``... State-dict
keys are torch's (``parametrizations.weight.original``). ``cached()`` computes each
parametrized tensor once inside its ``with`` block; ``remove_parametrizations`` makes the
current value (or the original) a plain parameter again and restores the class.

Example:
    >>> import mpitensor as mt
    >>> class Symmetric(mt.nn.Module):
    ...     def forward(self, x):
    ...         return x.triu() + x.triu(1).transpose(-1, -2)
    >>> layer = mt.nn.Linear(3, 3)
    >>> _ = register_parametrization(layer, "weight", Symmetric())
    >>> bool((layer.weight == layer.weight.T).all())
    True
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from typing import Any, Optional

from mpitensor.autograd import no_grad
from mpitensor.tensor import Tensor

from ..modules.container import ModuleDict, ModuleList
from ..modules.module import Module
from ..parameter import Parameter

__all__ = ["register_parametrization", "remove_parametrizations", "is_parametrized", "cached",
           "type_before_parametrizations", "transfer_parametrizations_and_params",
           "ParametrizationList"]

_cache_depth = 0
_cache: dict = {}


@contextlib.contextmanager
def cached() -> Iterator[None]:
    """Inside the block, each parametrized tensor is computed once and reused.

    Example:
        >>> import mpitensor as mt
        >>> with cached():
        ...     pass
    """
    global _cache_depth
    _cache_depth += 1
    try:
        yield
    finally:
        _cache_depth -= 1
        if not _cache_depth:
            _cache.clear()


def _set_data(target: Tensor, value: Tensor) -> None:
    """Give ``target`` (a parameter or buffer) ``value``'s values, keeping its identity."""
    with no_grad():
        v = value.detach()
        if tuple(v.shape) == tuple(target.shape) and v.dtype == target.dtype:
            target.copy_(v)
        else:
            target._data = v.clone()._data
            target.grad = None


def _register_tensor(module: Module, name: str, value: Tensor) -> None:
    if isinstance(value, Parameter):
        module.register_parameter(name, value)
    else:
        module.register_buffer(name, value)


class ParametrizationList(ModuleList):
    """The chain of parametrizations of one tensor and its original(s) (``original`` or
    ``original0``, ``original1``...); calling it computes the parametrized tensor."""

    def __init__(self, modules: Sequence[Module], original: Tensor, unsafe: bool = False) -> None:
        if not modules:
            raise ValueError("ParametrizationList needs at least one parametrization")
        super().__init__(modules)
        self.unsafe = unsafe
        shape, dtype = tuple(original.shape), original.dtype
        new = original
        with no_grad():
            for m in reversed(list(self)):
                inverse = getattr(m, "right_inverse", None)
                if inverse is not None:
                    new = inverse(new)
        self.is_tensor = isinstance(new, Tensor)
        self.ntensors = 1 if self.is_tensor else len(new)
        if self.is_tensor:
            if not unsafe and new.dtype != dtype:
                raise ValueError(f"right_inverse must keep the dtype: the tensor is {dtype}, "
                                 f"right_inverse returned {new.dtype}")
            if new is not original:
                _set_data(original, new)
            _register_tensor(self, "original", original)
        else:
            for i, part in enumerate(new):
                if not isinstance(part, Tensor):
                    raise ValueError(f"right_inverse must return tensors, got {type(part)} at "
                                     f"position {i}")
                if isinstance(original, Parameter):
                    part = Parameter(part.detach().clone(), original.requires_grad)
                _register_tensor(self, f"original{i}", part)
        if not unsafe:
            self._check_forward(shape, dtype)

    def _check_forward(self, shape: tuple, dtype: Any) -> None:
        with no_grad():
            z = self()
        if not isinstance(z, Tensor):
            raise ValueError(f"a parametrization must return a tensor, got {type(z).__name__}")
        if tuple(z.shape) != shape or z.dtype != dtype:
            raise ValueError(
                f"registering a parametrization may not change the tensor's shape or dtype "
                f"(unless unsafe=True): it was {list(shape)} {dtype}, the parametrization "
                f"gives {list(z.shape)} {z.dtype}")

    def originals(self) -> tuple:
        """The stored tensors the chain starts from."""
        if self.is_tensor:
            return (self.original,)
        return tuple(getattr(self, f"original{i}") for i in range(self.ntensors))

    def right_inverse(self, value: Tensor) -> None:
        """Store ``value`` by running the chain's ``right_inverse`` methods, last first.

        Raises:
            RuntimeError: a parametrization in the chain has no ``right_inverse``.
        """
        with no_grad():
            for m in reversed(list(self)):
                inverse = getattr(m, "right_inverse", None)
                if inverse is None:
                    raise RuntimeError(f"parametrization {type(m).__name__} does not define "
                                       f"right_inverse, so the tensor cannot be assigned")
                value = inverse(value)
            parts = (value,) if self.is_tensor else tuple(value)
            if len(parts) != self.ntensors:
                raise ValueError(f"right_inverse returned {len(parts)} tensors, the "
                                 f"parametrization stores {self.ntensors}")
            for target, part in zip(self.originals(), parts):
                if not self.unsafe and part.dtype != target.dtype:
                    raise ValueError(f"right_inverse returned dtype {part.dtype}, the "
                                     f"original is {target.dtype}")
                _set_data(target, part)

    def forward(self) -> Tensor:
        first, *rest = list(self)
        x = first(*self.originals())
        for m in rest:
            x = m(x)
        return x


def _getstate(self: Any) -> Any:
    raise RuntimeError("a parametrized module cannot be pickled; save its state_dict() and "
                       "load it into a module parametrized the same way")


def _deepcopy(self: Any, memo: dict) -> Any:
    found = memo.get(id(self))
    if found is not None:
        return found
    replica = self.__new__(self.__class__)
    memo[id(self)] = replica
    replica.__dict__ = copy.deepcopy(self.__dict__, memo)
    return replica


def _inject_class(module: Module) -> None:
    cls = module.__class__
    module.__class__ = type(f"Parametrized{cls.__name__}", (cls,),
                            {"__getstate__": _getstate, "__deepcopy__": _deepcopy,
                             "_parametrized_base": cls, "__module__": cls.__module__})


def _inject_property(module: Module, name: str) -> None:
    def get(self: Module) -> Tensor:
        chain = self.parametrizations[name]
        if not _cache_depth:
            return chain()
        key = (id(self), name)
        if key not in _cache:
            _cache[key] = chain()
        return _cache[key]

    def put(self: Module, value: Tensor) -> None:
        self.parametrizations[name].right_inverse(value)

    setattr(module.__class__, name, property(get, put))


def register_parametrization(module: Module, tensor_name: str, parametrization: Module, *,
                             unsafe: bool = False) -> Module:
    """Make ``module.<tensor_name>`` be ``parametrization(original)`` on every access.

    Args:
        module: the module holding the parameter or buffer.
        tensor_name: its attribute name.
        parametrization: a Module whose ``forward`` maps the original(s) to the tensor; an
            optional ``right_inverse`` maps a tensor back to the original(s).
        unsafe: skip the checks that the shape and dtype are kept.

    Returns:
        ``module``.

    Raises:
        ValueError: no parameter or buffer ``tensor_name``, or the shape/dtype changes.
    """
    if not isinstance(parametrization, Module):
        raise TypeError(f"a parametrization must be an nn.Module, got "
                        f"{type(parametrization).__name__}")
    if is_parametrized(module, tensor_name):
        chain = module.parametrizations[tensor_name]
        if not unsafe:
            shape, dtype = tuple(getattr(module, tensor_name).shape), \
                getattr(module, tensor_name).dtype
        chain.append(parametrization)
        chain.unsafe |= unsafe
        if not unsafe:
            chain._check_forward(shape, dtype)
        return module
    if tensor_name in module._parameters:
        original = module._parameters[tensor_name]
    elif tensor_name in module._buffers:
        original = module._buffers[tensor_name]
    else:
        raise ValueError(f"module '{type(module).__name__}' has no parameter or buffer named "
                         f"'{tensor_name}'")
    if original is None:
        raise ValueError(f"'{tensor_name}' of {type(module).__name__} is None; there is "
                         f"nothing to parametrize")
    chain = ParametrizationList([parametrization], original, unsafe=unsafe)
    delattr(module, tensor_name)
    if not is_parametrized(module):
        _inject_class(module)
        module.parametrizations = ModuleDict()
    _inject_property(module, tensor_name)
    module.parametrizations[tensor_name] = chain
    return module


def is_parametrized(module: Module, tensor_name: Optional[str] = None) -> bool:
    """Whether ``module`` has a parametrization (on ``tensor_name``, when given)."""
    chains = module.__dict__.get("_modules", {}).get("parametrizations")
    if not isinstance(chains, ModuleDict):
        return False
    return len(chains) > 0 if tensor_name is None else tensor_name in chains


def remove_parametrizations(module: Module, tensor_name: str,
                            leave_parametrized: bool = True) -> Module:
    """Undo the parametrizations on ``tensor_name``: a plain parameter (or buffer) again.

    Args:
        leave_parametrized: keep the current parametrized value (True) or the original.

    Raises:
        ValueError: ``tensor_name`` is not parametrized, or ``leave_parametrized=False`` on a
            tensor stored as several originals.
    """
    if not is_parametrized(module, tensor_name):
        raise ValueError(f"module {type(module).__name__} has no parametrization on "
                         f"{tensor_name!r}")
    chain = module.parametrizations[tensor_name]
    if chain.is_tensor:
        original = chain.original
        if leave_parametrized:
            with no_grad():
                value = getattr(module, tensor_name)
            _set_data(original, value)
    else:
        if not leave_parametrized:
            raise ValueError("leave_parametrized=False needs a tensor stored as one original; "
                             f"{tensor_name!r} is stored as {chain.ntensors}")
        with no_grad():
            value = getattr(module, tensor_name).detach().clone()
        was_param = isinstance(chain.original0, Parameter)
        original = Parameter(value, chain.original0.requires_grad) if was_param else value
    delattr(module.__class__, tensor_name)
    del module.parametrizations[tensor_name]
    _register_tensor(module, tensor_name, original)
    if not is_parametrized(module):
        delattr(module, "parametrizations")
        module.__class__ = module.__class__._parametrized_base
    return module


def type_before_parametrizations(module: Module) -> type:
    """The module's class as it was before any parametrization was registered."""
    if is_parametrized(module):
        return module.__class__._parametrized_base
    return type(module)


def transfer_parametrizations_and_params(from_module: Module, to_module: Module,
                                         tensor_name: Optional[str] = None) -> Module:
    """Register ``from_module``'s parametrizations (all, or ``tensor_name``'s) on
    ``to_module`` too, with copies of their originals' values."""
    if not is_parametrized(from_module):
        return to_module
    names = list(from_module.parametrizations) if tensor_name is None else [tensor_name]
    for name in names:
        src = from_module.parametrizations[name]
        if not hasattr(to_module, name):
            setattr(to_module, name, Parameter(getattr(from_module, name).detach().clone()))
        for p in src:
            register_parametrization(to_module, name, p, unsafe=src.unsafe)
        for dst, value in zip(to_module.parametrizations[name].originals(), src.originals()):
            _set_data(dst, value)
    return to_module
