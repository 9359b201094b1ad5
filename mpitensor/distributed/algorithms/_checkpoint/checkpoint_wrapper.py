"""``torch.distributed.algorithms._checkpoint.checkpoint_wrapper``: wrap modules so that their
forward runs under :func:`mpitensor.utils.checkpoint.checkpoint`.

``checkpoint_wrapper(module)`` returns a :class:`CheckpointWrapper` holding the module as
``_checkpoint_wrapped_module``; its state dict is the module's, key for key (the wrapper adds
no name to the keys, as torch's does), so checkpoints load with or without the wrapping.
``apply_activation_checkpointing(model, check_fn=...)`` wraps, in place, every sub-module
``check_fn`` accepts (or that ``auto_wrap_policy`` picks), the usual way to checkpoint each
transformer block of a model before ``fully_shard`` or FSDP.

Example:
    >>> import functools
    >>> import mpitensor as torch
    >>> from mpitensor.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    ...     apply_activation_checkpointing)
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    >>> apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, torch.nn.Linear))
    >>> type(model[0]).__name__
    'CheckpointWrapper'
"""

from __future__ import annotations

import enum
import functools
from typing import Any, Callable, Iterator, Optional, Tuple

from mpitensor.nn import Module
from mpitensor.utils.checkpoint import checkpoint

__all__ = ["CheckpointImpl", "CheckpointWrapper", "checkpoint_wrapper",
           "apply_activation_checkpointing", "ActivationWrapper", "offload_wrapper"]

_WRAPPED = "_checkpoint_wrapped_module"


class CheckpointImpl(enum.Enum):
    """Which variant of :func:`checkpoint` a wrapper runs."""

    REENTRANT = 1
    NO_REENTRANT = 2


class ActivationWrapper(Module):
    """Base of the wrappers: holds the module as ``_checkpoint_wrapped_module`` and passes
    attribute lookups it does not know on to it; state dict keys carry no name for it."""

    _transparent_child = _WRAPPED

    def __init__(self, mod: Module) -> None:
        super().__init__()
        if not isinstance(mod, Module):
            raise TypeError(f"checkpoint_wrapper wraps an nn.Module, got {type(mod).__name__}")
        self._checkpoint_wrapped_module = mod

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__") or "_modules" not in self.__dict__:
                raise
            return getattr(self._modules[_WRAPPED], name)

    def __getitem__(self, key: Any) -> Any:  # a wrapped Sequential or ModuleList stays indexable
        return self._modules[_WRAPPED].__getitem__(key)


class CheckpointWrapper(ActivationWrapper):
    """A module whose forward runs the wrapped module's under activation checkpointing."""

    def __init__(self, mod: Module, checkpoint_impl: CheckpointImpl = CheckpointImpl.NO_REENTRANT,
                 checkpoint_fn: Optional[Callable] = None, **checkpoint_fn_kwargs: Any) -> None:
        super().__init__(mod)
        if not isinstance(checkpoint_impl, CheckpointImpl):
            raise TypeError(f"checkpoint_wrapper: checkpoint_impl must be a CheckpointImpl, "
                            f"got {checkpoint_impl!r}")
        self.checkpoint_impl = checkpoint_impl
        if checkpoint_fn is None:
            self.checkpoint_fn = functools.partial(
                checkpoint, use_reentrant=checkpoint_impl is CheckpointImpl.REENTRANT,
                **checkpoint_fn_kwargs)
        else:
            self.checkpoint_fn = functools.partial(checkpoint_fn, **checkpoint_fn_kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        inner = self._modules[_WRAPPED]
        if self.checkpoint_impl is CheckpointImpl.REENTRANT and kwargs:
            # the reentrant variant takes positional arguments only: carry the keyword ones
            # among them, and put them back by name inside
            keys = tuple(kwargs)
            n = len(args)

            def run(*flat: Any) -> Any:
                return inner(*flat[:n], **dict(zip(keys, flat[n:])))
            return self.checkpoint_fn(run, *args, *kwargs.values())
        return self.checkpoint_fn(inner, *args, **kwargs)


def checkpoint_wrapper(module: Module, checkpoint_impl: CheckpointImpl = CheckpointImpl.NO_REENTRANT,
                       checkpoint_fn: Optional[Callable] = None,
                       **checkpoint_fn_kwargs: Any) -> Module:
    """``module`` wrapped in a :class:`CheckpointWrapper` (the module itself is not copied)."""
    return CheckpointWrapper(module, checkpoint_impl, checkpoint_fn, **checkpoint_fn_kwargs)


def offload_wrapper(module: Module) -> Module:
    """torch's CPU-offload wrapper: activations saved for backward go to host memory. Every
    mpitensor tensor of a NumPy model already lives there; for CuPy models it is not built."""
    raise NotImplementedError("offload_wrapper: moving saved activations to the host is not "
                              "built; use checkpoint_wrapper to save their memory instead")


def apply_activation_checkpointing(model: Module,
                                   checkpoint_wrapper_fn: Callable[[Module], Module] = checkpoint_wrapper,
                                   check_fn: Callable[[Module], bool] = lambda _: True,
                                   auto_wrap_policy: Optional[Callable[..., bool]] = None) -> None:
    """Wrap, in place, each sub-module of ``model`` that ``check_fn`` accepts (or, given
    ``auto_wrap_policy``, that the policy picks) with ``checkpoint_wrapper_fn``; a wrapped
    module's own sub-modules are not visited again. ``model`` itself is never wrapped.

    Raises:
        TypeError: ``check_fn`` or ``checkpoint_wrapper_fn`` not callable.
    """
    if not callable(check_fn) or not callable(checkpoint_wrapper_fn):
        raise TypeError("apply_activation_checkpointing: check_fn and checkpoint_wrapper_fn "
                        "must be callables")
    pick = check_fn
    if auto_wrap_policy is not None:
        def pick(m: Module) -> bool:
            n = sum(p.numel() for p in m.parameters())
            return bool(auto_wrap_policy(module=m, recurse=False, nonwrapped_numel=n))
    _wrap_children(model, pick, checkpoint_wrapper_fn)


def _wrap_children(parent: Module, pick: Callable[[Module], bool],
                   wrap: Callable[[Module], Module]) -> None:
    for name, child in list(parent._modules.items()):
        if child is None or isinstance(child, ActivationWrapper):
            continue
        if pick(child):
            parent._modules[name] = wrap(child)
        else:
            _wrap_children(child, pick, wrap)
