"""Interpreter runs a GraphModule node by node; Transformer builds a new one while doing so."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any, Optional

from mpitensor import nn

from ._symbolic_trace import Tracer
from .graph import Graph
from .graph_module import GraphModule, _fetch
from .node import Argument, Node, Target, map_aggregate, map_arg
from .proxy import Proxy

__all__ = ["Interpreter", "Transformer"]


class Interpreter:
    """Execute a GraphModule one node at a time; override a per-op method (``call_function``,
    ``call_module``, ...) or ``run_node`` to change what a node does.

    Args:
        module: the GraphModule (or module) to run.
        garbage_collect_values: free each value after its last use.
        graph: run this graph instead of ``module.graph``.

    Example:
        >>> import mpitensor as torch
        >>> from mpitensor.fx import symbolic_trace
        >>> gm = symbolic_trace(lambda x: x * 2)
        >>> Interpreter(gm).run(torch.tensor([1.0, 2.0]))
        tensor([2., 4.])
    """

    def __init__(self, module: nn.Module, garbage_collect_values: bool = True,
                 graph: Optional[Graph] = None) -> None:
        self.module = module
        self.submodules = dict(module.named_modules())
        if graph is None:
            graph = getattr(module, "graph", None)
            if not isinstance(graph, Graph):
                raise TypeError("Interpreter needs a GraphModule or an explicit graph=")
        self.graph = graph
        self.env: dict[Node, Any] = {}
        self.garbage_collect_values = garbage_collect_values
        self.extra_traceback = True
        self.user_to_last_uses: dict[Node, list[Node]] = {}
        if garbage_collect_values:
            seen: set = set()
            for node in reversed(list(self.graph.nodes)):
                for inp in node.all_input_nodes:
                    if inp not in seen:
                        seen.add(inp)
                        self.user_to_last_uses.setdefault(node, []).append(inp)

    def run(self, *args: Any, initial_env: Optional[dict] = None,
            enable_io_processing: bool = True) -> Any:
        """Run the graph on ``args``; ``initial_env`` presets the values of some nodes."""
        self.env = dict(initial_env) if initial_env is not None else {}
        self.args_iter: Iterator[Any] = iter(args)
        for node in self.graph.nodes:
            if node in self.env:
                continue
            try:
                self.env[node] = self.run_node(node)
            except Exception as exc:
                if self.extra_traceback and not getattr(exc, "_fx_noted", False):
                    note = f"While executing {node.format_node()}"
                    if hasattr(exc, "add_note"):
                        exc.add_note(note)
                    exc._fx_noted = True  # type: ignore[attr-defined]
                raise
            if self.garbage_collect_values:
                for dead in self.user_to_last_uses.get(node, []):
                    self.env.pop(dead, None)
            if node.op == "output":
                return self.env[node]
        return None

    def run_node(self, n: Node) -> Any:
        """Run one node: fetch its arguments from the environment, call its op's method."""
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        return getattr(self, n.op)(n.target, args, kwargs)

    # --- one method per op --------------------------------------------------------------------
    def placeholder(self, target: Target, args: tuple, kwargs: dict) -> Any:
        """The next input (``*name`` placeholders take the rest), or its default."""
        if isinstance(target, str) and target.startswith("*"):
            return list(self.args_iter)
        try:
            return next(self.args_iter)
        except StopIteration:
            if args:
                return args[0]
            raise RuntimeError(f"Interpreter.run: no value given for input {target!r} and "
                               f"it has no default") from None

    def get_attr(self, target: Target, args: tuple, kwargs: dict) -> Any:
        """Read an attribute of the module."""
        return self.fetch_attr(target)

    def call_function(self, target: Target, args: tuple, kwargs: dict) -> Any:
        """Call a free function."""
        return target(*args, **kwargs)

    def call_method(self, target: Target, args: tuple, kwargs: dict) -> Any:
        """Call a method of the first argument."""
        self_obj, *rest = args
        return getattr(self_obj, target)(*rest, **kwargs)

    def call_module(self, target: Target, args: tuple, kwargs: dict) -> Any:
        """Call a submodule."""
        return self.fetch_attr(target)(*args, **kwargs)

    def output(self, target: Target, args: tuple, kwargs: dict) -> Any:
        """The program's result."""
        return args[0]

    # --- helpers ------------------------------------------------------------------------------
    def fetch_attr(self, target: str) -> Any:
        """The attribute of ``self.module`` at a dotted path.

        Raises:
            RuntimeError: the path does not exist.
        """
        try:
            return _fetch(self.module, target)
        except AttributeError as exc:
            raise RuntimeError(f"node target {target!r} does not exist in the module: "
                               f"{exc}") from None

    def fetch_args_kwargs_from_env(self, n: Node) -> tuple:
        """``n``'s args and kwargs with every node replaced by its computed value."""
        return self.map_nodes_to_values(n.args, n), self.map_nodes_to_values(n.kwargs, n)

    def map_nodes_to_values(self, args: Argument, n: Node) -> Argument:
        """Replace each node inside ``args`` by its value in the environment."""
        def load(a: Node) -> Any:
            if a not in self.env:
                raise RuntimeError(f"node {n.name!r} reads {a.name!r}, which has no value "
                                   f"yet (or was freed)")
            return self.env[a]
        return map_arg(args, load)


class _TransformerTracer(Tracer):
    def __init__(self, graph: Graph, root: nn.Module) -> None:
        super().__init__()
        self.graph = graph
        self.root = root
        self._tensor_paths = {}
        self._keep = []

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


class Transformer(Interpreter):
    """Build a new GraphModule by running the old graph on proxies; override per-op methods
    to emit something else for a node. ``transform()`` returns the result.
    """

    def __init__(self, module: GraphModule) -> None:
        super().__init__(module)
        self.new_graph = Graph()
        self.tracer = _TransformerTracer(self.new_graph, module)

    def placeholder(self, target: Target, args: tuple, kwargs: dict) -> Proxy:
        """A placeholder of the new graph, with the old one's default."""
        default = args[0] if args else inspect.Signature.empty
        return Proxy(self.new_graph.placeholder(target, default_value=default), self.tracer)

    def get_attr(self, target: Target, args: tuple, kwargs: dict) -> Proxy:
        """A get_attr node of the new graph."""
        return self.tracer.create_proxy("get_attr", target, args, kwargs)

    def call_module(self, target: Target, args: tuple, kwargs: dict) -> Any:
        """A call_module node of the new graph."""
        submod = self.fetch_attr(target)
        return self.tracer.call_module(submod, submod.forward, args, kwargs)

    def call_function(self, target: Target, args: tuple, kwargs: dict) -> Any:
        """A call_function node of the new graph."""
        return self.tracer.create_proxy("call_function", target, args, kwargs)

    def transform(self) -> GraphModule:
        """Run the transformation; returns the new GraphModule."""
        result = super().run(enable_io_processing=False)
        self.env = {}  # its proxies would keep the recording wrappers installed
        if result is not None:
            def strip(a: Any) -> Any:
                return a.node if isinstance(a, Proxy) else a
            self.new_graph.output(map_aggregate(result, strip))
        return GraphModule(self.module, self.new_graph)
