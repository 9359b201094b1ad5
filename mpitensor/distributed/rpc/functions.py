"""``rpc.functions.async_execution``: a served function that replies later."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

__all__ = ["async_execution"]

F = TypeVar("F", bound=Callable[..., Any])


def async_execution(fn: F) -> F:
    """Mark ``fn`` as returning a Future: the RPC reply is sent when that future completes.

    The worker thread that ran ``fn`` is free as soon as ``fn`` returns, so a function that
    waits on other calls (``rpc_async(...).then(...)``) holds no thread while it waits. Works
    for ``rpc_sync``, ``rpc_async``, ``remote`` and RRef proxies; with ``@staticmethod`` or
    ``@classmethod``, put this decorator inside (closer to the function).

    Example:
        >>> @rpc.functions.async_execution
        ... def add_then_double(to, x):
        ...     return rpc.rpc_async(to, torch.add, args=(x, 1)).then(lambda f: f.wait() * 2)
    """
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    wrapper._wrapped_async_rpc_function = fn  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
