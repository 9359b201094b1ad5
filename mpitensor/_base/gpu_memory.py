"""Counts of what CuPy's memory pool hands out, for ``torch.cuda``'s memory statistics.

CuPy's pool knows how many bytes are in use and held now (``used_bytes``, ``total_bytes``),
but not the highest they reached. When mpitensor first imports CuPy, :func:`install` puts a
thin allocator in front of the default pool (only where the default pool is still CuPy's
allocator, so a program's own allocator is left alone): each allocation goes to the pool as
before, then the in-use and held bytes of that GPU are read back and the peaks raised. Frees
need no hook: a peak is reached right after an allocation.

Counts start when CuPy is first imported by mpitensor; memory CuPy allocated before that (by
the program calling CuPy itself first) is in the current figures but not in the peaks or the
cumulative counts until the next allocation.
"""

from __future__ import annotations

import threading
from typing import Any

from mpitensor import errors as _errors

__all__ = ["install", "installed", "stats", "reset_peaks", "reset_accumulated"]

_lock = threading.Lock()
_state: dict = {"installed": False, "tried": False}
_per_device: dict = {}  # GPU number -> counts


def _counts(dev: int) -> dict:
    c = _per_device.get(dev)
    if c is None:
        c = _per_device[dev] = {"allocated_peak": 0, "reserved_peak": 0, "allocated_total": 0,
                                "allocations": 0, "ooms": 0}
    return c


def install(cp: Any) -> None:
    """Put the counting allocator in front of CuPy's default pool (once; idempotent)."""
    if _state["tried"]:
        return
    with _lock:
        if _state["tried"]:
            return
        _state["tried"] = True
        pool = cp.get_default_memory_pool()
        current = cp.cuda.get_allocator()
        if current != pool.malloc:
            return  # the program chose its own allocator: leave it, count nothing
        out_of_memory = cp.cuda.memory.OutOfMemoryError

        def malloc(size: int) -> Any:
            dev = cp.cuda.runtime.getDevice()
            try:
                mem = pool.malloc(size)
            except out_of_memory as exc:
                _counts(dev)["ooms"] += 1
                raise _errors.device_out_of_memory(exc, out_of_memory) from exc
            c = _counts(dev)
            used, held = pool.used_bytes(), pool.total_bytes()
            c["allocated_peak"] = max(c["allocated_peak"], used)
            c["reserved_peak"] = max(c["reserved_peak"], held)
            c["allocated_total"] += mem.mem.size if mem.mem is not None else 0
            c["allocations"] += 1
            return mem

        cp.cuda.set_allocator(malloc)
        _state["installed"] = True


def installed() -> bool:
    """Whether the counting allocator is in place."""
    return _state["installed"]


def stats(cp: Any, dev: int) -> dict:
    """The counts of GPU ``dev`` with the pool's current in-use and held bytes."""
    pool = cp.get_default_memory_pool()
    with cp.cuda.Device(dev):
        used, held = int(pool.used_bytes()), int(pool.total_bytes())
    c = dict(_counts(dev))
    c["allocated_peak"] = max(c["allocated_peak"], used)
    c["reserved_peak"] = max(c["reserved_peak"], held)
    c["allocated_current"], c["reserved_current"] = used, held
    return c


def reset_peaks(cp: Any, dev: int) -> None:
    """Set the peaks of GPU ``dev`` to what is in use and held now."""
    s = stats(cp, dev)
    c = _counts(dev)
    c["allocated_peak"], c["reserved_peak"] = s["allocated_current"], s["reserved_current"]


def reset_accumulated(dev: int) -> None:
    """Zero the cumulative counts (bytes and number of allocations, out-of-memory errors)."""
    c = _counts(dev)
    c["allocated_total"] = c["allocations"] = c["ooms"] = 0
