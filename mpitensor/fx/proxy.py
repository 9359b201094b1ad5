"""Proxy: the stand-in value symbolic tracing passes through a program, recording each
operation done to it as a :class:`~mpitensor.fx.Node`.
"""

from __future__ import annotations

import dis
import inspect
import operator
from collections.abc import Callable, Iterator
from typing import Any, Optional

from . import _dispatch
from .graph import Graph
from .node import Argument, Node, Target

__all__ = ["Proxy", "Attribute", "TraceError", "TracerBase", "GraphAppendingTracer"]


class TraceError(ValueError):
    """A traced program did something a symbolic value cannot answer (control flow on it,
    iteration of unknown length, ...)."""


class TracerBase:
    """What a Proxy needs from its tracer: a graph and the hooks that turn operations on
    proxies into nodes. Subclasses override ``create_proxy``, ``create_node``,
    ``create_arg``, ``proxy``, ``to_bool``, ``iter`` and ``keys``."""

    graph: Graph

    def create_node(self, kind: str, target: Target, args: tuple, kwargs: dict,
                    name: Optional[str] = None, type_expr: Optional[Any] = None) -> Node:
        """Add a node to ``self.graph``."""
        return self.graph.create_node(kind, target, args, kwargs, name, type_expr)

    def proxy(self, node: Node) -> Proxy:
        """Wrap a new node in a Proxy."""
        return Proxy(node, self)

    def create_proxy(self, kind: str, target: Target, args: tuple, kwargs: dict,
                     name: Optional[str] = None, type_expr: Optional[Any] = None,
                     proxy_factory_fn: Optional[Callable[[Node], Proxy]] = None) -> Proxy:
        """Record one operation: its arguments go through ``create_arg``, the node through
        ``create_node``, and the result is a Proxy of that node."""
        args_ = self.create_arg(args)
        kwargs_ = self.create_arg(kwargs)
        if not isinstance(args_, tuple) or not isinstance(kwargs_, dict):
            raise TypeError("create_proxy: args must be a tuple and kwargs a dict")
        node = self.create_node(kind, target, args_, kwargs_, name, type_expr)
        return self.proxy(node) if proxy_factory_fn is None else proxy_factory_fn(node)

    def create_arg(self, a: Any) -> Argument:
        """Turn a value met during tracing into something a node can hold."""
        if isinstance(a, Proxy):
            return a.node
        if isinstance(a, Node):
            return a
        if isinstance(a, tuple):
            args = tuple(self.create_arg(x) for x in a)
            return type(a)(*args) if hasattr(a, "_fields") else args
        if isinstance(a, list):
            return [self.create_arg(x) for x in a]
        if isinstance(a, dict):
            out = {}
            for k, v in a.items():
                k = self.create_arg(k)
                if isinstance(k, Node):
                    raise RuntimeError("a traced value cannot be a dictionary key")
                out[k] = self.create_arg(v)
            return out
        if isinstance(a, slice):
            return slice(self.create_arg(a.start), self.create_arg(a.stop),
                         self.create_arg(a.step))
        if isinstance(a, range):
            return range(self.create_arg(a.start), self.create_arg(a.stop),
                         self.create_arg(a.step))
        if a is None or a is Ellipsis or isinstance(a, _BASE_TYPES) or _is_plain_constant(a):
            return a
        raise NotImplementedError(f"fx cannot record an argument of type {type(a).__name__} "
                                  f"({a!r:.60}); pass it through a wrapped function or make "
                                  f"it a module attribute")

    def to_bool(self, obj: Proxy) -> bool:
        """Called by ``bool(proxy)``: a symbolic value has no truth value."""
        raise TraceError(f"symbolically traced value {obj.node.name!r} cannot decide control "
                         f"flow (if/while/and/or/not on it); trace with concrete_args for "
                         f"that input, or move the branch into a leaf module or a "
                         f"function registered with fx.wrap")

    def iter(self, obj: Proxy) -> Iterator:
        """Called by ``iter(proxy)`` where the length is not known from the code."""
        raise TraceError(f"symbolically traced value {obj.node.name!r} cannot be iterated: "
                         f"its length is unknown while tracing; index it instead, or "
                         f"unpack it to a fixed number of names (a, b = value)")

    def keys(self, obj: Proxy) -> Any:
        """Called by ``**proxy``; records ``proxy.keys()``."""
        return Attribute(obj, "keys")()


_BASE_TYPES: tuple = (str, int, float, bool, complex)


def _is_plain_constant(a: Any) -> bool:
    import numpy

    import mpitensor

    return isinstance(a, (numpy.dtype, mpitensor.device, type, numpy.generic)) or \
        inspect.isroutine(a)


