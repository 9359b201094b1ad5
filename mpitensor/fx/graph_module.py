"""GraphModule: an nn.Module whose ``forward`` is Python generated from a Graph."""

from __future__ import annotations

import copy
import itertools
import linecache
from typing import Any, Union

from mpitensor import nn
from mpitensor.nn.parameter import Parameter
from mpitensor.tensor import Tensor

from .graph import Graph
from .node import map_aggregate, map_arg

__all__ = ["GraphModule"]

_counter = itertools.count()


def _fetch(owner: Any, target: str) -> Any:
    for atom in target.split("."):
        if not hasattr(owner, atom):
            raise AttributeError(f"{type(owner).__name__} has no attribute {atom!r} "
                                 f"(looking up {target!r})")
        owner = getattr(owner, atom)
    return owner


def _assign(to: nn.Module, target: str, value: Any) -> None:
    *prefix, field = target.split(".")
    for atom in prefix:
        nxt = getattr(to, atom, None)
        if not isinstance(nxt, nn.Module):
            nxt = nn.Module()
            setattr(to, atom, nxt)
        to = nxt
    if isinstance(value, Tensor) and not isinstance(value, Parameter):
        to.register_buffer(field, value)
    else:
        setattr(to, field, value)


class GraphModule(nn.Module):
    """An ``nn.Module`` made from a Graph: its ``forward`` is the graph's generated code.

    Args:
        root: a module whose submodules, parameters and buffers named by the graph's
            ``call_module``/``get_attr`` nodes are copied in (by reference), or a dict of
            qualified name -> object.
        graph: the graph to run.
        class_name: the name shown for the module's class.

    After editing ``gm.graph`` in place, call ``gm.recompile()`` to regenerate ``forward``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> GraphModule:
        # each instance gets its own class, so that its generated forward is its own
        # (a subclass of cls even when cls is another instance's class, so that Python
        # goes on to call __init__)
        impl = type("GraphModuleImpl", (cls,), {"__module__": __name__})
        return super().__new__(impl)

    def __init__(self, root: Union[nn.Module, dict], graph: Graph,
                 class_name: str = "GraphModule") -> None:
        super().__init__()
        type(self).__name__ = class_name
        type(self).__qualname__ = class_name
        if isinstance(root, nn.Module):
            if hasattr(root, "training"):
                self.training = root.training
            for node in graph.nodes:
                if node.op in ("get_attr", "call_module"):
                    if not isinstance(node.target, str):
                        raise TypeError(f"node {node.name}: target must be a string")
                    _assign(self, node.target, _fetch(root, node.target))
        elif isinstance(root, dict):
            for node in graph.nodes:
                if node.op in ("get_attr", "call_module"):
                    if node.target not in root:
                        raise RuntimeError(f"node {node.name!r} targets {node.target!r}, "
                                           f"which the root dict does not hold")
                    _assign(self, node.target, root[node.target])
        else:
            raise TypeError(f"GraphModule root must be an nn.Module or a dict, got "
                            f"{type(root).__name__}")
        self.graph = graph

    @property
    def graph(self) -> Graph:
        """The graph this module runs; assigning one regenerates ``forward``."""
        return self.__dict__["_graph"]

    @graph.setter
    def graph(self, g: Graph) -> None:
        if not isinstance(g, Graph):
            raise TypeError(f"GraphModule.graph must be a Graph, got {type(g).__name__}")
        self.__dict__["_graph"] = g
        g.owning_module = self
        self.recompile()

    @property
    def code(self) -> str:
        """The Python source of the generated ``forward``."""
        return self.__dict__["_code"]

    def recompile(self) -> Any:
        """Regenerate ``forward`` from the (possibly edited) graph; returns the PythonCode."""
        python_code = self.graph.python_code(root_module="self")
        self.__dict__["_code"] = python_code.src
        filename = f"<eval_with_key>.{next(_counter)}"
        # the generated lines show up in tracebacks and inspect.getsource
        linecache.cache[filename] = (len(python_code.src), None,
                                     python_code.src.splitlines(True), filename)
        namespace = dict(python_code.globals)
        exec(compile(python_code.src, filename, "exec"), namespace)  # noqa: S102
        type(self).forward = namespace["forward"]
        return python_code

    def add_submodule(self, target: str, m: nn.Module) -> bool:
        """Install ``m`` at dotted path ``target``, making empty parent modules as needed;
        False when a parent on the path exists but is not a module."""
        *prefix, field = target.split(".")
        owner: Any = self
        for atom in prefix:
            nxt = getattr(owner, atom, None)
            if nxt is None:
                nxt = nn.Module()
                owner.add_module(atom, nxt)
            elif not isinstance(nxt, nn.Module):
                return False
            owner = nxt
        owner.add_module(field, m)
        return True

    def delete_submodule(self, target: str) -> bool:
        """Remove the submodule at dotted path ``target``; False when there is none."""
        *prefix, field = target.split(".")
        owner: Any = self
        for atom in prefix:
            owner = getattr(owner, atom, None)
            if not isinstance(owner, nn.Module):
                return False
        if not isinstance(getattr(owner, field, None), nn.Module):
            return False
        delattr(owner, field)
        return True

    def delete_all_unused_submodules(self) -> None:
        """Remove every submodule that no call_module/get_attr node (or its ancestors')
        path needs."""
        used: set = set()
        for node in self.graph.nodes:
            if node.op in ("call_module", "get_attr"):
                atoms = node.target.split(".")
                used.update(".".join(atoms[:i]) for i in range(1, len(atoms) + 1))
                if node.op == "call_module":  # its own children are in use too
                    mod = _fetch(self, node.target)
                    if isinstance(mod, nn.Module):
                        used.update(f"{node.target}.{n}" for n, _ in mod.named_modules()
                                    if n)
        for name, _ in list(self.named_modules()):
            if name and name not in used:
                self.delete_submodule(name)

    def print_readable(self, print_output: bool = True) -> str:
        """The module's generated code under a class header; printed unless told not to."""
        body = self.code.strip("\n").replace("\n", "\n    ")
        text = f"class {type(self).__name__}(torch.nn.Module):\n    {body.rstrip()}\n"
        if print_output:
            print(text)  # noqa: T201 - printing is what the caller asked for
        return text

    def __str__(self) -> str:
        return super().__repr__() + "\n" + self.code + \
            "\n# To see more debug info, please use `graph_module.print_readable()`"

    def __copy__(self) -> GraphModule:
        res = GraphModule(self, self.graph, type(self).__name__)
        res.__dict__.update({k: v for k, v in self.__dict__.items()
                             if k not in ("_graph", "_code")})
        return res

    def __deepcopy__(self, memo: dict) -> GraphModule:
        fake = nn.Module()
        fake.__dict__ = copy.deepcopy(self.__dict__ | {"_graph": None}, memo)
        res = GraphModule(fake, copy.deepcopy(self.graph, memo), type(self).__name__)
        return res

    def __reduce__(self) -> Any:
        # by value: the objects the graph names, and the graph as a list of node records
        # (call targets pickle by reference, as functions do)
        targets = {n.target: _fetch(self, n.target) for n in self.graph.nodes
                   if n.op in ("get_attr", "call_module")}
        nodes = [(n.op, n.target, map_arg(n.args, _NodeRef.of), map_arg(n.kwargs, _NodeRef.of),
                  n.name, n.type) for n in self.graph.nodes]
        return _rebuild, (targets, nodes, type(self).__name__, self.training)


class _NodeRef:
    """A node's name standing for the node inside a pickled graph."""

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def of(cls, node: Any) -> _NodeRef:
        return cls(node.name)


def _rebuild(targets: dict, nodes: list, class_name: str, training: bool) -> GraphModule:
    graph = Graph()
    env: dict = {}

    def load(a: Any) -> Any:
        return env[a.name] if isinstance(a, _NodeRef) else a

    for op, target, args, kwargs, name, type_expr in nodes:
        env[name] = graph.create_node(op, target, map_aggregate(args, load),
                                      map_aggregate(kwargs, load), name, type_expr)
    gm = GraphModule(targets, graph, class_name)
    gm.train(training)
    return gm


