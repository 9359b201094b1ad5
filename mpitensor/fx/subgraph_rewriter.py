"""replace_pattern: find every copy of a small traced program inside a GraphModule and
put another program in its place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Optional, Union

from mpitensor import nn

from ._symbolic_trace import symbolic_trace
from .graph import Graph
from .graph_module import GraphModule
from .node import Node

__all__ = ["Match", "replace_pattern"]


class Match(NamedTuple):
    """One replaced occurrence: the graph node matched to the pattern's result, and the
    map from pattern nodes to graph nodes."""

    anchor: Node
    nodes_map: dict


def _as_graph(p: Union[Callable, nn.Module, Graph, GraphModule]) -> Graph:
    if isinstance(p, Graph):
        return p
    if isinstance(p, GraphModule):
        return p.graph
    return symbolic_trace(p).graph


class _Matcher:
    """Matches a pattern graph against a graph, starting from one anchor node."""

    def __init__(self, pattern: Graph) -> None:
        self.pattern = pattern
        out = [n for n in pattern.nodes if n.op == "output"]
        if len(out) != 1:
            raise ValueError("replace_pattern: the pattern must have exactly one output")
        ret = out[0].args[0]
        self.returns = list(ret) if isinstance(ret, (tuple, list)) else [ret]
        if not all(isinstance(r, Node) for r in self.returns):
            raise ValueError("replace_pattern: the pattern must return traced values")
        self.placeholders = [n for n in pattern.nodes if n.op == "placeholder"]

    def match_at(self, anchor: Node) -> Optional[dict]:
        if len(self.returns) != 1:
            raise NotImplementedError("replace_pattern: patterns returning several values "
                                      "are not supported; return one value")
        nodes_map: dict = {}
        if not self._node(self.returns[0], anchor, nodes_map):
            return None
        # values computed inside the match must not escape it (except the anchor's)
        inner = {g for p, g in nodes_map.items() if p.op != "placeholder"}
        for p, g in nodes_map.items():
            if p.op == "placeholder" or g is anchor:
                continue
            if any(u not in inner for u in g.users):
                return None
        return nodes_map

    def _node(self, p: Node, g: Any, nodes_map: dict) -> bool:
        if p in nodes_map:
            return nodes_map[p] is g
        if p.op == "placeholder":
            if g in nodes_map.values():
                return False
            nodes_map[p] = g
            return True
        if not isinstance(g, Node) or g.op != p.op or g in nodes_map.values():
            return False
        if p.op == "get_attr":
            same = True  # attribute names differ between pattern and program
        else:
            same = g.target == p.target
        if not same or len(p.args) != len(g.args) or set(p.kwargs) != set(g.kwargs):
            return False
        nodes_map[p] = g
        saved = dict(nodes_map)
        ok = self._arg(p.args, g.args, nodes_map) and all(
            self._arg(p.kwargs[k], g.kwargs[k], nodes_map) for k in p.kwargs)
        if not ok:
            nodes_map.clear()
            nodes_map.update(saved)
            del nodes_map[p]
        return ok

    def _arg(self, pa: Any, ga: Any, nodes_map: dict) -> bool:
        if isinstance(pa, Node):
            return self._node(pa, ga, nodes_map)
        if isinstance(pa, (tuple, list)):
            return isinstance(ga, (tuple, list)) and len(pa) == len(ga) and \
                all(self._arg(a, b, nodes_map) for a, b in zip(pa, ga))
        if isinstance(pa, dict):
            return isinstance(ga, dict) and pa.keys() == ga.keys() and \
                all(self._arg(pa[k], ga[k], nodes_map) for k in pa)
        return not isinstance(ga, Node) and type(pa) is type(ga) and pa == ga


def replace_pattern(gm: GraphModule, pattern: Union[Callable, GraphModule],
                    replacement: Union[Callable, GraphModule]) -> list[Match]:
    """Replace each non-overlapping occurrence of ``pattern`` in ``gm`` by ``replacement``.

    Both are traced with :func:`symbolic_trace`; their inputs are wildcards matched by
    data dependence (not by name), in order. Matches whose inner values are used outside
    the match are skipped. ``gm`` is recompiled; returns the replaced matches.

    Raises:
        ValueError: pattern and replacement take different numbers of inputs.
    """
    graph = gm.graph
    matcher = _Matcher(_as_graph(pattern))
    repl = _as_graph(replacement)
    repl_inputs = [n for n in repl.nodes if n.op == "placeholder"]
    if len(repl_inputs) != len(matcher.placeholders):
        raise ValueError(f"replace_pattern: the pattern takes {len(matcher.placeholders)} "
                         f"inputs but the replacement takes {len(repl_inputs)}")
    matches: list = []
    taken: set = set()
    for node in list(graph.nodes):
        if node._erased or node in taken:
            continue
        nodes_map = matcher.match_at(node)
        if nodes_map is None:
            continue
        inner = [g for p, g in nodes_map.items() if p.op != "placeholder"]
        if any(g in taken for g in inner):
            continue
        taken.update(inner)
        matches.append(Match(node, nodes_map))
    for anchor, nodes_map in matches:
        val_map = {r: nodes_map[p] for r, p in zip(repl_inputs, matcher.placeholders)}
        # the replacement goes just before the first reader of the matched value
        order = {n: i for i, n in enumerate(graph.nodes)}
        readers = sorted(anchor.users, key=order.__getitem__)
        with graph.inserting_before(readers[0] if readers else anchor):
            out = graph.graph_copy(repl, val_map)
        if isinstance(out, (tuple, list)) and len(out) == 1:
            out = out[0]
        if not isinstance(out, Node):
            raise NotImplementedError("replace_pattern: the replacement must return a single "
                                      "traced value")
        anchor.replace_all_uses_with(out)
        for p in reversed(list(matcher.pattern.nodes)):
            g = nodes_map.get(p)
            if p.op != "placeholder" and g is not None and not g._erased and not g.users:
                graph.erase_node(g)
    gm.recompile()
    return matches
