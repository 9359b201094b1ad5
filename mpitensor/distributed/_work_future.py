"""Futures of collectives: :meth:`Work.get_future` (what DDP communication hooks return).

MPI has no progress thread, so nothing completes a collective's future in the background: the
future is completed by whoever waits on it (or on a future chained from it with ``then``), by
waiting on the underlying :class:`Work` (:func:`progress` lets MPI advance it meanwhile). A
chained future drives its source when waited on, so ``work.get_future().then(f).then(g).wait()``
runs the collective, ``f`` and ``g`` in order, in the waiting thread.
"""

from __future__ import annotations

from typing import Any, Callable

from ..futures import Future

__all__ = ["WorkFuture", "completed_future", "progress"]


def _drive(fut: "Future") -> None:
    """Make ``fut`` complete if a driver is attached; errors end up in the future itself."""
    hot = fut._hot
    if hot is not None and not fut.done():
        hot(fut)


class _Driver:
    """Completes a work's future from the work (``Future._hot``: called by ``wait()``)."""

    __slots__ = ("work",)

    def __init__(self, work: Any) -> None:
        self.work = work

    def __call__(self, fut: Future) -> None:
        try:
            value = self.work.result()
        except BaseException as exc:  # noqa: BLE001 - handed to the future's waiters
            fut._try_complete(None, exc)
        else:
            fut._try_complete(value, None)


class _Chain:
    """Drives the future a ``then()`` future was chained from."""

    __slots__ = ("src",)

    def __init__(self, src: Future) -> None:
        self.src = src

    def __call__(self, fut: Future) -> None:
        _drive(self.src)


class WorkFuture(Future):
    """A :class:`~mpitensor.futures.Future` completed by waiting on it.

    It completes only when waited on (or a future chained from it is), never on its own:
    callbacks (``then``), which may start further collectives, then run in the same order on
    every rank, wherever each rank's collectives happened to finish. Its ``then`` returns
    another :class:`WorkFuture` that drives this one when waited on.
    """

    __slots__ = ()

    @classmethod
    def of_work(cls, work: Any) -> "WorkFuture":
        """The future of ``work``: completes with ``work.result()`` (the list of its output
        tensors), or with the exception the work raised."""
        fut = cls()
        fut._hot = _Driver(work)
        return fut

    def then(self, callback: Callable[[Future], Any]) -> "WorkFuture":
        out = super().then(callback)
        out.__class__ = WorkFuture  # same slots: only the class changes
        if not out.done():
            out._hot = _Chain(self)
        return out


def progress(fut: Future) -> None:
    """Let MPI advance the collective behind ``fut`` (one test of its request) without
    completing ``fut``: MPI has no progress thread, and its callbacks must wait for ``wait``."""
    hot = fut._hot
    while isinstance(hot, _Chain):
        hot = hot.src._hot
    if isinstance(hot, _Driver):
        hot.work.is_completed()


def completed_future(value: Any) -> WorkFuture:
    """A future that already holds ``value``."""
    fut = WorkFuture()
    fut.set_result(value)
    return fut
