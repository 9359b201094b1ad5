"""Run small matrix products on one BLAS thread, whatever the pool's size.

OpenBLAS hands any product above a tiny size to all its threads. For the thin products of a
small network (LeNet's layers: well under a millisecond each) the hand-off costs about what the
second thread saves on a quiet machine (LeNet trained 4-7 % slower on two cores with them on
one thread), and far more when another process holds the other core: each product then waits
for a worker thread the OS is not running (with one busy process beside it, LeNet trained at
4 100 samples/s at batch 64 and 2 200 at batch 256 with threaded products, against 8 900 and
7 200 with them on one thread). So the layers wrap their products in :class:`one_thread` with
the size of their work: below :data:`SMALL_WORK` multiply-adds the BLAS runs on one thread for
the duration, and the pool's own limit (the user's, threadpoolctl's, mpitensor's per-rank
budget) is restored afterwards; bigger products keep every thread the pool allows.

The limit is process-wide: a product another Python thread runs meanwhile also gets one BLAS
thread. Without threadpoolctl (or with a BLAS it cannot control) nothing is changed.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

__all__: list = []  # private module: used by mpitensor.nn.functional

#: products of fewer multiply-adds than this run on one BLAS thread (16 M: about 0.4 ms on one
#: core at these shapes, where two threads could save at most 0.2 ms)
SMALL_WORK = 1 << 24


class _Pools:
    """The BLAS thread pools' threadpoolctl controllers, found on first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.libs: Optional[list] = None

    def get(self) -> list:
        if self.libs is None:
            with self.lock:
                if self.libs is None:
                    self.libs = _find_blas()
        return self.libs


def _find_blas() -> list:
    try:
        from threadpoolctl import ThreadpoolController

        return list(ThreadpoolController().select(user_api="blas").lib_controllers)
    except Exception:  # noqa: BLE001 - no threadpoolctl, or a BLAS it cannot load: leave it
        return []


_pools = _Pools()


class one_thread:  # noqa: N801 - used as a context manager, like threadpoolctl's
    """``with one_thread(work):`` runs the block with the BLAS on one thread if ``work``
    (multiply-adds of its biggest product) is below :data:`SMALL_WORK`; restores it after."""

    __slots__ = ("work", "saved")

    def __init__(self, work: int) -> None:
        self.work = work
        self.saved: list = []

    def __enter__(self) -> "one_thread":
        if self.work < SMALL_WORK:
            for lib in _pools.get():
                n = lib.num_threads
                if n > 1:
                    lib.set_num_threads(1)
                    self.saved.append((lib, n))
        return self

    def __exit__(self, *exc: Any) -> None:
        for lib, n in self.saved:
            lib.set_num_threads(n)
        self.saved.clear()
