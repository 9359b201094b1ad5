"""The fx graph: an ordered list of :class:`~mpitensor.fx.Node` and the Python it becomes.

``Graph.python_code()`` writes the ``forward`` a :class:`~mpitensor.fx.GraphModule` runs.
Functions of mpitensor's public namespaces are written as ``torch.<name>`` (the module runs
with ``torch`` bound to :mod:`mpitensor`), so the printed code reads like torch.fx's.
"""

from __future__ import annotations

import builtins
import copy
import inspect
import keyword
import math
import operator
import re
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, Optional

from ._names import is_tensor_class as _is_tensor_class
from ._names import qualified_name as _qualified_name
from ._names import wrapped as _wrapped_name
from .node import Argument, Node, Target, _nodes_in, map_arg

__all__ = ["Graph", "PythonCode"]

_BINARY = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
           operator.floordiv: "//", operator.mod: "%", operator.pow: "**",
           operator.matmul: "@", operator.and_: "&", operator.or_: "|", operator.xor: "^",
           operator.lshift: "<<", operator.rshift: ">>", operator.eq: "==", operator.ne: "!=",
           operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">="}
_UNARY = {operator.neg: "-", operator.pos: "+", operator.invert: "~"}
# names the generated module binds itself, so nodes never take them
_RESERVED = {"inf", "nan", "NoneType", "torch", "device", "operator", "self", "builtins"}


def _snake_case(s: str) -> str:
    return re.sub(r"(?<=[a-z])([A-Z])", r"_\1", s).lower()


class _Namespace:
    """Hands out unique, legal Python names, counting suffixes per base name."""

    def __init__(self) -> None:
        self._used: set = set()
        self._count: dict = {}
        self._by_obj: dict = {}

    def create_name(self, candidate: str, obj: Any = None) -> str:
        if obj is not None and id(obj) in self._by_obj:
            return self._by_obj[id(obj)][0]
        candidate = re.sub(r"[^0-9a-zA-Z_]+", "_", candidate) or "_unnamed"
        if candidate[0].isdigit():
            candidate = "_" + candidate
        m = re.fullmatch(r"(.*)_(\d+)", candidate)
        base, num = (candidate, None) if m is None else (m.group(1), int(m.group(2)))
        if not num:
            num = self._count.get(base, 0)
        while candidate in self._used or self._illegal(candidate):
            num += 1
            candidate = f"{base}_{num}"
        self._used.add(candidate)
        self._count[base] = num
        if obj is not None:
            self._by_obj[id(obj)] = (candidate, obj)
        return candidate

    @staticmethod
    def _illegal(name: str) -> bool:
        return keyword.iskeyword(name) or hasattr(builtins, name) or name in _RESERVED

    def copy(self) -> _Namespace:
        ns = _Namespace()
        ns._used, ns._count = set(self._used), dict(self._count)
        return ns


class PythonCode(NamedTuple):
    """The source of a generated ``forward`` and the globals it runs with."""

    src: str
    globals: dict


class _NodeList:
    """A live view of a graph's nodes in order; ``reversed()`` walks it backwards."""

    def __init__(self, graph: Graph, forward: bool = True) -> None:
        self._graph, self._forward = graph, forward

    def __len__(self) -> int:
        return self._graph._len

    def __iter__(self) -> Iterator[Node]:
        root = self._graph._root
        step = "_next" if self._forward else "_prev"
        cur = getattr(root, step)
        while cur is not root:
            if not cur._erased:
                yield cur
            cur = getattr(cur, step)

    def __reversed__(self) -> Iterator[Node]:
        return iter(_NodeList(self._graph, not self._forward))

    def __repr__(self) -> str:
        return repr(list(self))


