"""The callee side of the RPC agent: requests served on the worker pool, RRefs owned here.

:class:`Serving` is one part of :class:`~._agent.Agent` (a mix-in: it works on the agent's
state). A request's function runs on a pool thread, which sends the reply itself; an RRef
owned by this process is counted by the forks that other workers hold of it.
"""


from __future__ import annotations

import logging
import pickle
from typing import Any, Callable, Dict, Tuple

from mpitensor.futures import Future

from . import _wire

logger = logging.getLogger("mpitensor.distributed.rpc")
_TOKEN_WAIT_S = 2e-5  # a pool thread waits this long for the progress thread's turn to end
_loads = pickle.loads
_dumps_plain = pickle.dumps
_PLAIN = _wire.PLAIN



class OwnerEntry:
    """An RRef's value on its owner, and the forks (user RRefs elsewhere) that keep it alive.

    ``forks`` maps a fork id to a count that fork notices move up and delete notices move
    down; notices travel on different links and may arrive in any order, so a count may dip
    below zero for a while. The entry is kept by the agent while any count is not zero or
    while its creating request has not arrived; owner RRef objects in this process hold it too.
    """

    __slots__ = ("id", "future", "forks", "created", "__weakref__")

    def __init__(self, rref_id: Tuple[int, int], created: bool) -> None:
        self.id = rref_id
        self.future: Future = Future()
        self.forks: Dict[Tuple[int, int], int] = {}
        self.created = created


class _AsyncResult:
    """Returned by a served function whose reply is a future's eventual value."""

    __slots__ = ("fut",)

    def __init__(self, fut: Any) -> None:
        self.fut = fut


def is_async(func: Any) -> bool:
    """Whether ``func`` was decorated with ``rpc.functions.async_execution``."""
    return bool(getattr(func, "_wrapped_async_rpc_function", False))



