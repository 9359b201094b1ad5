"""Futures of collectives: :meth:`Work.get_future` (what DDP communication hooks return).

MPI has no progress thread, so nothing completes a collective's future in the background: the
future is completed by whoever waits on it (or on a future chained from it with ``then``), by
waiting on the underlying :class:`Work`. A chained future drives its source when waited on, so
``work.get_future().then(f).then(g).wait()`` runs the collective, ``f`` and ``g`` in order, in
the waiting thread.
"""

from __future__ import annotations

from typing import Any, Callable

from ..futures import Future

__all__ = ["WorkFuture", "completed_future"]


def _drive(fut: "Future") -> None:
    """Make ``fut`` complete if a driver is attached; errors end up in the future itself."""
    hot = fut._hot
    if hot is not None and not fut.done():
        hot(fut)


class WorkFuture(Future):
    """A :class:`~mpitensor.futures.Future` completed by waiting on its source.

    Its ``then`` returns another :class:`WorkFuture` that drives this one when waited on.
    """

    __slots__ = ()

    @classmethod
    def of_work(cls, work: Any) -> "WorkFuture":
        """The future of ``work``: completes with ``work.result()`` (the list of its output
        tensors), or with the exception the work raised."""
        fut = cls()

        def drive(f: Future) -> None:
            try:
                value = work.result()
            except BaseException as exc:  # noqa: BLE001 - handed to the future's waiters
                f._try_complete(None, exc)
            else:
                f._try_complete(value, None)

        if work.is_completed():
            drive(fut)
        else:
            fut._hot = drive
        return fut

    def then(self, callback: Callable[[Future], Any]) -> "WorkFuture":
        out = super().then(callback)
        out.__class__ = WorkFuture  # same slots: only the class changes
        if not out.done():
            out._hot = lambda _f, src=self: _drive(src)
        return out


def completed_future(value: Any) -> WorkFuture:
    """A future that already holds ``value``."""
    fut = WorkFuture()
    fut.set_result(value)
    return fut
