"""``mpitensor.accelerator``: torch's device-neutral accelerator API; here the accelerator is CUDA.

Every answer agrees with :mod:`mpitensor.cuda`: ``is_available()`` is
``mpitensor.cuda.is_available()``, ``device_count()`` is ``mpitensor.cuda.device_count()``, and
the current device index is CuPy's current GPU. Calls that need a GPU raise
:class:`mpitensor.cuda.CudaUnavailableError` (a RuntimeError, as torch raises) without one.

Example:
    >>> import mpitensor as torch
    >>> acc = torch.accelerator.current_accelerator(check_available=True)
    >>> device = acc if acc is not None else torch.device("cpu")
    >>> torch.accelerator.device_count() == torch.cuda.device_count()
    True
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

from mpitensor import backend as _backend
from mpitensor import cuda as _cuda
from mpitensor.backends import cuda as _cuda_backend

__all__ = [
    "is_available", "current_accelerator", "device_count", "set_device_index",
    "current_device_index", "synchronize", "device_index", "current_stream", "set_stream",
    "empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "memory_stats", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "get_memory_info", "empty_host_cache",
    "current_device_idx", "set_device_idx",
]


# the same functions as mpitensor.cuda's, as the module docstring says
is_available = _cuda.is_available
device_count = _cuda.device_count


def current_accelerator(check_available: bool = False) -> Optional[_backend.device]:
    """Return ``device(type='cuda')`` where mpitensor can use CUDA, else None.

    Args:
        check_available: False: CUDA support is present (CuPy imports), as a CUDA build of
            torch answers even on a machine without a GPU; True: a GPU is also visible.

    Example:
        >>> import mpitensor as torch
        >>> torch.accelerator.current_accelerator(check_available=True)  # None without a GPU
    """
    usable = _cuda.is_available() if check_available else _cuda_backend.is_built()
    return _backend.device("cuda") if usable else None


def set_device_index(device: _cuda.DeviceArg, /) -> None:
    """Make GPU ``device`` current for this thread (a negative number changes nothing).

    Raises:
        ValueError: a CPU device (also a RuntimeError, as torch raises), None or another kind.
        CudaUnavailableError: no GPU can be used.

    Example:
        >>> import mpitensor as torch
        >>> if torch.accelerator.is_available():
        ...     torch.accelerator.set_device_index(0)
    """
    _cuda.set_device(device)


def current_device_index() -> int:
    """Return the number of the current GPU.

    Raises:
        CudaUnavailableError: no GPU can be used.

    Example:
        >>> import mpitensor as torch
        >>> if torch.accelerator.is_available():
        ...     idx = torch.accelerator.current_device_index()
    """
    return _cuda.current_device()


def synchronize(device: _cuda.DeviceArg = None, /) -> None:
    """Wait for every kernel queued on a GPU (the current one by default).

    Raises:
        ValueError: a CPU device or another kind of value.
        CudaUnavailableError: no GPU can be used.

    Example:
        >>> import mpitensor as torch
        >>> if torch.accelerator.is_available():
        ...     torch.accelerator.synchronize()
    """
    _cuda.synchronize(device)


def device_index(device: Optional[int], /) -> _cuda.device:
    """A context manager that makes GPU ``device`` current in a ``with`` block (None: no change).

    Example:
        >>> import mpitensor as torch
        >>> with torch.accelerator.device_index(None):
        ...     pass
    """
    return _cuda.device(device)


def _gpu(what: str) -> None:
    """Raise, as torch.accelerator does, where no GPU can be used."""
    if not _cuda.is_available():
        raise _cuda._no_gpu(f"accelerator.{what}")


def current_stream(device: _cuda.DeviceArg = None, /) -> _cuda.Stream:
    """Return the stream GPU work now goes to (see :func:`mpitensor.cuda.current_stream`)."""
    _gpu("current_stream")
    return _cuda.current_stream(device)


def set_stream(stream: _cuda.Stream) -> None:
    """Make ``stream`` the current stream of its GPU."""
    _gpu("set_stream")
    _cuda.set_stream(stream)


def empty_cache() -> None:
    """Give the unused memory CuPy's pools cache back to the driver.

    Raises:
        CudaUnavailableError: no GPU can be used (as torch.accelerator raises).
    """
    _gpu("empty_cache")
    _cuda.empty_cache()


def empty_host_cache() -> None:
    """Give the unused pinned host memory CuPy's pinned pool caches back to the system.

    Raises:
        CudaUnavailableError: no GPU can be used (as torch.accelerator raises).
    """
    _gpu("empty_host_cache")
    _backend.get_cupy().get_default_pinned_memory_pool().free_all_blocks()


def current_device_idx() -> int:
    """Deprecated name of :func:`current_device_index` (warns DeprecationWarning, as torch)."""
    warnings.warn("mpitensor.accelerator.current_device_idx is deprecated, as in torch; use "
                  "current_device_index", DeprecationWarning, stacklevel=2)
    return current_device_index()


def set_device_idx(device: _cuda.DeviceArg, /) -> None:
    """Deprecated name of :func:`set_device_index` (warns DeprecationWarning, as torch)."""
    warnings.warn("mpitensor.accelerator.set_device_idx is deprecated, as in torch; use "
                  "set_device_index", DeprecationWarning, stacklevel=2)
    set_device_index(device)


def _memory(what: str) -> Callable:
    """``torch.accelerator.<what>(device_index=None)``: ``mpitensor.cuda.<what>`` once a GPU
    is known to be there (torch.accelerator raises where none is)."""
    target = getattr(_cuda, what)

    def call(device_index: _cuda.DeviceArg = None, /) -> Any:
        _gpu(what)
        return target(device_index)
    call.__name__ = call.__qualname__ = what
    call.__doc__ = (f"``mpitensor.cuda.{what}`` of a GPU (the current one by default).\n\n"
                    f"Raises:\n    CudaUnavailableError: no GPU can be used.")
    return call


(memory_allocated, max_memory_allocated, memory_reserved, max_memory_reserved, memory_stats,
 reset_peak_memory_stats, reset_accumulated_memory_stats) = map(_memory, (
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_stats", "reset_peak_memory_stats", "reset_accumulated_memory_stats"))
get_memory_info = _memory("mem_get_info")
get_memory_info.__name__ = get_memory_info.__qualname__ = "get_memory_info"
