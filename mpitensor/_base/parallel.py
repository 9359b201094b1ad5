"""Threads inside one rank: small matrix products on one BLAS thread, big work shared out.

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

Memory-bound elementwise passes (relu and its gradient, 2x2 max pooling, both directions) over
large arrays are shared out the same way by :func:`split_pass`: NumPy runs each on one core,
so at a budget of two threads LeNet's step at batch 256 spent a third of its time with the
second core idle.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any, Callable, Optional, Sequence

__all__: list = []  # private module: used by mpitensor.nn and the elementwise ops

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


#: the limits that active :class:`one_thread` blocks lowered to 1 (the thread budget they hide)
_lowered: list = []
#: active :class:`one_thread` blocks made with ``split=False``
_serial: list = []


class one_thread:  # noqa: N801 - used as a context manager, like threadpoolctl's
    """``with one_thread(work):`` runs the block with the BLAS on one thread if ``work``
    (multiply-adds of its biggest product) is below :data:`SMALL_WORK`; restores it after.

    :func:`blas_threads` still reports the limit from before, inside the block: a layer whose
    products are small runs them on one BLAS thread each, and still shares its bands out over
    that many threads of its own (:func:`run_split`). With ``split=False`` it reports 1
    instead, so that the splits inside run in one part here: for work whose parts would be too
    small to pay for the hand-off (LeNet's first convolution: bands of 300 K multiply-adds,
    each mostly Python).
    """

    __slots__ = ("work", "split", "saved", "hidden")

    def __init__(self, work: int, split: bool = True) -> None:
        self.work = work
        self.split = split
        self.saved: list = []
        self.hidden = 0

    def __enter__(self) -> "one_thread":
        if self.work < SMALL_WORK:
            for lib in _pools.get():
                n = lib.num_threads
                if n > 1:
                    lib.set_num_threads(1)
                    self.saved.append((lib, n))
            if self.saved:
                self.hidden = max(n for _, n in self.saved)
                _lowered.append(self.hidden)
        if not self.split:
            _serial.append(1)
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.split:
            _serial.pop()
        for lib, n in self.saved:
            lib.set_num_threads(n)
        self.saved.clear()
        if self.hidden:
            _lowered.remove(self.hidden)
            self.hidden = 0


def blas_threads() -> int:
    """The thread budget of this process: the BLAS pool's limit (the largest pool's; 1 without
    threadpoolctl), or the limit an active :class:`one_thread` block lowered, if larger; 1
    inside ``one_thread(..., split=False)``."""
    if _serial:
        return 1
    live = max((lib.num_threads for lib in _pools.get()), default=1)
    return max(live, max(_lowered, default=1))


class _Job:
    """One :func:`run_split` call: its parts, taken one at a time by whichever thread is free.

    Parts are handed out by a shared counter (``next`` on an ``itertools.count`` is atomic
    under the GIL), so a helper that the OS has not scheduled yet takes nothing: the caller
    runs the parts itself and waits only for parts a helper has actually started. With the
    other core busy (another rank, another program) splitting then costs the hand-off and no
    more, where a fixed share per thread made the caller wait a scheduler slice for it.
    """

    __slots__ = ("fn", "parts", "results", "errors", "next", "done", "finished")

    def __init__(self, fn: Callable[[Any], Any], parts: Sequence[Any]) -> None:
        self.fn, self.parts = fn, parts
        n = len(parts)
        self.results: list = [None] * n
        self.errors: list = [None] * n
        self.next = itertools.count()
        self.done = itertools.count(1)
        self.finished = threading.Lock()
        self.finished.acquire()  # released by whoever completes the last part

    def work(self) -> None:
        n = len(self.parts)
        while True:
            i = next(self.next)
            if i >= n:
                return
            try:
                self.results[i] = self.fn(self.parts[i])
            except BaseException as exc:  # noqa: BLE001 - raised by the caller
                self.errors[i] = exc
            if next(self.done) == n:
                self.finished.release()


class _Hand:
    """One helper thread: it waits on ``go``, works on the job it was handed, and waits again.

    A bare lock makes the hand-off: about 15 us from handing work over to the helper running
    it, where a ``ThreadPoolExecutor`` (futures, a queue, condition variables) took about 75 us
    on the same machine. That difference decides whether splitting a 0.3 ms elementwise pass in
    two pays at all. ``idle`` is set just before the helper blocks, and work is handed only to
    an idle helper, so ``go`` is never released twice.
    """

    __slots__ = ("go", "job", "idle", "thread")

    def __init__(self) -> None:
        self.go = threading.Lock()
        self.go.acquire()
        self.job: Optional[_Job] = None
        self.idle = False
        self.thread = threading.Thread(target=self._serve, name="mpitensor-split", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            self.job = None
            self.idle = True
            self.go.acquire()
            self.job.work()  # type: ignore[union-attr]

    def give(self, job: _Job) -> bool:
        """Hand ``job`` over if this helper is waiting; False if it is still busy."""
        if not self.idle:
            return False
        self.idle = False
        self.job = job
        self.go.release()
        return True


class _Crew:
    """The helper threads of :func:`run_split`, started on first use, and anew after a fork (a
    child inherits the objects but not the threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards the list
        self.busy = threading.Lock()  # held while a split runs
        self.hands: list = []
        self.pid = -1

    def get(self, n: int) -> list:
        with self.lock:
            if self.pid != os.getpid():
                self.hands, self.pid = [], os.getpid()
                self.busy = threading.Lock()
            while len(self.hands) < n:
                self.hands.append(_Hand())
            return self.hands[:n]


_crew = _Crew()


def run_split(fn: Callable[[Any], Any], parts: Sequence[Any]) -> list:
    """``[fn(part) for part in parts]``, the parts shared between this thread and up to
    ``len(parts) - 1`` helpers, with the BLAS on one thread meanwhile; raises the first error
    (in part order) once all parts are done.

    NumPy releases the GIL in its loops and BLAS calls, so the parts run in parallel; each part
    goes to whichever thread is free next (:class:`_Job`). With a single part, ``fn`` just runs
    here (on the BLAS threads as they are). A split started while another is running (from a
    part, or from a second Python thread of the user's) runs its parts one after the other here:
    the helpers are busy, and waiting for them could deadlock.
    """
    if len(parts) <= 1:
        return [fn(part) for part in parts]
    hands = _crew.get(len(parts) - 1)
    busy = _crew.busy
    if not busy.acquire(blocking=False):
        with one_thread(0):
            return [fn(part) for part in parts]
    try:
        with one_thread(0):
            job = _Job(fn, parts)
            for hand in hands:
                hand.give(job)
            job.work()
            job.finished.acquire()  # the parts the helpers took are done
        for exc in job.errors:
            if exc is not None:
                raise exc
        return job.results
    finally:
        busy.release()


#: an elementwise pass over at least this many elements is shared out across the threads the
#: budget allows (:func:`split_pass`); below it, one thread is faster than a hand-off (LeNet at
#: batch 64, whose largest passes are 301 K elements, trained 8 % slower with them split at
#: 256 K; at batch 256, 1.2 M elements, splitting from 512 K gained as much as from 256 K)
SPLIT_ELEMENTS = 1 << 19


def split_pass(fn: Callable[[tuple], Any], n: int, elements: int) -> None:
    """Run ``fn((start, stop))`` over ``range(n)``, split across threads when the pass touches
    at least :data:`SPLIT_ELEMENTS` ``elements``, else in one call here.

    For memory-bound NumPy passes (relu, pooling, masks) that a thread budget of 2 or more would
    otherwise leave on one core: ``fn`` works on rows ``start:stop`` of its arrays' outermost
    axis in memory, so the parts touch disjoint memory.
    """
    threads = blas_threads() if elements >= SPLIT_ELEMENTS else 1
    run_split(fn, split_ranges(n, threads))


def split_ranges(n: int, parts: int) -> list:
    """``range(n)`` cut into ``min(parts, n)`` near-equal ``(start, stop)`` pieces."""
    parts = max(1, min(parts, n))
    return [(n * i // parts, n * (i + 1) // parts) for i in range(parts)]
