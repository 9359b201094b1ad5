"""Requests still posted in MPI that nobody will wait for any more: kept, with their buffers.

A call that ends before its MPI request does (a fault or an agreement mismatch found while it
waited, an interrupt, a work handle dropped unfinished) leaves that request posted: MPI still
reads or writes its buffers, and the peers' matching calls still meet it. Letting Python collect
it would be worse than leaking it: mpi4py frees a collected request with ``MPI_Request_free``,
which MPI forbids for a collective in flight (MPICH's progress engine then works on freed
memory: a 2-rank all_gather dropped this way hung its peer, and one in a test suite corrupted
the heap and crashed a later, unrelated allocation), and the buffers it writes would be handed
back to the allocator while MPI still fills them.

So such a request goes into one of two process-wide lists here:

* :func:`keep` (a failed call): kept for the life of the process. Its group is broken, the
  request may never complete, and testing it again could raise again; this happens once per
  broken group.
* :func:`keep_dropped` (a healthy work handle dropped before it finished, as ``dist.isend``
  without ``wait()`` is in many torch programs): kept until MPI completes it. Each later drop
  first tests the ones kept before and lets the finished go, so the list holds about as many
  requests as are really in flight; one whose test raises moves to the first list.
"""

from __future__ import annotations

from typing import Any

_failed: list = []  # (request, buffers): posted by calls that failed; never let go
_dropped: list = []  # (request, buffers): from work handles dropped unfinished
_SWEEP_AT = 8  # test the dropped ones once this many are kept


def keep(request: Any, buffers: Any = None) -> None:
    """``request`` (with ``buffers``, what its operation reads or writes beyond what the
    request object holds) outlives the call that gave up on it, for the life of the process."""
    if request is not None:
        _failed.append((request, buffers))


def keep_dropped(request: Any, buffers: Any = None) -> None:
    """A work handle was dropped before ``request`` finished: keep it until MPI finishes it."""
    if request is None:
        return
    if len(_dropped) >= _SWEEP_AT:
        sweep()
    _dropped.append((request, buffers))


def sweep() -> None:
    """Let go of the dropped requests that have finished."""
    global _SWEEP_AT
    left = []
    for entry in _dropped:
        try:
            done = entry[0].Test()
        except Exception:  # noqa: BLE001 - failed in MPI: it may still hold its buffers
            _failed.append(entry)
            continue
        if not done:
            left.append(entry)
    _dropped[:] = left
    _SWEEP_AT = max(8, 2 * len(left))  # many in flight: test them less often


def count() -> int:
    """How many requests are kept (for tests)."""
    return len(_failed) + len(_dropped)
