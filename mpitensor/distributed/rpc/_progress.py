"""The progress engine of the RPC agent: incoming messages, transfers, deadlines, dead peers.

:class:`Progress` is one part of :class:`~._agent.Agent` (a mix-in: it works on the agent's
state). One thread at a time holds ``agent.token`` and turns the engine: the progress thread
when nobody else does, or a user or pool thread that waits for its reply or its next request
(``poll_hot``), so that on the hot path no thread hands anything to another.
"""


from __future__ import annotations

import heapq
import logging
import os
import pickle
import threading
import time
from typing import Any, Callable, Optional, Tuple

import numpy as np

from mpitensor.futures import Future

from ..._base import workspace as _workspace
from ...errors import DistributedTimeoutError
from ..health import backoff as _backoff
from ..health import watchdog as _watchdog
from . import _wire

logger = logging.getLogger("mpitensor.distributed.rpc")
_perf = time.perf_counter
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
_IMPROBE_BATCH = 64  # headers taken per loop turn before the other duties get a look
_TRANSFER_YIELD_S = 0.02  # with transfers in flight, yield (never sleep) this long
_CHORES_S = 1e-4  # a hot poller tests transfers, expires deadlines etc. this often
# a hot poller polls without yielding this long after news: a reply or the next request
# comes within about 10 µs when the cores are free. Longer spins (50-200 µs) measured no
# better there, and worse under load (mean round trip 1.5-2x that of no spin, with other jobs
# on the two cores), where spinning holds the core a descheduled peer needs
_SPIN_S = 1e-5
_unpack_head = _wire.HEADER.unpack_from
_HEAD_SIZE = _wire.HEADER.size
_REPLY = _wire.REPLY
_CALL = _wire.CALL
_loads = pickle.loads



class _Pending:
    """An outgoing request awaiting its reply."""

    __slots__ = ("fut", "dest", "deadline", "what", "t0")

    def __init__(self, fut: Future, dest: int, deadline: float, what: str, t0: float) -> None:
        self.fut, self.dest, self.deadline, self.what, self.t0 = fut, dest, deadline, what, t0


class _SyncReply:
    """The reply of an ``rpc_sync`` call: what a Future does for it, for less.

    ``rpc_sync`` hands no future to anyone, so there are no callbacks, and only one thread
    completes it (the one that took its entry out of ``pending``): no lock is needed unless
    the caller has to sleep, and then it makes one. A Future costs about 0.5 µs more per call.
    """

    __slots__ = ("value", "exc", "finished", "sleeper")

    def __init__(self) -> None:
        self.value: Any = None
        self.exc: Optional[BaseException] = None
        self.finished = False
        self.sleeper: Optional[threading.Lock] = None

    def done(self) -> bool:
        return self.finished

    def _has_callbacks(self) -> bool:
        return False

    def _try_complete(self, value: Any, exc: Optional[BaseException],
                      dispatch: Any = None) -> bool:
        if self.finished:
            return False
        self.value, self.exc = value, exc
        self.finished = True
        sleeper = self.sleeper
        if sleeper is not None:  # (set before the caller's last look at ``finished``)
            sleeper.release()
        return True

    def wait(self) -> Any:
        if not self.finished:
            sleeper = threading.Lock()
            sleeper.acquire()
            self.sleeper = sleeper
            if not self.finished:
                sleeper.acquire()
        if self.exc is not None:
            raise self.exc
        return self.value



class _Incoming:
    """A header received whose out-of-band buffers are still arriving."""

    __slots__ = ("src", "kind", "flags", "reqid", "data", "arrays", "reqs")

    def __init__(self, src: int, kind: int, flags: int, reqid: int, data: Any,
                 arrays: list, reqs: list) -> None:
        self.src, self.kind, self.flags, self.reqid = src, kind, flags, reqid
        self.data, self.arrays, self.reqs = data, arrays, reqs



