"""How a call such as ``torch.relu(proxy)`` becomes a graph node.

torch reaches its tracer through ``__torch_function__``, a check that every torch function
pays on every call. mpitensor has no such dispatch path, and adding one to every op would
tax every eager program. Instead, the public functions of ``mpitensor``,
``mpitensor.nn.functional`` and ``mpitensor.linalg`` are swapped for recording wrappers only
while they can meet a :class:`~mpitensor.fx.Proxy`:

* while ``Tracer.trace`` runs (it also swaps such functions inside the traced code's module
  globals, for code that imported them by name), and
* while any Proxy object is alive (for graphs built by hand from proxies, as in
  ``torch.cat([proxy_a, proxy_b])`` at module level).

A reference count decides: the first holder installs the wrappers, the last one to let go
puts the original functions back, and ``trace`` lets go in a ``finally`` clause, so an error
in the traced code restores them too. Outside these windows the namespaces hold the
original functions and eager code pays nothing. A wrapper called without any Proxy among
its arguments simply calls the original function; it compares and hashes equal to it, so
``node.target == torch.add`` holds whichever of the two the name is bound to.
"""

from __future__ import annotations

import threading
import types
import weakref
from typing import Any

_lock = threading.RLock()
_holders = 0
_saved: list = []  # (namespace dict, name, original) put back on the last release


class Recordable:
    """Base of values whose operations are recorded (``fx.Proxy``)."""

    __slots__ = ()


class _Recording:
    """Stands in for a public function while proxies exist: records a node when a Proxy is
    among the arguments, and otherwise calls the function."""

    __slots__ = ("__wrapped__", "__weakref__")

    def __init__(self, fn: Any) -> None:
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        proxy = find_proxy(args, kwargs)
        if proxy is None:
            return self.__wrapped__(*args, **kwargs)
        return proxy.tracer.create_proxy("call_function", self.__wrapped__, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    def __eq__(self, other: Any) -> bool:
        return unwrap(other) is self.__wrapped__

    def __hash__(self) -> int:
        return hash(self.__wrapped__)

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


def unwrap(fn: Any) -> Any:
    """The original function behind a recording wrapper (anything else as it is)."""
    return fn.__wrapped__ if type(fn) is _Recording else fn


def find_proxy(args: Any, kwargs: Any = None) -> Any:
    """The first Proxy inside ``args``/``kwargs`` (through tuples, lists and dicts), or None."""
    stack = [args] if kwargs is None else [args, kwargs]
    while stack:
        a = stack.pop()
        if isinstance(a, Recordable):
            return a
        if isinstance(a, (tuple, list)):
            stack.extend(reversed(a))
        elif isinstance(a, dict):
            stack.extend(reversed(list(a.values())))
        elif isinstance(a, slice):
            stack.extend((a.step, a.stop, a.start))
    return None


def _namespaces() -> list:
    import mpitensor
    import mpitensor.nn.functional as functional

    return [vars(mpitensor), vars(functional), vars(mpitensor.linalg)]


_RECORDABLE = (types.FunctionType, types.BuiltinFunctionType)


def _originals() -> dict:
    """id(original) -> its wrapper, for every public function of the namespaces."""
    found: dict = {}
    for ns in _namespaces():
        for name, val in list(ns.items()):
            if not name.startswith("_") and isinstance(val, _RECORDABLE):
                found.setdefault(id(val), _Recording(val))
    return found


_WRAPPERS: dict = {}


def _swap(ns: dict) -> None:
    for name, val in list(ns.items()):
        w = _WRAPPERS.get(id(val)) if isinstance(val, _RECORDABLE) else None
        if w is not None and w.__wrapped__ is val:
            _saved.append((ns, name, val))
            ns[name] = w


def hold(extra_globals: tuple = ()) -> None:
    """Take a reference: install the wrappers if nobody held them; also swap the functions
    bound in each dict of ``extra_globals`` until this hold is released."""
    global _holders
    with _lock:
        if not _WRAPPERS:
            _WRAPPERS.update(_originals())
        if _holders == 0:
            for ns in _namespaces():
                _swap(ns)
        for g in extra_globals:
            _swap(g)
        _holders += 1


def release() -> None:
    """Let go of a reference; the last one puts every original function back."""
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0:
            while _saved:
                ns, name, original = _saved.pop()
                if type(ns.get(name)) is _Recording:
                    ns[name] = original


_tracing = 0


def hold_while_alive(obj: Any) -> None:
    """Hold the wrappers for as long as ``obj`` lives, unless a trace holds them already
    (its proxies may outlive it in a traceback, and must not keep the wrappers in place)."""
    if _tracing:
        return
    hold()
    weakref.finalize(obj, release)


class tracing:
    """Context manager of ``Tracer.trace``: holds the wrappers (and swaps the functions of
    ``extra_globals``) for the duration of the trace."""

    def __init__(self, extra_globals: tuple) -> None:
        self.extra = extra_globals

    def __enter__(self) -> None:
        global _tracing
        hold(self.extra)
        _tracing += 1

    def __exit__(self, *exc: Any) -> None:
        global _tracing
        _tracing -= 1
        release()


def active() -> bool:
    """Whether the recording wrappers are installed now."""
    return _holders > 0
