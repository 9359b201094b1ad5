"""How a call such as ``torch.relu(proxy)`` becomes a graph node.

torch reaches its tracer through ``__torch_function__``, a check every torch function pays on
every call. mpitensor has no such per-call dispatch path, and adding one to every op would
tax every eager program. Instead, the public functions of ``mpitensor``,
``mpitensor.nn.functional`` and ``mpitensor.linalg`` get a recording body only while they
can meet a :class:`~mpitensor.fx.Proxy`:

* while ``Tracer.trace`` runs, and
* while a Proxy made outside a trace is alive (graphs built by hand from proxies, as in
  ``torch.cat([proxy_a, proxy_b])`` at module level, or a ``Transformer`` at work).

The function objects themselves stay in place: only their ``__code__`` is swapped for a
short trampoline that records a ``call_function`` node when a Proxy is among the arguments
and otherwise calls a copy of the original function. So ``node.target is torch.relu``
holds, and names imported early (``from mpitensor import relu``) record too. A reference
count decides: the first holder swaps the code in, the last one to let go puts every
original ``__code__`` back, and ``trace`` lets go in a ``finally`` clause, so an error in
the traced code restores them too. Outside these windows the functions run their own code
and eager programs pay nothing.
"""

from __future__ import annotations

import operator
import threading
import types
import weakref
from typing import Any

_lock = threading.RLock()
_holders = 0
_tracing = 0
_saved: list = []  # (function, its own __code__) put back on the last release
_CALL = "__mpitensor_fx_record__"  # bound in each swapped function's globals meanwhile
_ENTRY = "__mpitensor_fx_entry__"  # placeholder constant of the trampoline template
_TEMPLATES: dict = {}  # free-variable names -> trampoline code with those names


class Recordable:
    """Base of values whose operations are recorded (``fx.Proxy``)."""

    __slots__ = ()


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


def _record(entry: tuple, args: tuple, kwargs: dict) -> Any:
    own, kind, target, reflected = entry
    proxy = find_proxy(args, kwargs)
    if proxy is None:
        return own(*args, **kwargs)
    if reflected:  # tensor.__radd__(proxy) computes proxy + tensor
        args = (args[1], args[0]) + args[2:]
    return proxy.tracer.create_proxy(kind, target, args, kwargs)


def _template(freevars: tuple) -> types.CodeType:
    """Trampoline code whose closure takes the same cells as the function it replaces."""
    code = _TEMPLATES.get(freevars)
    if code is None:
        lines = ["def _outer():"] + [f"    {v} = None" for v in freevars]
        lines.append("    def _trampoline(*args, **kwargs):")
        if freevars:
            lines.append("        " + ", ".join(freevars))  # makes them free variables
        lines += [f"        return {_CALL}({_ENTRY!r}, args, kwargs)", "    return _trampoline"]
        ns: dict = {}
        exec("\n".join(lines), ns)  # noqa: S102 - fixed template, names from code objects
        code = ns["_outer"]().__code__
        _TEMPLATES[freevars] = code
    return code


_BINARY = {"add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
           "xor", "lshift", "rshift", "eq", "ne", "lt", "le", "gt", "ge"}


def _tensor_method_node(name: str) -> Any:
    """(kind, target, reflected) recorded for ``Tensor.<name>`` called with a Proxy among
    its arguments, or None for the methods that are never recorded."""
    if not name.startswith("__"):
        return "call_method", name, False
    bare = name[2:-2]
    if bare in ("getitem", "setitem"):
        return "call_function", getattr(operator, bare), False
    for reflected, op in ((False, bare), (True, bare[1:])):
        if op in _BINARY and (not reflected or bare.startswith("r")):
            return "call_function", getattr(operator, op + "_" if op in ("and", "or")
                                            else op), reflected
    return None


def _recordable_functions() -> list:
    """(function, kind, target, reflected) for each function that records while swapped:
    the public functions of the three namespaces, and the Tensor methods (a real tensor
    meeting a proxy argument: ``table[:, :proxy]``, ``weight.mul(proxy)``)."""
    import mpitensor
    import mpitensor.linalg as linalg
    import mpitensor.nn.functional as functional
    from mpitensor.tensor import Tensor

    seen: dict = {}
    for ns in (mpitensor, functional, linalg):
        for name, val in vars(ns).items():
            if not name.startswith("_") and isinstance(val, types.FunctionType):
                seen.setdefault(id(val), (val, "call_function", val, False))
    for name, val in vars(Tensor).items():
        node = _tensor_method_node(name)
        if node is not None and isinstance(val, types.FunctionType):
            seen.setdefault(id(val), (val, *node))
    return list(seen.values())


def _swap_in() -> None:
    for fn, kind, target, reflected in _recordable_functions():
        code = fn.__code__
        template = _template(code.co_freevars)
        if template.co_freevars != code.co_freevars:
            continue  # cannot share the closure: such a function runs unrecorded
        own = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__,
                                 fn.__closure__)
        own.__kwdefaults__ = fn.__kwdefaults__
        entry = (own, kind, target, reflected)
        consts = tuple(entry if isinstance(c, str) and c == _ENTRY else c
                       for c in template.co_consts)
        fn.__globals__[_CALL] = _record
        _saved.append((fn, code))
        fn.__code__ = template.replace(co_consts=consts, co_name=code.co_name,
                                       co_qualname=code.co_qualname,
                                       co_filename=code.co_filename,
                                       co_firstlineno=code.co_firstlineno)


def _swap_out() -> None:
    while _saved:
        fn, code = _saved.pop()
        fn.__code__ = code
        fn.__globals__.pop(_CALL, None)


def hold() -> None:
    """Take a reference: swap the recording code in if nobody held it."""
    global _holders
    with _lock:
        if _holders == 0:
            _swap_in()
        _holders += 1


def release() -> None:
    """Let go of a reference; the last one puts every original ``__code__`` back."""
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0:
            _swap_out()


def hold_while_alive(obj: Any) -> None:
    """Hold the recording code for as long as ``obj`` lives, unless a trace holds it already
    (its proxies may outlive it in a traceback, and must not keep the code swapped)."""
    if _tracing:
        return
    hold()
    weakref.finalize(obj, release)


class tracing:
    """Context manager of ``Tracer.trace``: holds the recording code for the trace."""

    def __enter__(self) -> None:
        global _tracing
        hold()
        _tracing += 1

    def __exit__(self, *exc: Any) -> None:
        global _tracing
        _tracing -= 1
        release()


def active() -> bool:
    """Whether the recording code is swapped in now."""
    return _holders > 0
