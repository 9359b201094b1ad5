"""``torch.cuda``'s memory statistics, read from CuPy's memory pool.

"Allocated" is what arrays hold (the pool's ``used_bytes``), "reserved" what the pool holds
from the driver, in use or cached (``total_bytes``). Peaks and cumulative counts come from the
counting allocator that :mod:`mpitensor._base.gpu_memory` puts in front of CuPy's pool when
mpitensor first imports CuPy.

Where no GPU was ever used, the answers are a CPU-only torch's: ``memory_allocated()`` and its
kin are 0 and ``memory_stats()`` is ``{}``; the calls that need a GPU (``mem_get_info``,
``memory_summary``, the resets) raise :class:`~mpitensor.cuda.CudaUnavailableError`.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any

from mpitensor import backend as _backend
from mpitensor._base import gpu_memory as _gpu_memory
from mpitensor._core.devices import cuda_index_arg

from ._common import DeviceArg, _cupy, _loaded_cupy, _resolve

__all__ = [
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_cached", "max_memory_cached", "reset_peak_memory_stats",
    "reset_max_memory_allocated", "reset_max_memory_cached", "reset_accumulated_memory_stats",
    "memory_stats", "memory_stats_as_nested_dict", "memory_summary", "mem_get_info",
]


def _used(device: DeviceArg, what: str) -> Any:
    """``(cupy, GPU number)`` where a GPU was used, else None (device checked either way)."""
    idx = cuda_index_arg(device, what)
    cp = _loaded_cupy()
    if cp is None or not _backend.cupy_available():
        return None
    return cp, _resolve(cp, idx, what)


def _stat(device: DeviceArg, what: str, key: str) -> int:
    got = _used(device, what)
    if got is None:
        return 0  # nothing was ever allocated on a GPU, as a CPU-only torch answers
    cp, dev = got
    if key.endswith("_peak") and not _gpu_memory.installed():
        raise RuntimeError(
            f"mpitensor.cuda.{what}(): the peak is unknown, as the program gave CuPy its own "
            f"allocator before mpitensor could count allocations; keep CuPy's default "
            f"allocator to have peaks")
    return int(_gpu_memory.stats(cp, dev)[key])


def memory_allocated(device: DeviceArg = None) -> int:
    """Return the bytes arrays hold on a GPU now (0 where no GPU was used).

    Raises:
        ValueError: a CPU device or another kind of value.

    Example:
        >>> import mpitensor as torch
        >>> torch.cuda.memory_allocated()  # 0 without a GPU
        0
    """
    return _stat(device, "memory_allocated", "allocated_current")


def max_memory_allocated(device: DeviceArg = None) -> int:
    """Return the most bytes arrays held on a GPU at once, since the start or the last
    :func:`reset_peak_memory_stats` (0 where no GPU was used).

    Example:
        >>> import mpitensor as torch
        >>> torch.cuda.max_memory_allocated()
        0
    """
    return _stat(device, "max_memory_allocated", "allocated_peak")


def memory_reserved(device: DeviceArg = None) -> int:
    """Return the bytes CuPy's pool holds on a GPU, in use or cached (0 where none was used).

    Example:
        >>> import mpitensor as torch
        >>> torch.cuda.memory_reserved()
        0
    """
    return _stat(device, "memory_reserved", "reserved_current")


def max_memory_reserved(device: DeviceArg = None) -> int:
    """Return the most bytes CuPy's pool held on a GPU at once (0 where none was used)."""
    return _stat(device, "max_memory_reserved", "reserved_peak")


def memory_cached(device: DeviceArg = None) -> int:
    """Deprecated name of :func:`memory_reserved` (warns FutureWarning, as torch does)."""
    warnings.warn("mpitensor.cuda.memory_cached is renamed memory_reserved, as in torch",
                  FutureWarning, stacklevel=2)
    return memory_reserved(device)


def max_memory_cached(device: DeviceArg = None) -> int:
    """Deprecated name of :func:`max_memory_reserved` (warns FutureWarning)."""
    warnings.warn("mpitensor.cuda.max_memory_cached is renamed max_memory_reserved, as in "
                  "torch", FutureWarning, stacklevel=2)
    return max_memory_reserved(device)


