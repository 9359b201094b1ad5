"""Module-level boolean switches that refuse other values, as torch's backend flags do."""

from __future__ import annotations

import sys
import types
from typing import Any, Callable, Iterable


class _FlagError(ValueError, RuntimeError):
    """A backend switch was given something other than a bool."""


class _FlagModule(types.ModuleType):
    """A module whose names in ``_bool_flags`` only take booleans."""

    _bool_flags: frozenset = frozenset()

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._bool_flags and not isinstance(value, bool):
            # torch raises RuntimeError for a non-bool; it is a bad argument, hence ValueError too
            raise _FlagError(f"{self.__name__}.{name} takes True or False, got {value!r}")
        super().__setattr__(name, value)


def guard(module_name: str, names: Iterable[str]) -> None:
    """Make the module ``module_name`` accept only booleans for ``names``."""
    module = sys.modules[module_name]
    module.__class__ = type(_FlagModule.__name__, (_FlagModule,),
                            {"_bool_flags": frozenset(names)})


def guarded(names: Iterable[str], name: str, **values: bool) -> types.ModuleType:
    """A namespace (``backends.cuda.matmul``) whose ``names`` only take booleans."""
    ns = type(_FlagModule.__name__, (_FlagModule,), {"_bool_flags": frozenset(names)})(name)
    for k, v in values.items():
        setattr(ns, k, v)
    return ns


def answer(module_name: str, name: str, value: Any, why: str) -> Callable[[], Any]:
    """A function ``name`` of ``module_name`` that takes nothing and returns ``value``: what
    torch's query of an absent backend answers; ``why`` ends its docstring's first line (the
    module docstring shows the calls)."""
    def query() -> Any:
        return value
    query.__name__ = query.__qualname__ = name
    query.__module__ = module_name
    query.__doc__ = f"Return {value}: {why}."
    return query