class Graph:
    """A program as a list of :class:`Node`: placeholders, operations and one output.

    Example:
        >>> import operator
        >>> g = Graph()
        >>> x = g.placeholder("x")
        >>> out = g.output(g.call_function(operator.add, (x, 1)))
        >>> print(g)
        graph():
            %x : [num_users=1] = placeholder[target=x]
            %add : [num_users=1] = call_function[target=operator.add](args = (%x, 1), kwargs = {})
            return add
        >>> [n.op for n in g.nodes]
        ['placeholder', 'call_function', 'output']
    """

    def __init__(self, owning_module: Any = None, tracer_cls: Optional[type] = None,
                 tracer_extras: Optional[dict] = None) -> None:
        self._root = Node.__new__(Node)
        self._root.__dict__.update(graph=self, name="", op="root", target="", _prev=self._root,
                                   _next=self._root, _erased=False, users={}, _input_nodes={},
                                   _args=(), _kwargs={}, meta={}, type=None)
        self._insert: Callable[[Node], None] = self._root.prepend
        self._len = 0
        self._namespace = _Namespace()
        self.owning_module = owning_module
        self._tracer_cls = tracer_cls
        self._tracer_extras = tracer_extras

    @property
    def nodes(self) -> _NodeList:
        """The nodes in program order (a live view: edits show up at once)."""
        return _NodeList(self)

    def find_nodes(self, *, op: str, target: Optional[Target] = None,
                   sort: bool = True) -> list[Node]:
        """The nodes with this ``op`` (and ``target``, when given), in order."""
        return [n for n in self.nodes if n.op == op and (target is None or n.target == target)]

    # --- building ----------------------------------------------------------------------------
    def create_node(self, op: str, target: Target, args: Optional[tuple] = None,
                    kwargs: Optional[dict] = None, name: Optional[str] = None,
                    type_expr: Optional[Any] = None) -> Node:
        """Make a node at the insertion point (the end, unless ``inserting_*`` says otherwise)."""
        args = () if args is None else args
        kwargs = {} if kwargs is None else kwargs
        if not isinstance(args, tuple):
            raise TypeError(f"create_node: args must be a tuple, got {type(args).__name__}")
        if not isinstance(kwargs, dict):
            raise TypeError(f"create_node: kwargs must be a dict, got {type(kwargs).__name__}")
        for used in _nodes_in((args, kwargs)):
            if used.graph is not self:
                raise RuntimeError(f"create_node: argument node {used.name!r} belongs to "
                                   f"another graph; copy it in with node_copy or graph_copy")
        candidate = name if name is not None else self._target_to_str(target)
        node = Node(self, self._namespace.create_name(candidate), op, target, args, kwargs,
                    type_expr)
        self._insert(node)
        self._len += 1
        return node

    @staticmethod
    def _target_to_str(target: Target) -> str:
        if callable(target) and not isinstance(target, str):
            name = getattr(target, "__name__", type(target).__name__)
        else:
            name = str(target)
            if name.startswith("__") and name.endswith("__") and len(name) > 4:
                name = name[2:-2]
        return _snake_case(name)

    def placeholder(self, name: str, type_expr: Optional[Any] = None,
                    default_value: Any = inspect.Signature.empty) -> Node:
        """An input of the program; ``default_value`` makes it optional in ``forward``."""
        args = () if default_value is inspect.Signature.empty else (default_value,)
        return self.create_node("placeholder", name, args, {}, type_expr=type_expr)

    def get_attr(self, qualified_name: str, type_expr: Optional[Any] = None) -> Node:
        """Read ``self.<qualified_name>`` (a parameter, buffer or other attribute)."""
        return self.create_node("get_attr", qualified_name, type_expr=type_expr)

    def call_module(self, module_name: str, args: Optional[tuple] = None,
                    kwargs: Optional[dict] = None, type_expr: Optional[Any] = None) -> Node:
        """Call the submodule at ``module_name``."""
        return self.create_node("call_module", module_name, args, kwargs, type_expr=type_expr)

    def call_method(self, method_name: str, args: Optional[tuple] = None,
                    kwargs: Optional[dict] = None, type_expr: Optional[Any] = None) -> Node:
        """Call ``args[0].<method_name>(*args[1:], **kwargs)``."""
        return self.create_node("call_method", method_name, args, kwargs, type_expr=type_expr)

    def call_function(self, the_function: Callable[..., Any], args: Optional[tuple] = None,
                      kwargs: Optional[dict] = None, type_expr: Optional[Any] = None) -> Node:
        """Call a free function (``torch.relu``, ``operator.add``, ...)."""
        return self.create_node("call_function", the_function, args, kwargs,
                                type_expr=type_expr)

    def output(self, result: Argument, type_expr: Optional[Any] = None) -> Node:
        """The value the program returns."""
        return self.create_node("output", "output", (result,), type_expr=type_expr)

    def node_copy(self, node: Node, arg_transform: Callable[[Node], Argument] = lambda x: x
                  ) -> Node:
        """Copy ``node`` (of any graph) into this one, mapping its input nodes through
        ``arg_transform``."""
        args = map_arg(node.args, arg_transform)
        kwargs = map_arg(node.kwargs, arg_transform)
        new = self.create_node(node.op, node.target, args, kwargs, node.name, node.type)
        new.meta = copy.copy(node.meta)
        return new

    def graph_copy(self, g: Graph, val_map: dict, return_output_node: bool = False) -> Any:
        """Copy every node of ``g`` into this graph; ``val_map`` maps ``g``'s nodes to
        their copies (preset entries, such as placeholders, are used as given). Returns the
        copied output value (with the output node when ``return_output_node``)."""
        for node in g.nodes:
            if node in val_map:
                continue
            if node.op == "output":
                rv = map_arg(node.args[0], lambda n: val_map[n])
                return (rv, node) if return_output_node else rv
            val_map[node] = self.node_copy(node, lambda n: val_map[n])
        return None

    def __deepcopy__(self, memo: dict) -> Graph:
        g = Graph(tracer_cls=self._tracer_cls, tracer_extras=self._tracer_extras)
        memo[id(self)] = g
        out = g.graph_copy(self, {}, return_output_node=True)
        if out is not None:
            rv, node = out
            g.output(rv, type_expr=node.type)
        return g

    # --- editing -----------------------------------------------------------------------------
    def erase_node(self, to_erase: Node) -> None:
        """Remove a node that nothing uses any more."""
        if to_erase.graph is not self:
            raise RuntimeError(f"erase_node: node {to_erase.name!r} is not in this graph")
        if to_erase._erased:
            raise RuntimeError(f"erase_node: node {to_erase.name!r} was already erased")
        if to_erase.users:
            raise RuntimeError(
                f"erase_node: node {to_erase.name!r} is still read by {len(to_erase.users)} "
                f"node(s) {list(to_erase.users)}; point them elsewhere first "
                f"(replace_all_uses_with)")
        to_erase._unlink()
        to_erase._erased = True
        self._len -= 1
        to_erase._set_args_kwargs(map_arg(to_erase.args, lambda n: None),
                                  map_arg(to_erase.kwargs, lambda n: None))

    @contextmanager
    def _insert_point(self, insert: Callable[[Node], None]) -> Iterator[None]:
        saved, self._insert = self._insert, insert
        try:
            yield
        finally:
            self._insert = saved

    def inserting_before(self, n: Optional[Node] = None) -> Any:
        """Context manager: new nodes go just before ``n`` (the graph's start when None)."""
        if n is None:
            return self.inserting_after(self._root)
        return self._insert_point(self._mine(n, "inserting_before").prepend)

    def inserting_after(self, n: Optional[Node] = None) -> Any:
        """Context manager: new nodes go just after ``n`` (the graph's end when None)."""
        if n is None:
            return self.inserting_before(self._root)
        return self._insert_point(self._mine(n, "inserting_after").append)

    def _mine(self, n: Node, what: str) -> Node:
        if n.graph is not self:
            raise ValueError(f"{what}: node {n.name!r} is not in this graph")
        return n

    def eliminate_dead_code(self, is_impure_node: Optional[Callable[[Node], bool]] = None
                            ) -> bool:
        """Erase nodes whose value nobody uses and that have no side effect; True if any."""
        impure = is_impure_node or (lambda n: n.is_impure())
        changed = False
        for node in reversed(self.nodes):
            if not node.users and not impure(node):
                self.erase_node(node)
                changed = True
        return changed

    def lint(self) -> None:
        """Check the graph's invariants; raise RuntimeError naming the first broken one."""
        seen: set = set()
        names: set = set()
        for node in self.nodes:
            if node.graph is not self:
                raise RuntimeError(f"lint: node {node.name!r} belongs to another graph")
            if node.name in names:
                raise RuntimeError(f"lint: two nodes are named {node.name!r}")
            names.add(node.name)
            for inp in node.all_input_nodes:
                if inp.graph is not self or inp._erased:
                    raise RuntimeError(f"lint: node {node.name!r} reads {inp.name!r}, "
                                       f"which is not in this graph")
                if inp not in seen:
                    raise RuntimeError(f"lint: node {node.name!r} reads {inp.name!r} before "
                                       f"it is defined")
                if node not in inp.users:
                    raise RuntimeError(f"lint: {inp.name!r} does not list its user "
                                       f"{node.name!r}")
            seen.add(node)
        mod = self.owning_module
        if mod is None:
            return
        for node in self.nodes:
            if node.op in ("get_attr", "call_module"):
                owner = mod
                for atom in node.target.split("."):
                    if not hasattr(owner, atom):
                        raise RuntimeError(f"lint: node {node.name!r} targets {node.target!r}"
                                           f", which the owning module does not have")
                    owner = getattr(owner, atom)

    # --- printing ----------------------------------------------------------------------------
    def __str__(self) -> str:
        lines = ["graph():"]
        lines += ["    " + n.format_node() for n in self.nodes]
        return "\n".join(lines)

    def print_tabular(self) -> None:
        """Print one row per node: opcode, name, target, args, kwargs."""
        print(self._tabular())  # noqa: T201 - printing is what the caller asked for

    def _tabular(self) -> str:
        rows = [["opcode", "name", "target", "args", "kwargs"]]
        for n in self.nodes:
            rows.append([n.op, n.name, str(n.target), str(n.args), str(n.kwargs)])
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
        return "\n".join([fmt(rows[0]), "  ".join("-" * w for w in widths)] +
                         [fmt(r) for r in rows[1:]])

    def python_code(self, root_module: str = "self") -> PythonCode:
        """The ``forward(self, ...)`` source for this graph and the globals it needs."""
        return _CodeWriter(self, root_module).write()