class GraphAppendingTracer(TracerBase):
    """The tracer of proxies made by hand: operations on them append to ``graph``."""

    def __init__(self, graph: Graph) -> None:
        super().__init__()
        self.graph = graph
        self.scope = None
        self.module_stack: dict = {}
        self.node_name_to_scope: dict = {}


class Proxy(_dispatch.Recordable):
    """A value under tracing: every operation on it records a node in ``tracer.graph``.

    Example:
        >>> g = Graph()
        >>> x = Proxy(g.placeholder("x"))
        >>> ((x + 1) * 2).node.op
        'call_function'
    """

    def __init__(self, node: Node, tracer: Optional[TracerBase] = None) -> None:
        if tracer is None:
            tracer = GraphAppendingTracer(node.graph)
        self.tracer = tracer
        self.node = node
        _dispatch.hold_while_alive(self)

    def __repr__(self) -> str:
        return f"Proxy({self.node.name})"

    def __getattr__(self, k: str) -> Attribute:
        if k.startswith("__") and k.endswith("__"):
            raise AttributeError(k)  # copy, pickle and numpy probe these; never record them
        return Attribute(self, k)

    def __call__(self, *args: Any, **kwargs: Any) -> Proxy:
        return self.tracer.create_proxy("call_method", "__call__", (self,) + args, kwargs)

    def __iter__(self) -> Iterator:
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        if caller is not None:
            for inst in dis.get_instructions(caller.f_code):
                if inst.offset == caller.f_lasti:
                    if inst.opname == "UNPACK_SEQUENCE":
                        return (self[i] for i in range(inst.argval))
                    break
        return self.tracer.iter(self)

    def __bool__(self) -> bool:
        return self.tracer.to_bool(self)

    def __len__(self) -> int:
        raise RuntimeError("len() of a symbolically traced value is unknown while tracing; "
                           "use .size(dim) or .shape[dim], which are recorded")

    def keys(self) -> Any:
        """``proxy.keys()``, recorded (used by ``**proxy``)."""
        return self.tracer.keys(self)

    def __index__(self) -> int:
        # TypeError, as torch.fx gives where Python wants an integer
        raise TypeError(f"symbolically traced value {self.node.name!r} cannot be used as a "
                        f"Python integer (a range bound, a list index, ...) while tracing")

    def __setitem__(self, key: Any, value: Any) -> None:
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})

    def __contains__(self, item: Any) -> bool:
        return self.tracer.to_bool(self.tracer.create_proxy(
            "call_function", operator.contains, (self, item), {}))


class Attribute(Proxy):
    """``proxy.name``: recorded as a getattr node when used as a value, or as a
    call_method node when called."""

    def __init__(self, root: Proxy, attr: str) -> None:
        self.root = root
        self.attr = attr
        self.tracer = root.tracer
        self._node: Optional[Node] = None
        _dispatch.hold_while_alive(self)

    @property
    def node(self) -> Node:  # type: ignore[override]
        if self._node is None:
            self._node = self.tracer.create_proxy("call_function", getattr,
                                                  (self.root, self.attr), {}).node
        return self._node

    def __call__(self, *args: Any, **kwargs: Any) -> Proxy:
        return self.tracer.create_proxy("call_method", self.attr, (self.root,) + args, kwargs)


def _binary(op: Callable, reflected: bool) -> Callable:
    if reflected:
        def method(self: Proxy, other: Any) -> Proxy:
            return self.tracer.create_proxy("call_function", op, (other, self), {})
    else:
        def method(self: Proxy, other: Any) -> Proxy:
            return self.tracer.create_proxy("call_function", op, (self, other), {})
    return method


def _unary(op: Callable) -> Callable:
    def method(self: Proxy) -> Proxy:
        return self.tracer.create_proxy("call_function", op, (self,), {})
    return method


_BINARY_OPS = ["add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
               "or", "xor", "lshift", "rshift"]
for _name in _BINARY_OPS:
    _op = getattr(operator, _name + "_" if _name in ("and", "or") else _name)
    setattr(Proxy, f"__{_name}__", _binary(_op, False))
    setattr(Proxy, f"__r{_name}__", _binary(_op, True))
for _name in ("eq", "ne", "lt", "le", "gt", "ge", "getitem"):
    setattr(Proxy, f"__{_name}__", _binary(getattr(operator, _name), False))
for _name in ("neg", "pos", "invert", "abs"):
    setattr(Proxy, f"__{_name}__", _unary(getattr(operator, _name)))
Proxy.__hash__ = object.__hash__  # type: ignore[method-assign] - __eq__ records, hash stays
