"""The node of an fx graph: one operation, its inputs and the nodes that use its value.

``map_arg`` and ``map_aggregate`` walk the (possibly nested) arguments of a node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional, Union

from ._names import qualified_name, type_str

__all__ = ["Node", "Target", "Argument", "map_arg", "map_aggregate", "has_side_effect"]

Target = Union[Callable[..., Any], str]
Argument = Any

_OPS = ("placeholder", "call_method", "call_module", "call_function", "get_attr", "output",
        "root")


_SIDE_EFFECTFUL_FUNCTIONS: set = set()


def has_side_effect(fn: Callable) -> Callable:
    """Mark ``fn`` so that dead-code elimination never removes a call to it; returns ``fn``."""
    _SIDE_EFFECTFUL_FUNCTIONS.add(fn)
    return fn


def map_aggregate(a: Argument, fn: Callable[[Argument], Argument]) -> Argument:
    """Apply ``fn`` to every leaf of ``a``, rebuilding tuples, lists, dicts and slices."""
    if isinstance(a, tuple):
        t = tuple(map_aggregate(elem, fn) for elem in a)
        # a namedtuple is rebuilt as its own type
        return t if not hasattr(a, "_fields") else type(a)(*t)
    if isinstance(a, list):
        return [map_aggregate(elem, fn) for elem in a]
    if isinstance(a, dict):
        return {k: map_aggregate(v, fn) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(map_aggregate(a.start, fn), map_aggregate(a.stop, fn),
                     map_aggregate(a.step, fn))
    return fn(a)


def map_arg(a: Argument, fn: Callable[[Node], Argument]) -> Argument:
    """Apply ``fn`` to every :class:`Node` inside ``a``; other leaves stay as they are.

    Example:
        >>> map_arg((1, [2]), lambda n: n)
        (1, [2])
    """
    if not callable(fn):
        raise TypeError("map_arg(a, fn): fn must be callable")
    return map_aggregate(a, lambda x: fn(x) if isinstance(x, Node) else x)


def _nodes_in(a: Argument) -> dict:
    found: dict = {}
    map_arg(a, lambda n: found.setdefault(n))
    return found


class Node:
    """One operation of a :class:`~mpitensor.fx.Graph`.

    ``op`` is one of ``placeholder``, ``get_attr``, ``call_function``, ``call_method``,
    ``call_module`` and ``output``; ``target`` is what it calls or reads; ``args`` and
    ``kwargs`` may hold other nodes, whose ``users`` then include this one.
    """

    def __init__(self, graph: Any, name: str, op: str, target: Target, args: tuple,
                 kwargs: dict, return_type: Optional[Any] = None) -> None:
        if op not in _OPS:
            raise ValueError(f"Node op must be one of {_OPS[:-1]}, got {op!r}")
        if op in ("call_method", "call_module", "get_attr", "placeholder", "output") \
                and not isinstance(target, str):
            raise ValueError(f"a {op} node takes a string target, got {target!r}")
        if op == "call_function" and not callable(target):
            raise ValueError(f"a call_function node takes a callable target, got {target!r}")
        self.graph = graph
        self.name = name
        self.op = op
        self.target = target
        self.type = return_type
        self.users: dict[Node, None] = {}
        self._input_nodes: dict[Node, None] = {}
        self._args: tuple = ()
        self._kwargs: dict = {}
        self._prev = self
        self._next = self
        self._erased = False
        self.meta: dict[str, Any] = {}
        self._set_args_kwargs(tuple(args), dict(kwargs))

    # --- linked list -------------------------------------------------------------------------
    next = property(lambda self: self._next, doc="The node after this one, in order.")
    prev = property(lambda self: self._prev, doc="The node before this one, in order.")

    def _unlink(self) -> None:
        p, n = self._prev, self._next
        p._next, n._prev = n, p

    def prepend(self, x: Node) -> None:
        """Move (or insert) ``x`` just before this node."""
        if x is self:
            raise ValueError("cannot prepend a node to itself")
        if x.graph is not self.graph:
            raise ValueError("prepend: both nodes must belong to the same graph")
        x._unlink()
        p = self._prev
        p._next, x._prev, x._next, self._prev = x, p, self, x

    def append(self, x: Node) -> None:
        """Move (or insert) ``x`` just after this node."""
        self._next.prepend(x)

    @property
    def stack_trace(self) -> Optional[str]:
        """Where the traced code made this node, when recorded (``meta['stack_trace']``)."""
        return self.meta.get("stack_trace")

    @stack_trace.setter
    def stack_trace(self, trace: Optional[str]) -> None:
        self.meta["stack_trace"] = trace

    # --- arguments ---------------------------------------------------------------------------
    @property
    def args(self) -> tuple:
        """The positional arguments; assigning them updates every input's ``users``."""
        return self._args

    @args.setter
    def args(self, a: tuple) -> None:
        self._set_args_kwargs(tuple(a), self._kwargs)

    @property
    def kwargs(self) -> dict:
        """The keyword arguments; assigning them updates every input's ``users``."""
        return self._kwargs

    @kwargs.setter
    def kwargs(self, k: dict) -> None:
        self._set_args_kwargs(self._args, dict(k))

    def _set_args_kwargs(self, args: tuple, kwargs: dict) -> None:
        for old in self._input_nodes:
            old.users.pop(self, None)
        self._args, self._kwargs = args, kwargs
        self._input_nodes = _nodes_in((args, kwargs))
        for new in self._input_nodes:
            new.users.setdefault(self)

    @property
    def all_input_nodes(self) -> list[Node]:
        """The nodes this one reads, each once, in the order they first appear."""
        return list(self._input_nodes)

    def update_arg(self, idx: int, arg: Argument) -> None:
        """Replace positional argument ``idx`` with ``arg``."""
        args = list(self._args)
        args[idx] = arg
        self.args = tuple(args)

    def update_kwarg(self, key: str, arg: Argument) -> None:
        """Set keyword argument ``key`` to ``arg``."""
        self.kwargs = {**self._kwargs, key: arg}

    def replace_all_uses_with(self, replace_with: Node,
                              delete_user_cb: Callable[[Node], bool] = lambda user: True,
                              *, propagate_meta: bool = False) -> list[Node]:
        """Make every user of this node read ``replace_with`` instead; returns those users."""
        if not isinstance(replace_with, Node):
            raise TypeError(f"replace_all_uses_with takes a Node, got "
                            f"{type(replace_with).__name__}")
        if propagate_meta:
            for k, v in self.meta.items():
                replace_with.meta.setdefault(k, v)
        changed = []
        for user in list(self.users):
            if not delete_user_cb(user):
                continue
            user.replace_input_with(self, replace_with)
            changed.append(user)
        return changed

    def replace_input_with(self, old_input: Node, new_input: Node) -> None:
        """Read ``new_input`` wherever this node read ``old_input``."""
        swap = lambda n: new_input if n is old_input else n  # noqa: E731
        self._set_args_kwargs(map_arg(self._args, swap), map_arg(self._kwargs, swap))

    def is_impure(self) -> bool:
        """Whether removing this node, even unused, could change what the program does."""
        if self.op in ("placeholder", "output"):
            return True
        if self.op == "call_function":
            return self.target in _SIDE_EFFECTFUL_FUNCTIONS
        if self.op == "call_method":
            return self.target.endswith("_") and not self.target.endswith("__")
        if self.op == "call_module":
            mod = self.graph.owning_module
            if mod is not None:
                try:
                    return bool(getattr(mod.get_submodule(self.target), "_is_impure", False))
                except AttributeError:
                    return False
        return False

    # --- printing ----------------------------------------------------------------------------
    def __repr__(self) -> str:
        return self.name

    def format_node(self) -> str:
        """One line describing the node, as ``str(graph)`` prints it."""
        if self.op == "output":
            return f"return {_fmt(self.args[0], '')}"
        shown = type_str(self.type)
        head = (f"%{self.name} : {shown + ' ' if shown else ''}[num_users={len(self.users)}] = "
                f"{self.op}[target={_target_str(self.target)}]")
        if self.op == "placeholder":
            return head + (f"(default={self.args[0]!r})" if self.args else "")
        if self.op == "get_attr":
            return head
        kw = "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in self.kwargs.items()) + "}"
        return head + f"(args = {_fmt(self.args)}, kwargs = {kw})"


def _target_str(t: Target) -> str:
    if isinstance(t, str):
        return t
    return qualified_name(t)


def _fmt(a: Argument, mark: str = "%") -> str:
    if isinstance(a, Node):
        return mark + a.name
    if isinstance(a, tuple):
        inner = ", ".join(_fmt(x, mark) for x in a)
        return f"({inner},)" if len(a) == 1 else f"({inner})"
    if isinstance(a, list):
        return "[" + ", ".join(_fmt(x, mark) for x in a) + "]"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {_fmt(v, mark)}" for k, v in a.items()) + "}"
    return str(a)