def _is_identifier(s: str) -> bool:
    return s.isidentifier() and not keyword.iskeyword(s)


class _CodeWriter:
    """Writes the Python source of one graph."""

    def __init__(self, graph: Graph, root_module: str) -> None:
        import mpitensor

        self.graph = graph
        self.root = root_module
        self.globals: dict = {"torch": mpitensor, "inf": math.inf, "nan": math.nan,
                              "NoneType": type(None), "device": mpitensor.device,
                              "operator": operator, "builtins": builtins}
        self.names = _Namespace()
        for n in graph.nodes:
            self.names._used.add(n.name)
        self.wrapped: list = []

    def add_global(self, obj: Any) -> str:
        """A name under which the generated code can reach ``obj``."""
        if obj is None or isinstance(obj, (bool, int, str)):
            return repr(obj)
        qual = _qualified_name(obj) if callable(obj) else ""
        if qual.startswith("torch."):
            return qual
        if qual.startswith("operator."):
            qual = f"{obj.__module__}.{obj.__name__}"  # torch.fx writes _operator_abs
        if qual.startswith("builtins."):
            return qual[len("builtins."):]
        if isinstance(obj, type) and obj.__module__ == "builtins":
            return obj.__name__
        candidate = qual.replace(".", "_") if qual else type(obj).__name__
        name = self.names.create_name(candidate, obj)
        self.globals[name] = obj
        return name

    def annotation(self, t: Any, sep: str) -> str:
        """``sep`` and the source of type annotation ``t`` ('' for none, or a string one)."""
        if t is None or isinstance(t, str):
            return ""
        return sep + self.type_source(t)

    def type_source(self, t: Any) -> str:
        args = typing.get_args(t)
        origin = typing.get_origin(t)
        if origin is not None and args:
            head = _TYPING_NAMES.get(origin, None)
            name = self.add_global_as(origin, f"typing_{head}") if head else self.add_global(origin)
            return f"{name}[{','.join(self.type_source(a) for a in args)}]"
        if t is type(None):
            return "NoneType"
        if _is_tensor_class(t):
            return "torch.Tensor"
        if isinstance(t, type) and t.__module__ == "builtins":
            return t.__name__
        return self.add_global(t)

    def add_global_as(self, obj: Any, candidate: str) -> str:
        """Bind ``obj`` in the generated module under ``candidate`` (made unique)."""
        name = self.names.create_name(candidate, obj)
        self.globals[name] = obj
        return name

    def fmt(self, a: Argument) -> str:
        if isinstance(a, Node):
            return a.name
        if isinstance(a, tuple):
            inner = ", ".join(self.fmt(x) for x in a)
            if hasattr(a, "_fields"):
                return f"{self.add_global(type(a))}({inner})"
            return f"({inner},)" if len(a) == 1 else f"({inner})"
        if isinstance(a, list):
            return "[" + ", ".join(self.fmt(x) for x in a) + "]"
        if isinstance(a, dict):
            return "{" + ", ".join(f"{k!r}: {self.fmt(v)}" for k, v in a.items()) + "}"
        if isinstance(a, slice):
            return f"slice({self.fmt(a.start)}, {self.fmt(a.stop)}, {self.fmt(a.step)})"
        if isinstance(a, float):
            if math.isnan(a):
                return "nan"
            if math.isinf(a):
                return "inf" if a > 0 else "-inf"
            return repr(a)
        if a is None or a is Ellipsis or isinstance(a, (bool, int, str, complex)):
            return repr(a)
        dtype_name = _dtype_name(a)
        if dtype_name is not None:
            return f"torch.{dtype_name}"
        return self.add_global(a)

    def call_args(self, args: tuple, kwargs: dict) -> str:
        parts = [self.fmt(a) for a in args] + [f"{k} = {self.fmt(v)}" for k, v in kwargs.items()]
        return ", ".join(parts)

    def attr_path(self, target: str) -> str:
        out = self.root
        for atom in target.split("."):
            out = f"{out}.{atom}" if _is_identifier(atom) else f'getattr({out}, "{atom}")'
        return out

    def expression(self, n: Node) -> str:
        args, kwargs = n.args, n.kwargs
        if n.op == "call_method":
            return f"{self.fmt(args[0])}.{n.target}({self.call_args(args[1:], kwargs)})"
        if n.op == "call_module":
            return f"{self.attr_path(n.target)}({self.call_args(args, kwargs)})"
        if n.op == "get_attr":
            return self.attr_path(n.target)
        target = n.target
        if not kwargs:
            if target in _BINARY and len(args) == 2:
                return f"{self.fmt(args[0])} {_BINARY[target]} {self.fmt(args[1])}"
            if target in _UNARY and len(args) == 1:
                return f"{_UNARY[target]}{self.fmt(args[0])}"
            if target is operator.getitem and len(args) == 2:
                return f"{self.fmt(args[0])}[{self.fmt(args[1])}]"
            if target is builtins.getattr and len(args) == 2 and isinstance(args[1], str) \
                    and _is_identifier(args[1]):
                return f"{self.fmt(args[0])}.{args[1]}"
        wrapped = _wrapped_name(target)
        fn = self.add_global(target)
        if wrapped and fn not in self.wrapped:
            self.wrapped.append(fn)
        return f"{fn}({self.call_args(args, kwargs)})"

    def write(self) -> PythonCode:
        nodes = list(self.graph.nodes)
        last_use: dict = {}
        for node in reversed(nodes):
            for inp in node.all_input_nodes:
                last_use.setdefault(inp, node)
        params, body, returns = [], [], ""
        for node in nodes:
            if node.op == "placeholder":
                # the parameter keeps the program's name; a node renamed away from it
                # (input -> input_1, a builtin's name) is bound first thing
                param = node.target + self.annotation(node.type, " : ")
                if node.args and not node.target.startswith("*"):
                    param += f" = {self.fmt(node.args[0])}"
                params.append(param)
                if node.name != node.target and not node.target.startswith("*"):
                    body.append(f"{node.name} = {node.target}")
                continue
            if node.op == "output":
                body.append(f"return {self.fmt(node.args[0])}")
                returns = self.annotation(node.type, " -> ")
                continue
            line = f"{node.name} = {self.expression(node)}"
            dead = [v for v in node.all_input_nodes if last_use[v] is node]
            if not node.users:
                dead.append(node)
            if dead:
                line += ";  " + " = ".join(v.name for v in dead) + " = None"
            body.append(line)
        if not body or not body[-1].startswith("return"):
            body.append("return None")
        wraps = "\n".join(f'torch.fx._symbolic_trace.wrap("{w}")' for w in self.wrapped)
        src = (f"\n{wraps}\n\ndef forward({', '.join([self.root] + params)}){returns}:\n"
               + "".join(f"    {line}\n" for line in body) + "    ")
        return PythonCode(src, self.globals)


_TYPING_NAMES = {typing.Union: "Union", tuple: "Tuple", list: "List", dict: "Dict"}


def _dtype_name(a: Any) -> Optional[str]:
    import numpy

    from mpitensor import dtypes

    if not isinstance(a, numpy.dtype):
        return None
    for name in dtypes.__all__:
        val = getattr(dtypes, name)
        if isinstance(val, numpy.dtype) and val == a:
            return name
    return None
