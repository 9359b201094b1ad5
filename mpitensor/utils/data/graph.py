"""``torch.utils.data.graph``: the graph of a DataPipe pipeline, found from the pipes each
DataPipe reads (its attributes that are DataPipes, or lists and tuples of them)."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from .datapipes.datapipe import IterDataPipe, MapDataPipe

__all__ = ["traverse", "traverse_dps"]

DataPipeGraph = Dict[int, Tuple[Any, "DataPipeGraph"]]


def _sources(pipe: Any) -> list:
    found: list = []

    def visit(v: Any, depth: int) -> None:
        if isinstance(v, (IterDataPipe, MapDataPipe)):
            found.append(v)
        elif isinstance(v, (list, tuple)) and depth == 0:
            for x in v:
                visit(x, 1)
        elif depth == 0 and hasattr(v, "__dict__") and type(v).__name__ == "_Shared":
            visit(v.source, 1)  # the children of fork/demux read one shared source

    for v in getattr(pipe, "__dict__", {}).values():
        visit(v, 0)
    return found


def traverse_dps(datapipe: Any) -> DataPipeGraph:
    """``{id(pipe): (pipe, graph of the pipes it reads)}`` from ``datapipe`` down."""
    return _graph(datapipe, set())


def _graph(pipe: Any, on_path: set) -> DataPipeGraph:
    key = id(pipe)
    if key in on_path:  # a pipe that reads itself, directly or not: cut the cycle
        return {key: (pipe, {})}
    on_path = on_path | {key}
    sub: DataPipeGraph = {}
    for src in _sources(pipe):
        sub.update(_graph(src, on_path))
    return {key: (pipe, sub)}


def traverse(datapipe: Any, only_datapipe: bool = True) -> DataPipeGraph:
    """:func:`traverse_dps` (only DataPipes are followed here, whatever ``only_datapipe``)."""
    return traverse_dps(datapipe)
