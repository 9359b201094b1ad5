"""The forward hooks of :class:`~mpitensor.nn.Module`: each registration is a :class:`_Hook` in
an ordered :class:`_HookChain`, and :class:`RemovableHandle` (torch's ``utils.hooks`` name) takes
it out again."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Callable

from ._common import _qualified_type

__all__ = ["RemovableHandle"]


class RemovableHandle:
    """Returned by the ``register_*_hook`` methods; ``remove()`` unregisters the hook.

    Also a context manager: the hook is removed on leaving the ``with`` block.

    Example:
        >>> import mpitensor.nn as nn
        >>> m = nn.Identity()
        >>> h = m.register_forward_hook(lambda mod, args, out: None)
        >>> h.remove()
    """

    _counter = itertools.count()

    def __init__(self, chain: _HookChain) -> None:
        self.id = next(RemovableHandle._counter)
        self._chain = chain

    def remove(self) -> None:
        """Unregister the hook (a no-op when it is already gone)."""
        self._chain.discard(self.id)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


class _Hook:
    """One registered callable and the calling convention it asked for."""

    __slots__ = ("key", "fn", "with_kwargs", "always_call")

    def __init__(self, key: int, fn: Callable, with_kwargs: bool, always_call: bool) -> None:
        self.key = key
        self.fn = fn
        self.with_kwargs = with_kwargs
        self.always_call = always_call

    def before(self, module: Any, args: tuple, kwargs: dict) -> tuple:
        """Run as a pre-hook: the (possibly replaced) ``(args, kwargs)``."""
        if not self.with_kwargs:
            new_args = self.fn(module, args)
            if new_args is None:
                return args, kwargs
            return (new_args if isinstance(new_args, tuple) else (new_args,)), kwargs
        replaced = self.fn(module, args, kwargs)
        if replaced is None:
            return args, kwargs
        if isinstance(replaced, tuple) and len(replaced) == 2:
            return replaced
        raise RuntimeError(
            f"a forward pre-hook registered with with_kwargs=True returned {replaced!r}; it "
            f"must return None (keep the inputs) or a pair (args_tuple, kwargs_dict)"
        )

    def after(self, module: Any, args: tuple, kwargs: dict, output: Any) -> Any:
        """Run as a post-hook: the (possibly replaced) output."""
        if self.with_kwargs:
            replaced = self.fn(module, args, kwargs, output)
        else:
            replaced = self.fn(module, args, output)
        return output if replaced is None else replaced


class _HookChain:
    """The hooks of one kind on one module, kept in the order they run.

    ``len()`` and truth test count the hooks, so ``if module._forward_hooks`` stays cheap on
    the call path of hook-free modules.
    """

    __slots__ = ("_hooks",)

    def __init__(self) -> None:
        self._hooks: list = []

    def add(self, fn: Callable, prepend: bool, with_kwargs: bool,
            always_call: bool = False) -> RemovableHandle:
        if not callable(fn):
            raise TypeError(f"a hook must be callable, got {_qualified_type(fn)} {fn!r}")
        handle = RemovableHandle(self)
        hook = _Hook(handle.id, fn, with_kwargs, always_call)
        self._hooks.insert(0 if prepend else len(self._hooks), hook)
        return handle

    def discard(self, key: int) -> None:
        self._hooks = [h for h in self._hooks if h.key != key]

    def snapshot(self) -> list:
        # hooks that add or remove hooks while running must not disturb this call
        return list(self._hooks)

    def __len__(self) -> int:
        return len(self._hooks)

    def __iter__(self) -> Iterator[_Hook]:
        return iter(self.snapshot())

    # torch keeps hooks in an OrderedDict {handle id: hook}; programs read them that way
    def keys(self) -> list:
        return [h.key for h in self._hooks]

    def values(self) -> list:
        return [h.fn for h in self._hooks]

    def items(self) -> list:
        return [(h.key, h.fn) for h in self._hooks]

    def __repr__(self) -> str:
        return f"OrderedDict({self.items()!r})"
