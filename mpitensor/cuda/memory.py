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

import contextlib
import warnings
from collections import OrderedDict
from collections.abc import Iterator
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
    return _nested(memory_stats(device))


def _nested(stats: dict) -> dict:
    nested: dict = {}
    for key, value in stats.items():
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


# ---- limits, raw blocks, pools and the allocator (torch.cuda.memory's other names) ----------

__all__ += [
    "set_per_process_memory_fraction", "get_per_process_memory_fraction",
    "caching_allocator_alloc", "caching_allocator_delete", "caching_allocator_enable",
    "caching_allocator_disabled", "get_allocator_backend", "memory_snapshot",
    "host_memory_stats", "host_memory_stats_as_nested_dict",
    "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats", "ipc_collect",
    "MemPool", "use_mem_pool",
]

_fractions: dict = {}  # GPU number -> (the fraction asked for, the pool limit it set)
_raw_blocks: dict = {}  # pointer -> CuPy MemoryPointer, kept alive until caching_allocator_delete
_bypassed: dict = {}  # "allocator": the allocator caching_allocator_enable(False) replaced


def set_per_process_memory_fraction(fraction: float, device: DeviceArg = None) -> None:
    """Cap what CuPy's pool may hold on a GPU at ``fraction`` of its memory
    (``MemoryPool.set_limit``); an allocation beyond it raises out-of-memory.

    Raises:
        CudaUnavailableError: no GPU can be used (a CPU-only torch raises too).
        TypeError: ``fraction`` is not a number.
        ValueError: ``fraction`` is outside [0, 1].

    Example:
        >>> import mpitensor as torch
        >>> if torch.cuda.is_available():
        ...     torch.cuda.set_per_process_memory_fraction(0.5)
    """
    cp = _cupy("set_per_process_memory_fraction")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(f"set_per_process_memory_fraction() takes a float, got {fraction!r}")
    if not 0 <= fraction <= 1:
        raise ValueError(f"set_per_process_memory_fraction(): fraction must be in [0, 1], got "
                         f"{fraction}")
    _, dev = _gpu(device, "set_per_process_memory_fraction")
    pool = cp.get_default_memory_pool()
    with cp.cuda.Device(dev):
        total = int(cp.cuda.runtime.memGetInfo()[1])
        # CuPy reads a limit of 0 as "no limit": a fraction of 0 keeps one byte
        limit = max(int(fraction * total), 1)
        pool.set_limit(size=limit)
    _fractions[dev] = (float(fraction), limit)


def get_per_process_memory_fraction(device: DeviceArg = None) -> float:
    """Return the fraction of a GPU's memory CuPy's pool may hold (1.0 where no cap is set).

    Raises:
        CudaUnavailableError: no GPU can be used.
    """
    cp = _cupy("get_per_process_memory_fraction")
    _, dev = _gpu(device, "get_per_process_memory_fraction")
    with cp.cuda.Device(dev):
        limit = int(cp.get_default_memory_pool().get_limit())
        total = int(cp.cuda.runtime.memGetInfo()[1])
    if limit == 0:
        return 1.0
    asked = _fractions.get(dev)
    return asked[0] if asked is not None and asked[1] == limit else limit / total


def caching_allocator_alloc(size: int, device: DeviceArg = None, stream: Any = None) -> int:
    """Take ``size`` bytes from CuPy's pool on a GPU (for ``stream``, a ``Stream``, a CuPy
    stream or None for the current one) and return the pointer, an int, for
    :func:`caching_allocator_delete`.

    Raises:
        CudaUnavailableError: no GPU can be used.
        TypeError: ``size`` is not an int.
    """
    cp = _cupy("caching_allocator_alloc")
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"caching_allocator_alloc() takes a size in bytes, got {size!r}")
    _, dev = _gpu(device, "caching_allocator_alloc")
    cp_stream = getattr(stream, "_cp", stream)
    with cp.cuda.Device(dev):
        if cp_stream is None:
            mem = cp.cuda.alloc(size)
        else:
            with cp_stream:
                mem = cp.cuda.alloc(size)
    _raw_blocks[int(mem.ptr)] = mem
    return int(mem.ptr)


def caching_allocator_delete(mem_ptr: int) -> None:
    """Give a block from :func:`caching_allocator_alloc` back to CuPy's pool.

    Raises:
        RuntimeError: ``mem_ptr`` is no block from :func:`caching_allocator_alloc` still held.
    """
    if _raw_blocks.pop(int(mem_ptr), None) is None:
        raise RuntimeError(f"caching_allocator_delete(): {mem_ptr:#x} is no pointer returned by "
                           f"caching_allocator_alloc() and not yet deleted")


