"""``torch.cuda.profiler``: start and stop the CUDA profiler's collection (Nsight, nvprof).

``start()``/``stop()`` call CuPy's ``cupy.cuda.profiler.start``/``stop`` (the runtime's
``cudaProfilerStart``/``cudaProfilerStop``); without a GPU they raise
:class:`~mpitensor.cuda.CudaUnavailableError` (an AssertionError, as a CPU-only torch raises).
``profile()`` is a ``with`` block between the two.

Example:
    >>> import mpitensor as torch
    >>> if torch.cuda.is_available():
    ...     with torch.cuda.profiler.profile():
    ...         y = torch.ones(8, device="cuda") * 2
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ._common import _cupy

__all__ = ["start", "stop", "profile"]


def start() -> None:
    """Start the CUDA profiler's collection.

    Raises:
        CudaUnavailableError: no GPU can be used.
    """
    _cupy("profiler.start").cuda.profiler.start()


def stop() -> None:
    """Stop the CUDA profiler's collection.

    Raises:
        CudaUnavailableError: no GPU can be used.
    """
    _cupy("profiler.stop").cuda.profiler.stop()


@contextlib.contextmanager
def profile() -> Iterator[None]:
    """A ``with`` block during which the CUDA profiler collects (raises when entered without a
    GPU)."""
    start()
    try:
        yield
    finally:
        stop()
