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

Big layers (ResNet's convolutions) share their work out themselves with :func:`run_split`: the
work falls into independent parts (bands of Winograd tiles, of output pixels, of channels), one
per thread the pool allows, each running its products on a one-thread BLAS and its elementwise
passes (which NumPy runs on one thread) beside them. The threads then meet once per call
instead of once per product: a ResNet-18 step makes some 600 products, and on a machine where
another process holds a core each hand-off to a worker the OS is not running can cost a
scheduler slice (a 64->128 stride-2 convolution's input gradient took 0.5 s instead of 20 ms
with OpenBLAS's threads). It also keeps OpenBLAS's own workers asleep: after each threaded
product they spin for a while (about 0.1 s), which halved the speed of the Python threads
sharing their cores.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

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


def blas_threads() -> int:
    """Threads the BLAS may use now (the largest pool's limit; 1 without threadpoolctl)."""
    return max((lib.num_threads for lib in _pools.get()), default=1)


class _Crew:
    """Helper threads for :func:`run_split`, started on first use, and again after a fork (a
    child inherits the executor object but not its threads) or when more are needed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pool: Optional[ThreadPoolExecutor] = None
        self.pid = -1
        self.size = 0

    def get(self, n: int) -> ThreadPoolExecutor:
        with self.lock:
            if self.pool is None or self.pid != os.getpid() or self.size < n:
                if self.pool is not None and self.pid == os.getpid():
                    self.pool.shutdown(wait=False)
                self.pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="mpitensor")
                self.pid, self.size = os.getpid(), n
            return self.pool


_crew = _Crew()


def run_split(fn: Callable[[Any], Any], parts: Sequence[Any]) -> list:
    """``[fn(part) for part in parts]``, each part on its own thread (this one takes the
    first), with the BLAS on one thread meanwhile; raises the first error once all are done.

    NumPy releases the GIL in its loops and BLAS calls, so the parts run in parallel. With a
    single part, ``fn`` just runs here (on the BLAS threads as they are).
    """
    if len(parts) <= 1:
        return [fn(part) for part in parts]
    pool = _crew.get(len(parts) - 1)
    with one_thread(0):
        futures = [pool.submit(fn, part) for part in parts[1:]]
        first: Any = None
        error: Optional[BaseException] = None
        try:
            first = fn(parts[0])
        except BaseException as exc:  # noqa: BLE001 - re-raised once the others are done
            error = exc
        results = [first]
        for f in futures:
            exc = f.exception()
            if exc is not None and error is None:
                error = exc
            results.append(None if exc is not None else f.result())
        if error is not None:
            raise error
        return results


def split_ranges(n: int, parts: int) -> list:
    """``range(n)`` cut into ``min(parts, n)`` near-equal ``(start, stop)`` pieces."""
    parts = max(1, min(parts, n))
    return [(n * i // parts, n * (i + 1) // parts) for i in range(parts)]
