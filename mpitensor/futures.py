"""``mpitensor.futures`` (``torch.futures``): ``Future``, the result of an asynchronous call,
with ``wait_all`` and ``collect_all``. RPC's calls return these futures, and programs make
their own.

A future is completed once, with a value (:meth:`Future.set_result`) or an exception
(:meth:`Future.set_exception`). Waiting costs one lock: the future holds a lock from birth
and releases it when it completes, so a waiter sleeps in the kernel and is woken directly by
the completing thread (no polling, no condition variable).

Callbacks (:meth:`Future.then`, :meth:`Future.add_done_callback`) added before completion run
in the thread that completes the future; added after, they run at once in the caller's thread.
The RPC agent never runs user callbacks on its progress thread: a future it completes that has
callbacks is completed on the worker pool instead (see ``_agent``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Generic, List, Optional, TypeVar

__all__ = ["Future", "collect_all", "wait_all"]

T = TypeVar("T")
S = TypeVar("S")
logger = logging.getLogger("mpitensor.distributed.rpc")
_PENDING = object()


class Future(Generic[T]):
    """A value that becomes available later (torch.futures.Future's API).

    Example:
        >>> fut = Future()
        >>> doubled = fut.then(lambda f: f.wait() * 2)
        >>> fut.set_result(21)
        >>> doubled.wait()
        42
    """

    __slots__ = ("_lock", "_done", "_value", "_exc", "_callbacks", "_hot", "__weakref__")

    def __init__(self, *, devices: Optional[list] = None) -> None:
        del devices  # torch's CUDA-stream bookkeeping: nothing to do on host arrays
        self._lock = threading.Lock()
        self._done = threading.Lock()
        self._done.acquire()  # released on completion: waiters acquire-and-release it
        self._value: Any = _PENDING
        self._exc: Optional[BaseException] = None
        self._callbacks: Optional[List[Callable]] = None
        self._hot: Optional[Callable[["Future"], None]] = None  # see wait()

    # ---- state
    def done(self) -> bool:
        """Return True once the future holds a value or an exception."""
        return self._value is not _PENDING or self._exc is not None

    def wait(self) -> T:
        """Block until the future completes; return its value or raise its exception.

        An RPC future always completes: with the reply, or with an error once its deadline
        passes or its peer is gone.
        """
        if not self.done():
            hot = self._hot
            if hot is not None:  # an RPC reply: the waiter may meet it itself (see _agent)
                hot(self)
            self._done.acquire()
            self._done.release()
        if self._exc is not None:
            raise self._exc
        return self._value

    def _wait_for(self, seconds: float) -> bool:
        """Block until the future completes or ``seconds`` pass; True if it completed."""
        if self.done():
            return True
        if self._done.acquire(timeout=seconds if seconds != float("inf") else -1):
            self._done.release()
            return True
        return self.done()

    def value(self) -> T:
        """Return the value of a completed future (raise its exception if it holds one).

        Raises:
            RuntimeError: the future has not completed yet (call :meth:`wait` instead).
        """
        if not self.done():
            raise RuntimeError("Future.value() called before the future completed; call "
                               "wait(), or value() inside a then()/add_done_callback callback")
        if self._exc is not None:
            raise self._exc
        return self._value

    def exception(self) -> Optional[BaseException]:
        """The exception the future completed with, or ``None`` (also while pending)."""
        return self._exc

    # ---- completion
    def set_result(self, result: T) -> None:
        """Complete the future with ``result`` and run its callbacks.

        Raises:
            RuntimeError: the future was already completed.
        """
        self._complete(result, None)

    def set_exception(self, result: BaseException) -> None:
        """Complete the future with an exception; :meth:`wait` and :meth:`value` raise it.

        Raises:
            TypeError: ``result`` is not an exception.
            RuntimeError: the future was already completed.
        """
        if isinstance(result, type) and issubclass(result, BaseException):
            result = result()
        if not isinstance(result, BaseException):
            raise TypeError(f"set_exception() takes an exception instance, got {result!r}")
        self._complete(None, result)

    def _complete(self, value: Any, exc: Optional[BaseException],
                  dispatch: Optional[Callable[[Callable[[], None]], None]] = None) -> None:
        with self._lock:
            if self.done():
                raise RuntimeError("this Future is already completed: set_result() and "
                                   "set_exception() may be called once")
            if exc is not None:
                self._exc = exc
            else:
                self._value = value
            callbacks, self._callbacks = self._callbacks, None
        self._done.release()
        if callbacks:
            if dispatch is not None:
                dispatch(lambda: self._run_all(callbacks))
            else:
                self._run_all(callbacks)

    def _run_all(self, callbacks: List[Callable]) -> None:
        for cb in callbacks:
            self._run(cb)

    def _try_complete(self, value: Any, exc: Optional[BaseException],
                      dispatch: Optional[Callable[[Callable[[], None]], None]] = None) -> bool:
        """Complete unless already completed (a reply racing its own timeout); True if done.

        ``dispatch``: where callbacks registered before completion run (the RPC progress
        thread hands them to the worker pool); default: in this thread.
        """
        try:
            self._complete(value, exc, dispatch)
            return True
        except RuntimeError:
            return False

    def _has_callbacks(self) -> bool:
        return bool(self._callbacks)

    # ---- callbacks
    def add_done_callback(self, callback: Callable[["Future[T]"], None]) -> None:
        """Run ``callback(self)`` once the future completes (at once if it has).

        The callback's return value is ignored; an exception it raises is logged, not
        propagated (use :meth:`then` to chain results and errors).
        """
        with self._lock:
            if not self.done():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        self._run(callback)

    def then(self, callback: Callable[["Future[T]"], S]) -> "Future[S]":
        """Return a new future completed with ``callback(self)`` once this one completes.

        If ``callback`` raises, the new future holds that exception.

        Example:
            >>> fut = rpc.rpc_async("worker1", torch.add, args=(t, 1))
            >>> fut.then(lambda f: f.wait() * 2).wait()
        """
        out: Future = Future()

        def chain(fut: Future) -> None:
            try:
                result = callback(fut)
            except BaseException as e:  # noqa: BLE001 - handed to the chained future
                out.set_exception(e)
            else:
                out.set_result(result)

        self.add_done_callback(chain)
        return out

    def _run(self, cb: Callable) -> None:
        try:
            cb(self)
        except Exception:  # noqa: BLE001 - a failing callback must not break the completer
            logger.exception("a Future done-callback raised")

    def __repr__(self) -> str:
        if not self.done():
            return "Future(pending)"
        if self._exc is not None:
            return f"Future(exception={self._exc!r})"
        return f"Future(value={self._value!r})"


def collect_all(futures: List[Future]) -> Future:
    """Return a future completed with the list of ``futures`` once all of them complete.

    As in torch, the combined future completes normally even where some of the futures hold
    errors: call ``wait()`` on each to see them.
    """
    futures = list(futures)
    out: Future = Future()
    if not futures:
        out.set_result([])
        return out
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            out.set_result(futures)

    for f in futures:
        f.add_done_callback(one_done)
    return out


def wait_all(futures: List[Future]) -> list:
    """Wait for every future and return their values; raise the first error met, in order."""
    return [f.wait() for f in futures]