def _gpu(device: DeviceArg, what: str) -> tuple:
    idx = cuda_index_arg(device, what)
    cp = _cupy(what)
    return cp, _resolve(cp, idx, what)


def reset_peak_memory_stats(device: DeviceArg = None) -> None:
    """Start the peaks of a GPU afresh from what is allocated and reserved now.

    Raises:
        CudaUnavailableError: no GPU can be used (a CPU-only torch raises here too).
    """
    cp, dev = _gpu(device, "reset_peak_memory_stats")
    _gpu_memory.reset_peaks(cp, dev)


def reset_max_memory_allocated(device: DeviceArg = None) -> None:
    """Older name: calls :func:`reset_peak_memory_stats` (warns FutureWarning, as torch)."""
    warnings.warn("mpitensor.cuda.reset_max_memory_allocated resets every peak, as "
                  "reset_peak_memory_stats does (as in torch)", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: DeviceArg = None) -> None:
    """Older name: calls :func:`reset_peak_memory_stats` (warns FutureWarning, as torch)."""
    warnings.warn("mpitensor.cuda.reset_max_memory_cached resets every peak, as "
                  "reset_peak_memory_stats does (as in torch)", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: DeviceArg = None) -> None:
    """Zero a GPU's cumulative counts (bytes and number of allocations, out-of-memory errors).

    Raises:
        CudaUnavailableError: no GPU can be used.
    """
    _, dev = _gpu(device, "reset_accumulated_memory_stats")
    _gpu_memory.reset_accumulated(dev)


def memory_stats(device: DeviceArg = None) -> dict:
    """Return a GPU's counts under torch's keys ({} where no GPU was used).

    The keys filled are those CuPy's pool can answer truthfully:
    ``allocated_bytes.all.{current,peak,allocated}``, ``reserved_bytes.all.{current,peak}``,
    ``allocation.all.allocated`` and ``num_ooms``; torch's other keys are absent.
    """
    got = _used(device, "memory_stats")
    if got is None:
        return OrderedDict()
    cp, dev = got
    s = _gpu_memory.stats(cp, dev)
    out = {"allocated_bytes.all.current": s["allocated_current"],
           "reserved_bytes.all.current": s["reserved_current"]}
    if _gpu_memory.installed():
        out.update({"allocated_bytes.all.peak": s["allocated_peak"],
                    "allocated_bytes.all.allocated": s["allocated_total"],
                    "reserved_bytes.all.peak": s["reserved_peak"],
                    "allocation.all.allocated": s["allocations"],
                    "num_ooms": s["ooms"]})
    return OrderedDict(sorted(out.items()))


def memory_stats_as_nested_dict(device: DeviceArg = None) -> dict:
    """:func:`memory_stats` with its dotted keys as nested dicts ({} where no GPU was used)."""
    nested: dict = {}
    for key, value in memory_stats(device).items():
        *path, last = key.split(".")
        node = nested
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
    return nested


def memory_summary(device: DeviceArg = None, abbreviated: bool = False) -> str:
    """Return a short table of a GPU's memory counts, for printing.

    Raises:
        CudaUnavailableError: no GPU can be used.
    """
    _, dev = _gpu(device, "memory_summary")
    stats = memory_stats(dev)
    lines = [f"mpitensor.cuda memory summary, GPU {dev} (CuPy's default memory pool)"]
    lines += [f"  {key:<32} {value:>16,}" for key, value in stats.items()]
    return "\n".join(lines) + "\n"


def mem_get_info(device: DeviceArg = None) -> tuple:
    """Return ``(free, total)`` bytes of a GPU, as the CUDA driver counts them.

    Raises:
        CudaUnavailableError: no GPU can be used.
    """
    cp, dev = _gpu(device, "mem_get_info")
    with cp.cuda.Device(dev):
        free, total = cp.cuda.runtime.memGetInfo()
    return int(free), int(total)
