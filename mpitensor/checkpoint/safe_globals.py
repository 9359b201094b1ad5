"""The globals that ``load(..., weights_only=True)`` may rebuild besides tensors and plain
containers: the allow-list behind ``mpitensor.serialization.add_safe_globals`` and the
``safe_globals`` context manager (torch's names and semantics).

An entry is a class or function, or a pair ``(obj, "module.name")`` for an object pickled under
another name. A file that names an allowed global gets it called (as pickle's REDUCE/NEWOBJ
do) and its state set (BUILD), so allow only code you trust.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["add", "get", "clear", "push", "pop", "lookup", "allows_instance"]

_lock = threading.Lock()
_global: Dict[Tuple[str, str], Any] = {}
_scoped = threading.local()  # a stack of dicts, one per active safe_globals block


def _key(entry: Any) -> Tuple[Tuple[str, str], Any]:
    if isinstance(entry, tuple):
        if len(entry) != 2 or not isinstance(entry[1], str) or "." not in entry[1]:
            raise TypeError(f"a safe global given as a tuple must be (object, 'module.name'), "
                            f"got {entry!r}")
        obj, full = entry
        module, _, name = full.rpartition(".")
        return (module, name), obj
    module = getattr(entry, "__module__", None)
    name = getattr(entry, "__qualname__", None) or getattr(entry, "__name__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        raise TypeError(f"cannot tell the module and name of {entry!r}; give it as "
                        f"(object, 'module.name')")
    return (module, name), entry


def _table(entries: List[Any]) -> Dict[Tuple[str, str], Any]:
    if not isinstance(entries, (list, tuple)):
        raise TypeError(f"safe globals must be a list, got {type(entries).__name__}")
    return dict(_key(e) for e in entries)


def add(entries: List[Any]) -> None:
    with _lock:
        _global.update(_table(entries))


def get() -> List[Any]:
    with _lock:
        return [obj if (getattr(obj, "__module__", None), getattr(obj, "__qualname__", None))
                == key else (obj, ".".join(key)) for key, obj in _global.items()]


def clear() -> None:
    with _lock:
        _global.clear()


def push(entries: List[Any]) -> None:
    table = _table(entries)
    stack = getattr(_scoped, "stack", None)
    if stack is None:
        stack = _scoped.stack = []
    stack.append(table)


def pop() -> None:
    _scoped.stack.pop()


def lookup(module: str, name: str) -> Optional[Any]:
    """The allowed object pickled as ``module.name``, or None."""
    for table in reversed(getattr(_scoped, "stack", None) or []):
        if (module, name) in table:
            return table[(module, name)]
    with _lock:
        return _global.get((module, name))


def allows_instance(obj: Any) -> bool:
    """Whether ``obj`` is an instance of an allowed class (its state may be set)."""
    tables = [*(getattr(_scoped, "stack", None) or []), _global]
    allowed = {id(v) for t in tables for v in t.values()}
    return any(id(c) in allowed for c in type(obj).__mro__)