class Progress:
    """Turning the engine: the agent's methods run by the thread that holds its token."""

    def _progress_once(self, grab: bool = False) -> Tuple[bool, float]:
        """One turn of the progress engine (the caller holds ``self.token``).

        Sends queued control messages, takes incoming headers, tests transfers in flight and
        expires deadlines. Returns (whether anything happened, how long the tests took).
        ``grab``: the caller is a pool thread willing to run one incoming request itself.
        """
        worked = False
        ctlq = self.ctlq
        while ctlq:
            kind, dest, obj = ctlq.popleft()
            if dest in self.gone:
                continue
            data, bufs = _wire.dumps(obj, dest)
            self.post(dest, kind, 0, 0, data, bufs)
            worked = True
        self.grab = grab
        try:
            return self._progress_rest(worked)
        finally:
            self.grab = False

    def _progress_rest(self, worked: bool) -> Tuple[bool, float]:
        MPI = self.MPI
        improbe = self.comm.Improbe
        status = self.status
        for _ in range(_IMPROBE_BATCH):
            m = improbe(MPI.ANY_SOURCE, _wire.TAG_HEADER, status)
            if m is None:
                break
            worked = True
            self._receive(m, status)
            if self.grabbed is not None:
                break
        sends, incoming, heap = self.sends, self.incoming, self.heap
        while self.new_sends:
            x = self.new_sends.popleft()
            (self.abandoned if x[3] in self.gone else sends).append(x)
        while self.new_deadlines:
            heapq.heappush(heap, self.new_deadlines.popleft())
        if len(heap) > 2 * len(self.pending) + 1024:
            self._prune_deadlines()
        took = 0.0
        if incoming or sends:
            before = _perf()
            testall = MPI.Request.Testall
            if incoming:
                left = []
                for inc in incoming:
                    if testall(inc.reqs):
                        self._deliver(inc.src, inc.kind, inc.flags, inc.reqid, inc.data,
                                      inc.arrays)
                        worked = True
                    else:
                        left.append(inc)
                incoming[:] = left
            if sends:
                n = len(sends)
                failed: list = []
                sends[:] = [x for x in sends if not self._sent(x, testall, failed)]
                worked = worked or len(sends) != n
                for rank, why in failed:
                    self._peer_died(rank, why)
            took = _perf() - before
        now = _perf()
        if heap and heap[0][0] <= now:
            self._expire(heap, now)
        if now >= self.watch.next_at:
            self._check_peers(now)
        return worked, took

    def _sent(self, entry: tuple, testall: Callable, failed: list) -> bool:
        """Whether an outstanding send is over: complete, or failed (noted in ``failed``)."""
        try:
            return testall(entry[0])
        except self.MPI.Exception as e:  # the destination is dead (a network error)
            failed.append((entry[3], f"sending to it failed: {e}"))
            return True

    def _check_peers(self, now: float) -> None:
        """Check that the peers this worker waits on are alive (see ``_liveness``)."""
        if self.in_shutdown:
            targets = set(self.live())
        else:
            targets = {p.dest for p in list(self.pending.values())}
        targets.discard(self.rank)
        targets -= self.gone
        pings, dead = self.watch.check(now, targets)
        for r in pings:
            try:
                self.post(r, _wire.PING, 0, 0, b"", [])
            except self.MPI.Exception as e:
                dead.append((r, f"sending to it failed: {e}"))
        for r, why in dead:
            self._peer_died(r, why)

    def _prune_deadlines(self) -> None:
        """Rebuild the deadline heap from the calls still waiting.

        A call answered before its deadline leaves its entry in the heap (removing it would
        cost a search); at 20,000 calls a second with the default 60 s deadline that would be
        over a million entries.
        """
        pending = self.pending
        heap = [e for e in self.heap if e[1] in pending]
        heapq.heapify(heap)
        self.heap[:] = heap

    def poll_hot(self, done: Optional[Callable[[], bool]], grab: bool,
                 wait_token: float = 0.0) -> Optional[Tuple[Callable, tuple]]:
        """Drive progress from this thread for a while, instead of the progress thread.

        A thread waiting for a reply (``done``: its future's ``done``) meets the reply itself,
        and a pool thread that has just served a request (``grab``) meets the next request
        and runs it itself: no thread hand-off on the hot path of back-to-back calls. After
        news it polls without pause for :data:`_SPIN_S` (not where the node has more ranks
        than cores), then with ``sched_yield`` between polls, and gives up after
        :data:`_backoff._YIELD_S` without news; meanwhile the progress thread stands aside.
        Returns the request grabbed (to run), if any.

        Between full turns of the engine (every :data:`_CHORES_S`, or every poll while
        transfers or notices are under way) a poll is one ``Improbe``: the reply or request
        is met within about a microsecond of its arrival, and checked for at once.
        """
        token = self.token
        if not (token.acquire(timeout=wait_token) if wait_token else token.acquire(False)):
            return None
        return self._poll_held(done, grab)

    def _poll_held(self, done: Optional[Callable[[], bool]],
                   grab: bool) -> Optional[Tuple[Callable, tuple]]:
        """:meth:`poll_hot` once the token is held (released on return)."""
        token = self.token
        task = None
        self.pollers += 1
        try:
            improbe = self.comm.Improbe
            status = self.status
            anywhere, tag = self.MPI.ANY_SOURCE, _wire.TAG_HEADER
            now = _perf()
            end = now + _backoff._YIELD_S
            # spin before yielding, unless this node has more ranks than cores (then a spin
            # takes the core from the peer whose message is awaited; see _watchdog)
            spin = _SPIN_S if _watchdog._SPIN_S else 0.0
            spin_until = now + spin
            while self.running and not (done is not None and done()):
                if (now >= self.chores_at or self.sends or self.incoming or self.ctlq
                        or self.new_sends):
                    worked, took = self._progress_once(grab)
                    self.chores_at = now + _CHORES_S
                else:
                    m = improbe(anywhere, tag, status)
                    worked, took = m is not None, 0.0
                    if worked:
                        self.grab = grab
                        try:
                            self._receive(m, status)
                        finally:
                            self.grab = False
                        if done is not None and done():
                            break  # the awaited reply: return it at once
                if self.grabbed is not None:
                    task, self.grabbed = self.grabbed, None
                    break
                now = _perf()
                if worked or took > _backoff._BUSY_TEST_S:
                    end = now + _backoff._YIELD_S
                    self.active_at = now
                    if worked:
                        spin_until = now + spin
                        continue  # the reply may be in: check before yielding the core
                elif now >= end:
                    break
                if now >= spin_until:
                    _yield()
                    now = _perf()
        finally:
            self.pollers -= 1
            token.release()
            if self.standing_by and task is None and (self.pending or self.sends
                                                      or self.incoming or self.ctlq):
                # work is left that needs polling. (Otherwise the progress thread takes over
                # within a millisecond: a thread that took a request polls again when it has
                # served it, and one whose reply came will likely call again soon; waking the
                # progress thread meanwhile costs them a core.)
                self.wake_evt.set()
        return task

    def _poll_for(self, fut: Future) -> None:
        """Called by ``fut.wait()`` before it blocks: meet the reply here if it comes soon."""
        if self.running and threading.get_ident() != self.thread.ident:
            self.poll_hot(fut.done, False)

    def _loop(self) -> None:
        """The progress thread: drives progress whenever no other thread does."""
        token = self.token
        wake = self.wake_evt
        idle_since = _perf()
        yield_until = idle_since + _backoff._YIELD_S
        try:
            while not self.stop_flag:
                if self.pollers:  # another thread polls: stand aside until it stops
                    self.standing_by = True
                    if self.pollers:
                        wake.wait(_backoff._SLEEP_MAX_S)
                    self.standing_by = False
                    wake.clear()
                    idle_since = max(idle_since, self.active_at)
                    yield_until = max(yield_until, idle_since + _backoff._YIELD_S)
                    continue
                with token:
                    worked, took = self._progress_once()
                now = _perf()
                if worked:
                    idle_since = now
                    yield_until = now + _backoff._YIELD_S
                    continue
                posted = max(self.last_post, self.active_at)
                if posted > idle_since:  # a request just went out: its reply comes soon
                    idle_since = posted
                    yield_until = max(yield_until, posted + _backoff._YIELD_S)
                if took > _backoff._BUSY_TEST_S:
                    yield_until = max(yield_until, now + _backoff._BUSY_WINDOW_S)
                if now < yield_until or ((self.sends or self.incoming)
                                         and now - idle_since < _TRANSFER_YIELD_S):
                    _yield()
                    continue
                nap = min(_backoff._SLEEP_MAX_S, (now - idle_since) * _backoff._SLEEP_FRACTION)
                self.sleeping = True
                if not (self.ctlq or self.new_sends or self.new_deadlines
                        or self.last_post > idle_since or self.pollers):
                    wake.wait(nap)
                self.sleeping = False
                wake.clear()
        except BaseException:  # noqa: BLE001 - report, then fail every waiter
            logger.exception("the RPC progress thread of %s failed", self.where)
            self.running = False
            self._fail_all(lambda p: RuntimeError(
                f"{p.what}: the RPC progress thread of {self.where} failed (see the log); "
                "this agent cannot complete calls any more"))

    def _receive(self, m: Any, status: Any) -> None:
        src = status.Get_source()
        self.seen[src] = 1
        buf = bytearray(status.Get_count())  # (the count of MPI.BYTE: the default type)
        m.Recv(buf)
        kind, flags, nbufs, _, reqid = _unpack_head(buf)
        if not nbufs:  # (the common case: _wire.unpack inlined)
            if kind == _REPLY:  # (and the commonest reply: _deliver's branch inlined)
                self.recv_from[src] += 1
                p = self.pending.pop(reqid, None)
                if p is None:
                    return  # its caller gave up (deadline passed): nobody wants it
                try:
                    value = _loads(memoryview(buf)[_HEAD_SIZE:])
                except BaseException as e:  # noqa: BLE001 - e.g. a class unknown here
                    self._complete(p.fut, None, self._unreadable(p, src, e))
                    return
                fut = p.fut
                if fut.__class__ is _SyncReply:
                    fut._try_complete(value, None)
                else:
                    self._complete(fut, value, None)
                return
            if kind == _CALL and self.grab and self.grabbed is None:
                # a polling pool thread runs it itself (_deliver's branch inlined)
                self.recv_from[src] += 1
                self.grabbed = (self._serve_call, (src, reqid, memoryview(buf)[_HEAD_SIZE:], []))
                self.stats["grabbed"] += 1
                return
            self._deliver(src, kind, flags, reqid, memoryview(buf)[_HEAD_SIZE:], [])
            return
        kind, flags, reqid, buftag, data, sizes = _wire.unpack(buf)
        MPI = self.MPI
        # recycled buffers: a fresh 64 MiB array is page-faulted in by the receive itself,
        # which took as long as the transfer (the buffer is reused once nothing refers to it)
        arrays = [_workspace.empty(np, (s,), np.uint8) for s in sizes]
        reqs = [self.comm.Irecv([a, MPI.BYTE], src, buftag) for a in arrays]
        if MPI.Request.Testall(reqs):
            self._deliver(src, kind, flags, reqid, data, arrays)
        else:
            self.incoming.append(_Incoming(src, kind, flags, reqid, data, arrays, reqs))

    def _deliver(self, src: int, kind: int, flags: int, reqid: int, data: Any,
                 arrays: list) -> None:
        if kind <= _wire.COUNTED:
            self.recv_from[src] += 1  # (only the thread holding ``token`` writes it)
        if kind == _wire.REPLY or kind == _wire.ERROR:
            p = self.pending.pop(reqid, None)
            if p is None:
                return  # its caller gave up (deadline passed): nobody wants it
            try:
                obj = _wire.loads(data, arrays)
                if kind == _wire.ERROR:
                    value, exc = None, _wire.decode_error(obj)
                else:
                    value, exc = obj, None
            except BaseException as e:  # noqa: BLE001 - e.g. a class unknown here
                value, exc = None, self._unreadable(p, src, e)
            self._complete(p.fut, value, exc)
        elif kind == _wire.CALL:
            if self.grab and self.grabbed is None:  # the polling pool thread runs it itself
                self.grabbed = (self._serve_call, (src, reqid, data, arrays))
                self.stats["grabbed"] += 1
            else:
                self.stats["spawned"] += 1
                self._spawn_or_refuse(src, reqid, self._serve_call, src, reqid, data, arrays)
        elif kind == _wire.REMOTE:
            rref_id = (src, reqid)
            no_fork = bool(flags & _wire.FLAG_NO_FORK)
            self.owner_count(rref_id, rref_id, 0 if no_fork else +1, create=True)
            entry = self.owner_get(rref_id)
            if not no_fork:
                self.post(src, _wire.REPLY, 0, reqid, *_wire.dumps(None, src))
            try:
                self.spawn(self._serve_remote, entry, src, data, arrays)
            except RuntimeError as e:
                entry.future._try_complete(None, e)
        elif kind == _wire.FETCH:
            self._spawn_or_refuse(src, reqid, self._serve_fetch, src, reqid, data)
        elif kind == _wire.ADD or kind == _wire.DEL:
            rref_id, fork_id = _wire.loads(data, arrays)
            self.owner_count(rref_id, fork_id, +1 if kind == _wire.ADD else -1)
        elif kind == _wire.LEAVE:
            self._peer_left(src)
        elif kind == _wire.PROBE:
            self.probe = (src, reqid)
        elif kind == _wire.COUNT:
            self.counts.setdefault(reqid, {})[src] = _wire.loads(data, arrays)
        elif kind == _wire.DONE:
            self.term_done = True
        elif kind == _wire.PING:
            self.post(src, _wire.PONG, 0, 0, b"", [])
        elif kind == _wire.PONG:
            pass  # (_receive noted that src is alive)
        else:
            logger.error("%s: message of unknown kind %d from rank %d dropped", self.where,
                         kind, src)

    def _unreadable(self, p: _Pending, src: int, e: BaseException) -> TypeError:
        return TypeError(f"{p.what}: the reply from {self.infos[src]!r} cannot be unpickled "
                         f"here: {type(e).__name__}: {e}")

    def _spawn_or_refuse(self, src: int, reqid: int, fn: Callable, *args: Any) -> None:
        try:
            self.spawn(fn, *args)
        except RuntimeError:
            self.reply_error(src, reqid, RuntimeError(
                f"{self.where} is exiting (interpreter shutdown) and takes no new requests"))

    def _complete(self, fut: Future, value: Any, exc: Optional[BaseException]) -> None:
        """Complete a future from the progress thread; its callbacks run on the pool."""
        if fut._has_callbacks():
            try:
                self.spawn(fut._try_complete, value, exc)
                return
            except RuntimeError:
                pass
        fut._try_complete(value, exc, self._run_callbacks_elsewhere)

    def _run_callbacks_elsewhere(self, run: Callable[[], None]) -> None:
        try:
            self.spawn(run)
        except RuntimeError:
            run()

    def _expire(self, heap: list, now: float) -> None:
        while heap and heap[0][0] <= now:
            _, reqid = heapq.heappop(heap)
            p = self.pending.pop(reqid, None)
            if p is None:
                continue
            elapsed = now - p.t0
            err = DistributedTimeoutError(
                f"{p.what}: no reply from {self.infos[p.dest]!r} within the RPC timeout of "
                f"{p.deadline - p.t0:g} s (waited {elapsed:.3g} s). The remote function may "
                "still be running or the worker may be stuck; pass a larger timeout= to the "
                "call (0: none) or set rpc_timeout in TensorPipeRpcBackendOptions",
                op=p.what, elapsed=elapsed, missing=[p.dest])
            self._complete(p.fut, None, err)

    def _peer_died(self, rank: int, why: str) -> None:
        """``rank`` died without notice: fail the calls waiting on it, and refuse new ones."""
        if rank == self.rank or rank in self.gone:
            return
        self.gone_why[rank] = why
        self.gone.add(rank)
        logger.warning("%s: %r died without notice (%s); calls to it fail from now on",
                       self.where, self.infos[rank], why)
        # its transfers will never complete: stop testing them, and never free them
        dead_sends = [x for x in self.sends if x[3] == rank]
        dead_incoming = [x for x in self.incoming if x.src == rank]
        if dead_sends or dead_incoming:
            self.abandoned += dead_sends + dead_incoming
            self.sends[:] = [x for x in self.sends if x[3] != rank]
            self.incoming[:] = [x for x in self.incoming if x.src != rank]
        self._fail_all(lambda p: self.gone_error(p.dest, p.what, waiting=True),
                       lambda p: p.dest == rank)

    def _peer_left(self, src: int) -> None:
        if src == self.rank or src in self.gone:
            return
        self.gone.add(src)
        logger.info("%s: %r left", self.where, self.infos[src])
        self._fail_all(lambda p: self.gone_error(p.dest, p.what, waiting=True),
                       lambda p: p.dest == src)

    def _fail_all(self, make: Callable[[_Pending], BaseException],
                  which: Callable[[_Pending], bool] = lambda p: True) -> None:
        for reqid, p in list(self.pending.items()):
            if which(p) and self.pending.pop(reqid, None) is not None:
                self._complete(p.fut, None, make(p))

