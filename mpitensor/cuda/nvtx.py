"""``torch.cuda.nvtx``: NVTX annotations (named ranges and marks) for Nsight's timelines.

With a GPU they go to CuPy's NVTX bindings (``cupy.cuda.nvtx``). Without one, or where CuPy
was built without NVTX, every call raises :class:`~mpitensor.cuda.CudaUnavailableError` (a
RuntimeError), as a CPU-only torch's NVTX calls raise RuntimeError; ``range(...)`` raises when
entered, as torch's does.

Example:
    >>> import mpitensor as torch
    >>> if torch.cuda.is_available():
    ...     with torch.cuda.nvtx.range("forward"):
    ...         pass
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from ._common import _cupy, _no_gpu

__all__ = ["range_push", "range_pop", "range_start", "range_end", "mark", "range"]

_depth = threading.local()  # the nesting of pushed ranges, per thread, as NVTX counts it


def _nvtx(what: str) -> Any:
    nv = _cupy(f"nvtx.{what}").cuda.nvtx
    if not getattr(nv, "available", True):
        raise _no_gpu(f"nvtx.{what}")
    return nv


def range_push(msg: str) -> int:
    """Open a nested NVTX range named ``msg``; return its zero-based depth.

    Raises:
        CudaUnavailableError: no GPU, or CuPy without NVTX.
    """
    _nvtx("range_push").RangePush(str(msg))
    level = getattr(_depth, "n", 0)
    _depth.n = level + 1
    return level


def range_pop() -> int:
    """Close the innermost NVTX range; return its zero-based depth (-1 where none was open).

    Raises:
        CudaUnavailableError: no GPU, or CuPy without NVTX.
    """
    nv = _nvtx("range_pop")
    level = getattr(_depth, "n", 0) - 1
    if level < 0:
        return -1  # NVTX answers a pop without a push with a negative level
    nv.RangePop()
    _depth.n = level
    return level


def range_start(msg: str) -> int:
    """Not available: CuPy's NVTX bindings have no start/end (process-wide) ranges.

    Raises:
        CudaUnavailableError: no GPU.
        NotImplementedError: with a GPU; use :func:`range_push`/:func:`range_pop`.
    """
    _nvtx("range_start")
    raise NotImplementedError("mpitensor.cuda.nvtx.range_start(): CuPy's NVTX bindings have no "
                              "start/end ranges; use range_push()/range_pop() or range()")


def range_end(range_id: int) -> None:
    """Not available, as :func:`range_start`.

    Raises:
        CudaUnavailableError: no GPU.
        NotImplementedError: with a GPU.
    """
    _nvtx("range_end")
    raise NotImplementedError("mpitensor.cuda.nvtx.range_end(): CuPy's NVTX bindings have no "
                              "start/end ranges; use range_push()/range_pop() or range()")


def mark(msg: str) -> None:
    """Put an instant NVTX event named ``msg`` on the timeline.

    Raises:
        CudaUnavailableError: no GPU, or CuPy without NVTX.
    """
    _nvtx("mark").Mark(str(msg))


@contextlib.contextmanager
def range(msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:  # noqa: A001 - torch's name
    """A ``with`` block inside an NVTX range named ``msg.format(*args, **kwargs)``.

    Raises:
        CudaUnavailableError: no GPU (when entered).
    """
    range_push(msg.format(*args, **kwargs))
    try:
        yield
    finally:
        range_pop()
