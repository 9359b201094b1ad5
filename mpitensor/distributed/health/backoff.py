"""Pauses between polls of a request: yield the core first, then sleep a growing while.

Every wait in ``health/`` (and the RPC agent's) polls with :class:`Backoff`; the watchdog adds
deadlines, notices and reports on top (``watchdog.py``), the fault notices their own short
waits (``faults.py``). See ``watchdog.py``'s docstring for why each phase is as long as it is.
"""

from __future__ import annotations

import os
import time
from typing import Any

_YIELD_S = 2e-3  # after the spin, poll with sched_yield until the wait is this old
_SLEEP_FRACTION = 0.02  # then sleep this fraction of the time waited so far,
_SLEEP_MAX_S = 1e-3  # up to this long between tests
_BUSY_TEST_S = 1e-5  # a Test call this slow moved data (an idle one takes ~1.5 µs here) ...
_BUSY_WINDOW_S = 2e-4  # ... and earns this much yielding (not sleeping) after it
#: bytes a second a call's transfer is assumed to move at least: a wait for a call of b bytes
#: yields (never sleeps) for b / this, when that is longer than _YIELD_S (see Backoff)
TRANSFER_RATE = 2.5e8
_perf = time.perf_counter
_sleep = time.sleep
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


class Backoff:
    """Pauses between polls of a request that is not complete: yield first, then sleep.

    ``pause(now, test_took)`` is called after each failed ``Test``; ``test_took`` is how long
    that call ran. The pause is ``sched_yield`` for the first :data:`_YIELD_S` of the wait,
    then a sleep of :data:`_SLEEP_FRACTION` of the time waited so far, capped at
    :data:`_SLEEP_MAX_S`: a wait that turns out long costs at most a few per cent more than it
    would have, and almost no CPU. A long ``Test`` call means MPI moved data through this
    rank: the transfer is alive and depends on this rank polling again soon, so it earns
    :data:`_BUSY_WINDOW_S` of yielding without resetting the sleep ramp (a lone slow call, a
    virtual machine's hiccup, costs a fraction of a millisecond, not a new ramp).

    A wait for a call of ``nbytes`` bytes yields for ``nbytes /`` :data:`TRANSFER_RATE` where
    that is longer than :data:`_YIELD_S`: its transfer takes about that long at least, and a
    multi-round MPI schedule moves only while its ranks poll. Measured on 4 ranks of 2 cores,
    an MPI ``Iallreduce`` of 8-16 MiB waited for with sleeps from 2 ms on took 1.2-1.3x as
    long as one waited for with a plain yield loop; sleeping from ``nbytes / 1 GB/s`` on, as
    long as the yield loop, within the run's noise. The rate is a quarter of that: in this
    machine's slow phases a 2 MiB ``Iallreduce`` there took 2.2-2.6 ms (0.8-0.9 GB/s), and
    reached the sleeps again at 1 GB/s. A wait that outlasts its window (a late peer) sleeps
    as before: 4 ms a MiB of yielding, at most, then a few per cent of a core.

    ``moves=False``: the request's ``Test`` moves no data (it reads flags in shared memory,
    and now and then a peer's ``/proc`` entry, 25 µs): a slow one earns no window. Counted
    as data moved, those looks kept a rank waiting 1 s for a late peer in the shared-memory
    engine yielding a fifth of the time: 0.21 s of CPU, against 0.05-0.09 s on MPI's path
    the same day, and 0.05-0.08 s now.
    """

    __slots__ = ("t0", "yield_until", "busy")

    def __init__(self, t0: float, passive: bool = False, nbytes: int = 0,
                 moves: bool = True) -> None:
        self.t0 = t0
        # a passive request (shared-memory arrivals) moves without polling: sleep at once
        self.yield_until = t0 if passive else t0 + max(_YIELD_S, nbytes / TRANSFER_RATE)
        self.busy = _BUSY_TEST_S if moves else float("inf")

    def pause(self, now: float, test_took: float) -> None:
        if test_took > self.busy:
            self.yield_until = max(self.yield_until, now + _BUSY_WINDOW_S)
        if now < self.yield_until:
            _yield()
        else:
            _sleep(min(_SLEEP_MAX_S, (now - self.t0) * _SLEEP_FRACTION))


def poll(req: Any, status: Any, deadline: float) -> bool:
    """Poll ``req`` with :class:`Backoff` until it completes (True) or ``deadline`` (False)."""
    t0 = _perf()
    backoff = Backoff(t0)
    while True:
        before = _perf()
        if req.Test(status):
            return True
        now = _perf()
        if now >= deadline:
            return False
        backoff.pause(now, now - before)
