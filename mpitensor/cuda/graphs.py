"""``torch.cuda.graphs``: CUDA graph capture and replay -- not available in mpitensor.

mpitensor does not capture CUDA graphs: its GPU work goes through CuPy kernels and CuPy's memory
pool, whose allocations during a capture are not kept alive as torch's private graph pools keep
them, so a replay could read freed memory. ``CUDAGraph``, ``graph``, ``make_graphed_callables``
and ``graph_pool_handle`` therefore raise NotImplementedError (a RuntimeError, as a CPU-only
torch raises there) rather than run the work uncaptured. :func:`is_current_stream_capturing`
answers truthfully: whether CuPy's current stream is capturing (False without a GPU).
"""

from __future__ import annotations

from typing import Any, NoReturn

from mpitensor import backend as _backend

__all__ = ["is_current_stream_capturing", "graph_pool_handle", "CUDAGraph", "graph",
           "make_graphed_callables"]


def _no_graphs(what: str) -> NoReturn:
    raise NotImplementedError(
        f"mpitensor.cuda.{what}: mpitensor does not capture CUDA graphs (CuPy's memory pool "
        f"cannot keep a captured graph's memory alive for replay); run the callable eagerly")


def is_current_stream_capturing() -> bool:
    """Return whether CuPy's current stream on the current GPU is capturing a graph.

    False without a GPU: nothing can capture there.

    Example:
        >>> import mpitensor as torch
        >>> torch.cuda.is_current_stream_capturing()
        False
    """
    if not _backend.cupy_available():
        return False
    stream = _backend.get_cupy().cuda.get_current_stream()
    capturing = getattr(stream, "is_capturing", None)  # CuPy without graph support: none
    return bool(capturing()) if capturing is not None else False


def graph_pool_handle() -> NoReturn:
    """Not available (see the module's notes). Raises NotImplementedError."""
    _no_graphs("graph_pool_handle()")


class CUDAGraph:
    """Not available (see the module's notes): making one raises NotImplementedError."""

    def __init__(self, keep_graph: bool = False) -> None:
        _no_graphs("CUDAGraph()")


class graph:  # noqa: N801 - torch's name
    """Not available (see the module's notes): making one raises NotImplementedError."""

    def __init__(self, cuda_graph: Any, pool: Any = None, stream: Any = None,
                 capture_error_mode: str = "global", **kwargs: Any) -> None:
        _no_graphs("graph()")


def make_graphed_callables(callables: Any, sample_args: Any, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool: Any = None) -> NoReturn:
    """Not available (see the module's notes). Raises NotImplementedError."""
    _no_graphs("make_graphed_callables()")
