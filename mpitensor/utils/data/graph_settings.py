"""``torch.utils.data.graph_settings``: settings applied to every pipe of a DataPipe graph
(shuffling, sharding, seeds); :class:`~mpitensor.data.DataLoader` applies ``shuffle=``."""

from __future__ import annotations

import warnings
from typing import Any, List

from .graph import DataPipeGraph, traverse_dps

__all__ = ["apply_random_seed", "apply_sharding", "apply_shuffle_seed",
           "apply_shuffle_settings", "get_all_graph_pipes"]


def get_all_graph_pipes(graph: DataPipeGraph) -> List[Any]:
    """Every pipe of ``graph`` once, from the outermost down."""
    out: List[Any] = []
    seen: set = set()

    def walk(g: DataPipeGraph) -> None:
        for key, (pipe, sub) in g.items():
            if key not in seen:
                seen.add(key)
                out.append(pipe)
            walk(sub)

    walk(graph)
    return out


def _is_shuffler(pipe: Any) -> bool:
    return callable(getattr(type(pipe), "set_shuffle", None)) and \
        callable(getattr(type(pipe), "set_seed", None))


def apply_shuffle_settings(datapipe: Any, shuffle: Any = None) -> Any:
    """Turn every shuffler of the graph on or off (None: leave them); ``shuffle=True`` on a
    graph without one adds a ``shuffle()`` at the end, with a warning. Returns the pipe."""
    if shuffle is None:
        return datapipe
    shufflers = [p for p in get_all_graph_pipes(traverse_dps(datapipe)) if _is_shuffler(p)]
    if not shufflers and shuffle:
        warnings.warn("shuffle=True was set, but the DataPipe has no Shuffler: one is added at "
                      "the end (mind its default buffer size)", stacklevel=2)
        datapipe = datapipe.shuffle()
        shufflers = [datapipe]
    for s in shufflers:
        s.set_shuffle(shuffle)
    return datapipe


def apply_sharding(datapipe: Any, num_of_instances: int, instance_id: int,
                   sharding_group: Any = None) -> Any:
    """Call ``apply_sharding`` on the sharding pipes of the graph; two on one branch raise
    ``RuntimeError`` (a pipeline sharded twice). Returns the pipe."""

    def walk(g: DataPipeGraph, above: Any) -> None:
        for pipe, sub in g.values():
            here = above
            if callable(getattr(pipe, "apply_sharding", None)) and \
                    getattr(pipe, "is_shardable", lambda: True)():
                if above is not None:
                    raise RuntimeError(f"apply_sharding: {type(above).__name__} and "
                                       f"{type(pipe).__name__} both shard one branch of the "
                                       f"pipeline; keep one sharding_filter per branch")
                pipe.apply_sharding(num_of_instances, instance_id, sharding_group)
                here = pipe
            walk(sub, here)

    walk(traverse_dps(datapipe), None)
    return datapipe


def apply_random_seed(datapipe: Any, rng: Any) -> Any:
    """Seed every shuffler of the graph from the generator ``rng`` (a new seed each)."""
    from mpitensor.tensor import randint  # noqa: PLC0415 - the tensors' layer

    for p in get_all_graph_pipes(traverse_dps(datapipe)):
        if _is_shuffler(p):
            p.set_seed(int(randint(0, 2 ** 62, (), generator=rng).item()))
    return datapipe


def apply_shuffle_seed(datapipe: Any, rng: Any) -> Any:
    """Deprecated: :func:`apply_random_seed`."""
    warnings.warn("apply_shuffle_seed is deprecated; use apply_random_seed", FutureWarning,
                  stacklevel=2)
    return apply_random_seed(datapipe, rng)