def caching_allocator_enable(value: bool = True) -> None:
    """Turn CuPy's memory pool off (``False``: each allocation is a plain ``cudaMalloc``) or
    back on; without a GPU there is no allocator to switch, as in torch.

    While it is off, the memory statistics count nothing new.
    """
    cp = _loaded_cupy()
    if cp is None or not _backend.cupy_available():
        return
    if not value and "allocator" not in _bypassed:
        _bypassed["allocator"] = cp.cuda.get_allocator()
        cp.cuda.set_allocator(None)
    elif value and "allocator" in _bypassed:
        cp.cuda.set_allocator(_bypassed.pop("allocator"))


@contextlib.contextmanager
def caching_allocator_disabled() -> Iterator[None]:
    """A ``with`` block in which CuPy's memory pool is off (:func:`caching_allocator_enable`)."""
    was_on = "allocator" not in _bypassed
    caching_allocator_enable(False)
    try:
        yield
    finally:
        caching_allocator_enable(was_on)


def get_allocator_backend() -> str:
    """Return ``"cudaMallocAsync"`` where CuPy's allocator is a ``MemoryAsyncPool``, else
    ``"native"`` (CuPy's caching pool, as torch's own allocator is named).

    Raises:
        CudaUnavailableError: no GPU can be used.
    """
    cp = _cupy("get_allocator_backend")
    owner = getattr(cp.cuda.get_allocator(), "__self__", None)
    async_pool = getattr(cp.cuda, "MemoryAsyncPool", None)
    return "cudaMallocAsync" if async_pool and isinstance(owner, async_pool) else "native"


def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list:
    """Return the allocator's segments: ``[]`` where no GPU was used; with a GPU,
    NotImplementedError, as CuPy's pool does not list its blocks."""
    if _used(None, "memory_snapshot") is None:
        return []
    raise NotImplementedError("mpitensor.cuda.memory_snapshot(): CuPy's memory pool does not "
                              "list its segments; use memory_stats() for its byte counts")


def host_memory_stats() -> dict:
    """Return pinned host memory counts: ``{}`` where no GPU was used (as a CPU-only torch);
    with a GPU, NotImplementedError, as CuPy's pinned pool counts no bytes."""
    if _used(None, "host_memory_stats") is None:
        return OrderedDict()
    raise NotImplementedError("mpitensor.cuda.host_memory_stats(): CuPy's pinned memory pool "
                              "counts no bytes, only free blocks")


def host_memory_stats_as_nested_dict() -> dict:
    """:func:`host_memory_stats` as nested dicts (``{}`` where no GPU was used)."""
    return _nested(host_memory_stats())


def reset_accumulated_host_memory_stats() -> None:
    """Not available: CuPy's pinned pool keeps no counts (raises CudaUnavailableError without
    a GPU, NotImplementedError with one)."""
    _cupy("reset_accumulated_host_memory_stats")
    host_memory_stats()


def reset_peak_host_memory_stats() -> None:
    """Not available, as :func:`reset_accumulated_host_memory_stats`."""
    _cupy("reset_peak_host_memory_stats")
    host_memory_stats()


def ipc_collect() -> None:
    """Free GPU memory whose IPC consumers are gone. mpitensor shares no GPU memory between
    processes (its GPU tensors are not sent through IPC handles), so there is none to free.

    Raises:
        CudaUnavailableError: no GPU can be used (a CPU-only torch raises too).
    """
    _cupy("ipc_collect")


class MemPool:
    """A separate CuPy memory pool that allocations inside :func:`use_mem_pool` come from.

    Raises:
        CudaUnavailableError: no GPU can be used (a CPU-only torch raises RuntimeError too).
        NotImplementedError: a custom ``allocator``, ``use_on_oom`` or ``no_split``.
    """

    def __init__(self, allocator: Any = None, use_on_oom: bool = False,
                 no_split: bool = False) -> None:
        cp = _cupy("MemPool")
        if allocator is not None or use_on_oom or no_split:
            raise NotImplementedError("mpitensor.cuda.MemPool(): only a plain CuPy pool; custom "
                                      "allocators, use_on_oom and no_split are not available")
        self._pool = cp.cuda.MemoryPool()
        self._users = 0
        self.allocator = None

    @property
    def id(self) -> tuple:
        """A tuple naming the pool, as torch's pool ids are."""
        return (0, id(self._pool))

    def use_count(self) -> int:
        """The number of ``use_mem_pool`` blocks now using the pool, plus one for itself."""
        return 1 + self._users

    def used_bytes(self) -> int:
        """The bytes arrays hold in this pool (CuPy's count)."""
        return int(self._pool.used_bytes())

    def total_bytes(self) -> int:
        """The bytes this pool holds, in use or cached (CuPy's count)."""
        return int(self._pool.total_bytes())


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: DeviceArg = None) -> Iterator[None]:
    """A ``with`` block whose GPU allocations, in this thread, come from ``pool``.

    Raises:
        CudaUnavailableError: no GPU can be used (when entered).
    """
    cp = _cupy("use_mem_pool")
    _, dev = _gpu(device, "use_mem_pool")
    pool._users += 1
    try:
        with cp.cuda.Device(dev), cp.cuda.using_allocator(pool._pool.malloc):
            yield
    finally:
        pool._users -= 1