class Serving:
    """Running requests and owning RRefs: the agent's methods for what others ask of it."""

    def spawn(self, fn: Callable, *args: Any) -> None:
        """Run ``fn(*args)`` on the worker pool, counted as work for shutdown."""
        with self.lock:
            self.busy += 1
        try:
            self.pool.submit(self._task, fn, args)
        except RuntimeError:  # the interpreter is exiting: the pool takes nothing new
            with self.lock:
                self.busy -= 1
            raise

    def _task(self, fn: Callable, args: tuple) -> None:
        """A pool task; afterwards the thread polls for the next request and runs it itself.

        The task counts as work (``busy``) until the thread stops polling: a request it grabs
        is counted from its arrival, without touching the counter.
        """
        try:
            while True:
                try:
                    fn(*args)
                except BaseException:  # noqa: BLE001 - a task must never kill a pool thread
                    logger.exception("RPC worker task failed on %s", self.where)
                del fn, args
                if self.pollers or not self.running:
                    return  # another thread polls already
                nxt = self.poll_hot(None, True, _TOKEN_WAIT_S)
                if nxt is None:
                    return
                fn, args = nxt
                del nxt  # (the request's buffers must not outlive its run)
        finally:
            with self.lock:
                self.busy -= 1

    def hold(self) -> None:
        """Count a reply still to be sent after its task ended (async_execution)."""
        with self.lock:
            self.busy += 1

    def release(self) -> None:
        with self.lock:
            self.busy -= 1

    def reply(self, dest: int, reqid: int, value: Any, what: str) -> None:
        """Send ``value`` as the reply to request ``reqid`` (an error reply if it won't pickle)."""
        try:
            data, bufs = self.pickle_for(dest, value, what, "the result")
        except TypeError as e:
            self.reply_error(dest, reqid, e)
            return
        self.post(dest, _wire.REPLY, 0, reqid, data, bufs)

    def reply_error(self, dest: int, reqid: int, exc: BaseException) -> None:
        data, bufs = _wire.dumps(_wire.encode_error(exc, self.where), dest)
        self.post(dest, _wire.ERROR, 0, reqid, data, bufs)

    def reply_from_future(self, dest: int, reqid: int, fut: Any, what: Any,
                          ctx: Any = None) -> None:
        """Send the reply once ``fut`` completes (the reply of an async_execution function).

        ``ctx``: the distributed autograd context the request carried: the reply is pickled
        inside it (in whichever thread completes ``fut``).
        """
        if not isinstance(fut, Future):
            self.reply_error(dest, reqid, TypeError(
                f"{what}: a function decorated with @rpc.functions.async_execution must return "
                f"a Future (torch.futures.Future), but it returned {type(fut).__name__}"))
            return
        self.hold()

        def done(f: Future) -> None:
            token = None
            try:
                exc = f.exception()
                if exc is not None:
                    self.reply_error(dest, reqid, exc)
                else:
                    if ctx is not None:
                        token = _wire.hooks.enter(ctx)
                    self.reply(dest, reqid, f.value(), what)
            finally:
                if token is not None:
                    _wire.hooks.exit(token)
                self.release()

        fut.add_done_callback(done)

    def _request(self, call: tuple) -> Tuple[Any, tuple, dict, Any]:
        """``(func, args, kwargs, ctx)`` of a request ``(func, args, kwargs[, ctx])``: the
        function found again where it came by reference; ``ctx``, the distributed autograd
        context it was made in, or ``None``."""
        func, args, kwargs = call[0], call[1], call[2]
        if func.__class__ is bytes:
            func = _wire.load_func(func, self.funcs)
        return func, args, kwargs, (call[3] if len(call) > 3 else None)

    def _serve_call(self, src: int, reqid: int, data: Any, arrays: list) -> None:
        token = ctx = None
        try:
            try:
                call = _loads(data, buffers=arrays)
                del data, arrays
                func, args, kwargs, ctx = self._request(call)
                del call
                if ctx is not None:
                    token = _wire.hooks.enter(ctx)
                result = func(*args, **kwargs)
                del args, kwargs
            except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
                self.reply_error(src, reqid, e)
                return
            if result.__class__ is _AsyncResult or is_async(func):
                what = _Lazy(lambda: f"{_func_name(func)} called by {self.infos[src]!r}")
                fut = result.fut if result.__class__ is _AsyncResult else result
                del result
                self.reply_from_future(src, reqid, fut, what, ctx)
            else:  # (reply() inlined: the hot path of every call)
                try:
                    if result.__class__ in _PLAIN:  # (see _wire.PLAIN)
                        data, bufs = _dumps_plain(result, protocol=5), []
                    else:
                        data, bufs = _wire.dumps(result, src)
                except Exception as e:  # noqa: BLE001 - the caller gets a clear TypeError
                    what = f"{_func_name(func)} called by {self.infos[src]!r}"
                    err = self.unpicklable(src, what, "the result", e)
                    err.__cause__ = e
                    self.reply_error(src, reqid, err)
                    return
                del result
                self.post(src, _wire.REPLY, 0, reqid, data, bufs)
        finally:
            if token is not None:
                _wire.hooks.exit(token)

    def _serve_remote(self, entry: OwnerEntry, src: int, data: Any, arrays: list) -> None:
        token = None
        try:
            call = _wire.loads(data, arrays)
            del data, arrays
            func, args, kwargs, ctx = self._request(call)
            del call
            if ctx is not None:  # made inside a distributed autograd context: run inside it
                token = _wire.hooks.enter(ctx)
            result = func(*args, **kwargs)
            del args, kwargs
        except BaseException as e:  # noqa: BLE001 - kept for to_here() to raise
            entry.future._try_complete(None, e)
            return
        finally:
            if token is not None:
                _wire.hooks.exit(token)
        if isinstance(result, _AsyncResult) or is_async(func):
            fut = result.fut if isinstance(result, _AsyncResult) else result
            if not isinstance(fut, Future):
                entry.future._try_complete(None, TypeError(
                    f"{_func_name(func)} is decorated with @rpc.functions.async_execution but "
                    f"returned {type(fut).__name__}, not a Future"))
                return
            self.hold()

            def done(f: Future) -> None:
                try:
                    entry.future._try_complete(f._value, f.exception())
                finally:
                    self.release()

            fut.add_done_callback(done)
        else:
            entry.future._try_complete(result, None)

    def _serve_fetch(self, src: int, reqid: int, data: Any) -> None:
        try:
            rref_id, ctx = _wire.loads(data, [])
        except BaseException as e:  # noqa: BLE001
            self.reply_error(src, reqid, e)
            return
        entry = self.owner_get(rref_id)
        self.reply_from_future(src, reqid, entry.future, f"to_here() by {self.infos[src]!r}",
                               ctx)

    def remote_self(self, entry: OwnerEntry, obj: Any, what: str) -> None:
        """``remote()`` to this very worker: run on the pool, arguments copied as a message's."""
        self.check_running(what)
        ctx = _wire.hooks.attach(self.rank)
        if ctx is not None:
            obj = (*obj, ctx)
        data, bufs = self.pickle_for(self.rank, obj, what, "its arguments")
        self.spawn(self._serve_remote, entry, self.rank, data, [bytearray(b) for b in bufs])

    # ------------------------------------------------------------------------ RRef owner side
    def owner_get(self, rref_id: Tuple[int, int]) -> OwnerEntry:
        """The entry of an RRef owned here (made, waiting for its creator, if unknown yet)."""
        with self.owner_lock:
            e = self.owned.get(rref_id) or self.owned_weak.get(rref_id)
            if e is None:
                e = OwnerEntry(rref_id, created=False)
                self.owned_weak[rref_id] = e
                self.owned[rref_id] = e
            return e

    def owner_new(self) -> OwnerEntry:
        """A fresh entry owned here, held only by the owner RRef objects that refer to it."""
        rref_id = (self.rank, next(self.reqids))
        e = OwnerEntry(rref_id, created=True)
        with self.owner_lock:
            self.owned_weak[rref_id] = e
        return e

    def owner_count(self, rref_id: Tuple[int, int], fork: Tuple[int, int], delta: int,
                    create: bool = False) -> None:
        with self.owner_lock:
            e = self.owned.get(rref_id) or self.owned_weak.get(rref_id)
            if e is None:
                e = OwnerEntry(rref_id, created=False)
                self.owned_weak[rref_id] = e
            if create:
                e.created = True
            if delta:
                c = e.forks.get(fork, 0) + delta
                if c:
                    e.forks[fork] = c
                else:
                    e.forks.pop(fork, None)
            if e.forks or not e.created:
                self.owned[rref_id] = e
            else:
                # no fork left anywhere: only this process's owner RRefs (if any) keep it
                self.owned.pop(rref_id, None)

    def fork(self, owner: int, rref_id: Tuple[int, int]) -> Tuple[int, int]:
        """A new fork of an RRef that is being pickled: counted at the owner before use."""
        fork_id = (self.rank, next(self.reqids))
        if owner == self.rank:
            self.owner_count(rref_id, fork_id, +1)
        else:
            self.enqueue(_wire.ADD, owner, (rref_id, fork_id))
        return fork_id

    def drop_fork(self, owner: int, rref_id: Tuple[int, int], fork_id: Tuple[int, int]) -> None:
        """A fork is gone (a user RRef deleted, or a fork that reached its owner)."""
        if owner == self.rank:
            self.owner_count(rref_id, fork_id, -1)
        else:
            self.enqueue(_wire.DEL, owner, (rref_id, fork_id))



class _Lazy:
    """A description for error messages, formatted only if one is written."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], str]) -> None:
        self.make = make

    def __str__(self) -> str:
        return self.make()

    __repr__ = __str__


def _func_name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
