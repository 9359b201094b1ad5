"""How a call such as ``torch.relu(proxy)`` becomes a graph node.

torch reaches its tracer through ``__torch_function__``, a check every torch function pays on
every call. mpitensor has no such per-call dispatch path, and adding one to every op would
tax every eager program. Instead, the public functions of ``mpitensor``,
``mpitensor.nn.functional`` and ``mpitensor.linalg`` get a recording body only while they
can meet a :class:`~mpitensor.fx.Proxy`:

* while ``Tracer.trace`` runs (the methods of ``Tensor`` too, for a real tensor meeting a
  proxy), and
* while a Proxy made outside a trace is alive (graphs built by hand from proxies, as in
  ``torch.cat([proxy_a, proxy_b])`` at module level, or a ``Transformer`` at work); eager
  ops run meanwhile pay a small check per public function call (about 1.5x on a tiny
  ``torch.add``), nothing once the last such proxy is gone.

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
_tracing = 0
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


_MAY_HOLD_PROXY = (Recordable, tuple, list, dict, slice)


def _record(entry: tuple, args: tuple, kwargs: dict) -> Any:
    own, kind, target, reflected = entry
    for a in args:  # the common case, plain tensors and numbers, is settled here
        if isinstance(a, _MAY_HOLD_PROXY):
            break
    else:
        for a in kwargs.values():
            if isinstance(a, _MAY_HOLD_PROXY):
                break
        else:
            return own(*args, **kwargs)
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


def _namespace_functions() -> list:
    """(function, kind, target, reflected) for the public functions of the namespaces."""
    import mpitensor
    import mpitensor.linalg as linalg
    import mpitensor.nn.functional as functional

    seen: dict = {}
    for ns in (mpitensor, functional, linalg):
        for name, val in vars(ns).items():
            if not name.startswith("_") and isinstance(val, types.FunctionType):
                seen.setdefault(id(val), (val, "call_function", val, False))
    return list(seen.values())


def _tensor_methods() -> list:
    """The same for the Tensor methods (a real tensor meeting a proxy argument:
    ``table[:, :proxy]``, ``weight.mul(proxy)``), which only a running trace swaps: eager
    ops call many of them, so keeping them swapped for a hand-made proxy's lifetime
    would slow every op down."""
    from mpitensor.tensor import Tensor

    found = []
    for name, val in vars(Tensor).items():
        node = _tensor_method_node(name)
        if node is not None and isinstance(val, types.FunctionType):
            found.append((val, *node))
    return found


def _swap_in(entries: list, saved: list) -> None:
    for fn, kind, target, reflected in entries:
        if fn.__code__ in _SWAPPED_CODES:
            continue  # already recording (also listed in another table)
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
        saved.append((fn, code))
        fn.__code__ = template.replace(co_consts=consts, co_name=code.co_name,
                                       co_qualname=code.co_qualname,
                                       co_filename=code.co_filename,
                                       co_firstlineno=code.co_firstlineno)
        _SWAPPED_CODES.add(fn.__code__)


def _swap_out(saved: list) -> None:
    while saved:
        fn, code = saved.pop()
        _SWAPPED_CODES.discard(fn.__code__)
        fn.__code__ = code
        # _CALL stays bound in the module's globals: harmless, and other swapped
        # functions of the same module may still use it


_SWAPPED_CODES: set = set()
_TABLES = {"functions": (_namespace_functions, []), "methods": (_tensor_methods, [])}
_COUNTS = {"functions": 0, "methods": 0}


def hold(methods: bool = False) -> None:
    """Take a reference: swap the recording code into the public functions (and, with
    ``methods``, the Tensor methods) if nobody held it."""
    with _lock:
        for table in ("functions", "methods") if methods else ("functions",):
            if _COUNTS[table] == 0:
                entries, saved = _TABLES[table]
                _swap_in(entries(), saved)
            _COUNTS[table] += 1


def release(methods: bool = False) -> None:
    """Let go of a reference; the last one puts every original ``__code__`` back."""
    with _lock:
        for table in ("functions", "methods") if methods else ("functions",):
            _COUNTS[table] -= 1
            if _COUNTS[table] == 0:
                _swap_out(_TABLES[table][1])


def hold_while_alive(obj: Any) -> None:
    """Hold the recording code for as long as ``obj`` lives, unless a trace holds it already
    (its proxies may outlive it in a traceback, and must not keep the code swapped)."""
    if _tracing:
        return
    hold()
    weakref.finalize(obj, release)


class tracing:
    """Context manager of ``Tracer.trace``: holds the recording code (Tensor methods
    included) for the trace."""

    def __enter__(self) -> None:
        global _tracing
        hold(methods=True)
        _tracing += 1

    def __exit__(self, *exc: Any) -> None:
        global _tracing
        _tracing -= 1
        release(methods=True)


def active() -> bool:
    """Whether the recording code is swapped in now."""
    return _COUNTS["functions"] > 0
