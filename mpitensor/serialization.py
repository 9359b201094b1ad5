"""``mpitensor.serialization`` (``torch.serialization``): ``save``/``load`` and the allow-list of
globals that ``load(..., weights_only=True)`` may rebuild.

``weights_only=True`` (the default) loads tensors, parameters, containers and numbers and calls
nothing else. A file that holds other objects (a whole model saved with ``save(model, ...)``,
a custom class in a checkpoint) is refused with an error naming the global; load it with
``weights_only=False`` if you trust the file, or allow just its classes:

Example:
    >>> import mpitensor as torch
    >>> class Config:
    ...     pass
    >>> torch.serialization.add_safe_globals([Config])
    >>> with torch.serialization.safe_globals([Config]):   # only inside the block
    ...     pass
    >>> Config in torch.serialization.get_safe_globals()
    True
    >>> torch.serialization.clear_safe_globals()
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, List, Optional, Type

from .checkpoint import load, save
from .checkpoint import safe_globals as _safe_globals

__all__ = ["save", "load", "add_safe_globals", "get_safe_globals", "clear_safe_globals",
           "safe_globals"]


def add_safe_globals(safe_globals: List[Any]) -> None:
    """Allow these classes and functions (or ``(object, "module.name")`` pairs) in files loaded
    with ``weights_only=True``, for the rest of the process."""
    _safe_globals.add(safe_globals)


def get_safe_globals() -> List[Any]:
    """The globals :func:`add_safe_globals` allowed."""
    return _safe_globals.get()


def clear_safe_globals() -> None:
    """Forget every global :func:`add_safe_globals` allowed."""
    _safe_globals.clear()


class safe_globals:  # noqa: N801 - torch's name
    """A context manager: these globals are allowed inside the ``with`` block only (in this
    thread)."""

    def __init__(self, safe_globals: List[Any]) -> None:
        self.safe_globals = safe_globals

    def __enter__(self) -> None:
        _safe_globals.push(self.safe_globals)

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        _safe_globals.pop()
