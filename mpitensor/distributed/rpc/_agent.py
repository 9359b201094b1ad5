"""The RPC agent: one per process, on a private duplicate of ``MPI.COMM_WORLD``.

Threads and who touches MPI:

* the **progress thread** finds incoming header messages (``Improbe``/``Mrecv``), posts the
  receives of their out-of-band buffers, tests outstanding sends and receives, expires
  deadlines, and sends what the control queue holds (RRef fork/delete notices, which are queued
  by ``__del__`` methods that may run in any thread at any moment). It runs no user code: a
  request goes to the worker pool;
* the **worker pool** (``num_worker_threads``, ``_pool.WorkerPool``: a one-lock hand-off per
  task) unpickles requests, runs the functions, and sends the replies itself;
* a **user thread** pickles its call and sends it itself, then polls for the reply itself
  (``poll_hot``) and, if it is slow to come, sleeps on the future's lock.

On the hot path of back-to-back calls no thread hands anything to another: the caller meets
its reply, and the pool thread that served a request polls for the next one and runs it
(``poll_hot``) while the progress thread stands aside.

Sending from any thread needs ``MPI_THREAD_MULTIPLE`` (mpi4py's default); measured against
queueing every send to the progress thread, sending directly saved a thread hand-off per
message (see docs/rpc.md). Each message's buffers have a tag of their own, so concurrent
senders never mix them up.

The progress thread never sleeps while work is fresh: after each message it polls with
``sched_yield`` for 2 ms (as ``_watchdog.Backoff`` does), keeps yielding while transfers are
in flight, and then sleeps for a growing fraction of the idle time, up to 1 ms: an idle agent
costs about 2-3 % of a core. A thread that sends a request wakes it, so the reply is met hot.

Peers that die without a word (SIGKILL) are noticed by the thread driving progress, through
the process table or a heartbeat (``_liveness``): the calls waiting on them fail with
``PeerFailedError`` instead of at their deadline.

Graceful shutdown is a termination protocol over point-to-point messages (so it needs only
the workers still alive): the lowest live rank coordinates rounds; in each, every worker that
is inside ``shutdown`` and idle (no call awaiting its reply, no request being served, nothing
queued) answers with its counts of messages sent and received. Two consecutive rounds with the
same totals, and sent == received, prove that nothing is in flight and nothing can start
again (the four-counter method); the coordinator then tells everyone to stop.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import os
import pickle
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from mpitensor.futures import Future

from ..._base import workspace as _workspace
from ...errors import DistributedTimeoutError, PeerFailedError
from ..health import watchdog as _watchdog
from . import _liveness, _wire
from ._pool import WorkerPool
from .errors import RpcNotInitializedError, UnknownWorkerError

logger = logging.getLogger("mpitensor.distributed.rpc")
_perf = time.perf_counter
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
_IMPROBE_BATCH = 64  # headers taken per loop turn before the other duties get a look
_TRANSFER_YIELD_S = 0.02  # with transfers in flight, yield (never sleep) this long
_LEAVE_WAIT_S = 0.5  # how long a leaving agent waits for its notices to go out
_TOKEN_WAIT_S = 2e-5  # a pool thread waits this long for the progress thread's turn to end
_CHORES_S = 1e-4  # a hot poller tests transfers, expires deadlines etc. this often
# a hot poller polls without yielding this long after news: a reply or the next request
# comes within about 10 µs when the cores are free. Longer spins (50-200 µs) measured no
# better there, and worse under load (mean round trip 1.5-2x that of no spin, with other jobs
# on the two cores), where spinning holds the core a descheduled peer needs
_SPIN_S = 1e-5
_NUMBERS = (int, float)
_pack_head = _wire.HEADER.pack
_unpack_head = _wire.HEADER.unpack_from
_HEAD_SIZE = _wire.HEADER.size
_TAG_HEADER = _wire.TAG_HEADER
_REPLY = _wire.REPLY
_CALL = _wire.CALL
_loads = pickle.loads
_dumps_plain = pickle.dumps
_plain_args = _wire.plain_args
_PLAIN = _wire.PLAIN


class WorkerInfo:
    """A worker's name and id (its rank), as ``get_worker_info`` returns them.

    Example:
        >>> rpc.get_worker_info("worker1")
        WorkerInfo(id=1, name=worker1)
    """

    __slots__ = ("name", "id")

    def __init__(self, name: str, id: int) -> None:  # noqa: A002 - torch's argument name
        self.name = name
        self.id = id

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, WorkerInfo) and self.name == other.name
                and self.id == other.id)

    def __hash__(self) -> int:
        return hash((self.name, self.id))

    def __repr__(self) -> str:
        return f"WorkerInfo(id={self.id}, name={self.name})"

    def __reduce__(self) -> tuple:
        return (WorkerInfo, (self.name, self.id))


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


class Agent:
    """One process's RPC endpoint (made by ``init_rpc``, ended by ``shutdown``)."""

    def __init__(self, name: str, num_worker_threads: int, rpc_timeout: float,
                 world_comm: Any, init_timeout: float) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = _watchdog.timed_dup(world_comm, init_timeout, "init_rpc")
        try:
            self.rank = self.comm.Get_rank()
            self.size = self.comm.Get_size()
            idents = self.comm.allgather((name, _liveness.identity()))
        except BaseException:
            self.comm.Free()
            raise
        names = [n for n, _ in idents]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            self.comm.Free()
            ranks = {n: [r for r, m in enumerate(names) if m == n] for n in dup}
            raise ValueError(f"init_rpc: worker names must be unique, but {ranks} (name: "
                             f"ranks) share names; give each rank its own name, e.g. "
                             f"f'worker{{rank}}'")
        self.name = name
        self.infos = [WorkerInfo(n, r) for r, n in enumerate(names)]
        self.by_name = {n: r for r, n in enumerate(names)}
        self.where = f"{self.infos[self.rank]!r}"
        self.rpc_timeout = rpc_timeout
        self.num_worker_threads = num_worker_threads
        self.tag_ub = int(self.comm.Get_attr(MPI.TAG_UB))
        self.pool = WorkerPool(num_worker_threads, "mpitensor-rpc")
        self.reqids = itertools.count(1)  # request ids and RRef/fork ids, one sequence
        self.func_refs: Dict[Any, bytes] = {}  # functions sent by reference (see _wire)
        self.funcs: Dict[bytes, Any] = {}  # and those received
        self.pending: Dict[int, _Pending] = {}
        self.new_deadlines: collections.deque = collections.deque()
        self.new_sends: collections.deque = collections.deque()
        self.ctlq: collections.deque = collections.deque()
        # the progress engine's state, touched only by the thread holding ``token``
        self.token = threading.Lock()
        self.status = MPI.Status()
        self.sends: list = []  # (requests, message, buffers, dest) of sends not yet complete
        self.incoming: List[_Incoming] = []  # headers whose buffers are still arriving
        self.heap: list = []  # (deadline, request id)
        self.grab = False
        self.grabbed: Optional[Tuple[Callable, tuple]] = None
        self.pollers = 0  # threads polling instead of the progress thread (0 or 1)
        self.chores_at = 0.0  # when a hot poller next takes a full turn (see poll_hot)
        self.standing_by = False
        self.active_at = 0.0
        self.gone: set = set()
        self.gone_why: Dict[int, str] = {}  # peers that died without notice: how we know
        self.abandoned: list = []  # transfers with dead peers: never complete, never freed
        self.watch = _liveness.PeerWatch(self.rank, [i for _, i in idents])
        self.seen = self.watch.seen
        self.lock = threading.Lock()  # busy, and the list of tallies
        # messages sent, per destination: one list per sending thread, which only that thread
        # writes (a lock per message cost 0.13 µs, a thread-local list 0.04); the GIL orders a
        # count before the send that follows it, for any reader (see my_counts)
        self.tallies: List[List[int]] = []
        self.tally = threading.local()
        self.recv_from = [0] * self.size  # (written only by the thread holding ``token``)
        self.busy = 0  # requests being served, callbacks being run
        # approximate (updated without a lock): what the tests and benchmarks look at
        self.stats = {"messages": 0, "inband_bytes": 0, "oob_bytes": 0, "oob_buffers": 0,
                      "grabbed": 0, "spawned": 0}
        self.owner_lock = threading.RLock()
        self.owned: Dict[Tuple[int, int], OwnerEntry] = {}
        self.owned_weak: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
        # graceful shutdown
        self.in_shutdown = False
        self.probe: Optional[Tuple[int, int]] = None  # (coordinator, round) to answer
        self.counts: Dict[int, Dict[int, Tuple[int, int]]] = {}
        self.term_done = False
        # progress thread
        self.running = True
        self.stop_flag = False
        self.sleeping = False
        self.wake_evt = threading.Event()
        self.last_post = _perf()
        self.thread = threading.Thread(target=self._loop, name="mpitensor-rpc-progress",
                                       daemon=True)
        self.poll_for = self._poll_for  # (bound once: every call's future gets it)

    def start(self) -> None:
        """Start serving (once this agent is the process's: requests may come at once)."""
        self.thread.start()

    # ------------------------------------------------------------------------ addressing
    def resolve(self, to: Any, what: str) -> int:
        """The rank ``to`` (a name, a rank or a WorkerInfo) names; raise before any traffic."""
        if to.__class__ is str:  # the common cases first
            rank = self.by_name.get(to)
            if rank is not None:
                return rank
        elif to.__class__ is int and 0 <= to < self.size:
            return to
        if isinstance(to, WorkerInfo):
            if not (0 <= to.id < self.size) or self.infos[to.id].name != to.name:
                raise UnknownWorkerError(
                    f"{what}: {to!r} is not a worker of this RPC group (workers: "
                    f"{self._names()}); use rpc.get_worker_info(name) to get one")
            return to.id
        if isinstance(to, str):
            rank = self.by_name.get(to)
            if rank is None:
                raise UnknownWorkerError(
                    f"{what}: unknown destination worker {to!r}; the workers are "
                    f"{self._names()} (the names given to init_rpc on each rank)")
            return rank
        if isinstance(to, (int, np.integer)) and not isinstance(to, bool):
            if not 0 <= int(to) < self.size:
                raise UnknownWorkerError(
                    f"{what}: worker id {int(to)} is out of range: ids are 0..{self.size - 1} "
                    f"(workers: {self._names()})")
            return int(to)
        raise TypeError(f"{what}: 'to' must be a worker name, a worker id or a WorkerInfo, got "
                        f"{type(to).__name__} {to!r}")

    def _names(self) -> str:
        names = [i.name for i in self.infos]
        return str(names if len(names) <= 8 else names[:8] + ["..."])

    def info(self, rank: int) -> WorkerInfo:
        return self.infos[rank]

    def deadline_of(self, timeout: Any, what: str) -> Tuple[float, float]:
        """(seconds, deadline) for a call's ``timeout`` (-1: the agent's; 0: none)."""
        if hasattr(timeout, "total_seconds"):
            timeout = timeout.total_seconds()
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"{what}: timeout must be a number of seconds, got {timeout!r}")
        if timeout < 0:
            if timeout != -1:
                raise ValueError(f"{what}: timeout must be >= 0 seconds (0: no deadline) or "
                                 f"-1 (the default set by init_rpc), got {timeout!r}")
            timeout = self.rpc_timeout
        seconds = math.inf if timeout == 0 else float(timeout)
        return seconds, _perf() + seconds

    # ------------------------------------------------------------------------ sending
    def check_running(self, what: str) -> None:
        if not self.running:
            raise RpcNotInitializedError(f"{what}: the RPC agent of {self.where} has been shut "
                                         "down; call init_rpc again to make calls")

    def call(self, dest: int, kind: int, obj: Any, timeout: Any, what: str,
             flags: int = 0, reqid: Optional[int] = None) -> Future:
        """Send a request; the returned future completes with its reply, or an error.

        Raises before sending: ``TypeError`` for an argument that cannot be pickled,
        ``PeerFailedError`` if ``dest`` has left, ``RpcNotInitializedError`` after shutdown.
        """
        return self._call(dest, kind, obj, timeout, what, flags, reqid, False)

    def call_sync(self, dest: int, obj: Any, timeout: Any, what: str) -> Any:
        """``rpc_sync``: send a CALL request and wait for its reply; return it (or raise)."""
        return self._call(dest, _wire.CALL, obj, timeout, what, 0, None, True)

    def _call(self, dest: int, kind: int, obj: Any, timeout: Any, what: str, flags: int,
              reqid: Optional[int], sync: bool) -> Any:
        if not self.running:
            self.check_running(what)
        t0 = _perf()
        if timeout == -1 and type(timeout) in _NUMBERS:  # the default: the common case
            seconds = self.rpc_timeout or math.inf
            deadline = t0 + seconds
        else:
            seconds, deadline = self.deadline_of(timeout, what)
        if kind <= _wire.FETCH:
            # inside a distributed autograd context, the request carries it: the callee runs
            # the function (CALL, REMOTE) or pickles the value (FETCH) inside it, so that the
            # tensors that travel are recorded on both sides
            ctx = _wire.hooks.attach(dest)
            if kind == _wire.FETCH:
                obj = (obj, ctx)
            else:
                ref = _wire.func_ref(obj[0], self.func_refs)
                if ref is not None:  # the function's pickle, made once (see _wire)
                    if ctx is None and _plain_args(obj[1], obj[2]):
                        data = _dumps_plain((ref, obj[1], obj[2]), protocol=5)  # (_wire.PLAIN)
                        if sync:  # (the common case: rpc_sync with plain arguments)
                            return self._sync(dest, next(self.reqids), data, [], deadline,
                                              seconds, what, t0)
                        return self._send(dest, kind, flags, reqid, data, [], deadline,
                                          seconds, what, t0, sync)
                    obj = (ref, *obj[1:])
                if ctx is not None:
                    obj = (*obj, ctx)
        data, bufs = self.pickle_for(dest, obj, what, "its arguments")
        return self._send(dest, kind, flags, reqid, data, bufs, deadline, seconds, what, t0,
                          sync)

    def _send(self, dest: int, kind: int, flags: int, reqid: Optional[int], data: bytes,
              bufs: list, deadline: float, seconds: float, what: Any, t0: float,
              sync: bool) -> Any:
        """Register and send a pickled request (``call``/``call_sync``)."""
        if reqid is None:
            reqid = next(self.reqids)
        if sync:
            return self._sync(dest, reqid, data, bufs, deadline, seconds, what, t0)
        fut: Future = Future()
        fut._hot = self.poll_for
        self._register_and_post(fut, dest, kind, flags, reqid, data, bufs, deadline, seconds,
                                what, t0)
        return fut

    def _register_and_post(self, fut: Any, dest: int, kind: int, flags: int, reqid: int,
                           data: bytes, bufs: list, deadline: float, seconds: float,
                           what: Any, t0: float) -> None:
        """Enter the call in the request table and the deadline queue, then send it: the
        order for a caller that does not hold the progress token (another thread may meet
        the reply as soon as the request is out)."""
        self.pending[reqid] = _Pending(fut, dest, deadline, what, t0)
        if dest in self.gone or not self.running:
            self.pending.pop(reqid, None)
            self.check_running(what)
            raise self.gone_error(dest, what, waiting=False)
        if seconds != math.inf:
            self.new_deadlines.append((deadline, reqid))
        self.post(dest, kind, flags, reqid, data, bufs)

    def _sync(self, dest: int, reqid: int, data: bytes, bufs: list, deadline: float,
              seconds: float, what: Any, t0: float) -> Any:
        """Send a pickled CALL and wait for its reply (``call_sync``).

        The caller takes the progress token before sending, where it can at once: then no
        other thread can meet the reply, so the call is registered after its request went
        out, while the request travels and is served (off the round trip's critical path),
        and the caller polls for the reply as ``poll_hot`` does.
        """
        reply = _SyncReply()
        token = self.token
        if threading.get_ident() == self.thread.ident or not token.acquire(False):
            # another thread drives progress, and may meet the reply: register first
            self._register_and_post(reply, dest, _wire.CALL, 0, reqid, data, bufs, deadline,
                                    seconds, what, t0)
            self._poll_for(reply)
            return reply.wait()
        try:  # (holding the token: no peer can be found gone meanwhile)
            if dest in self.gone or not self.running:
                self.check_running(what)
                raise self.gone_error(dest, what, waiting=False)
            self.post(dest, _wire.CALL, 0, reqid, data, bufs)
            self.pending[reqid] = _Pending(reply, dest, deadline, what, t0)
            if seconds != math.inf:
                self.new_deadlines.append((deadline, reqid))
        except BaseException:
            token.release()
            raise
        self._poll_held(reply.done, False)  # (releases the token)
        return reply.wait()

    def pickle_for(self, dest: int, obj: Any, what: Any, whose: str) -> Tuple[bytes, list]:
        try:
            return _wire.dumps(obj, dest)
        except Exception as e:  # noqa: BLE001 - any pickling failure reads the same
            raise self.unpicklable(dest, what, whose, e) from e

    def unpicklable(self, dest: int, what: Any, whose: str, e: Exception) -> TypeError:
        """The error for a message to ``dest`` that cannot be pickled."""
        return TypeError(
            f"{what}: {whose} cannot be pickled for {self.infos[dest]!r}: "
            f"{type(e).__name__}: {e}. RPC sends functions by reference (define them at "
            "module level, importable on every worker) and arguments by pickle; lambdas, "
            "local functions, locks, sockets and open files cannot be sent")

    def post(self, dest: int, kind: int, flags: int, reqid: int, data: bytes,
             bufs: List[memoryview]) -> None:
        """Send one message (header + buffers) from this thread."""
        if not self.running and kind != _wire.LEAVE:
            return  # shut down non-gracefully: nothing goes out any more
        if kind <= _wire.COUNTED:  # counted before it can arrive: the termination check
            try:  # must never see it received and not sent
                self.tally.sent[dest] += 1
            except AttributeError:  # this thread's first message
                self._new_tally()[dest] += 1
        # the message goes out first: the bookkeeping after it overlaps its way to the peer
        # and the peer's work on it (on a round trip's critical path: about 0.2 µs each way)
        stats = self.stats
        if not bufs:
            msg = _pack_head(kind, flags, 0, 0, reqid) + data
            req = self.comm.Isend(msg, dest, _TAG_HEADER)
            if not req.Test():
                self.new_sends.append(([req], msg, bufs, dest))
        else:
            MPI = self.MPI
            comm = self.comm
            buftag = _wire.next_buffer_tag(self.tag_ub)
            msg = _wire.pack(kind, flags, reqid, buftag, data, bufs)
            reqs = [comm.Isend([msg, MPI.BYTE], dest, _wire.TAG_HEADER)]
            for b in bufs:
                reqs.append(comm.Isend([b, MPI.BYTE], dest, buftag))
                stats["oob_bytes"] += b.nbytes
                stats["oob_buffers"] += 1
            if not MPI.Request.Testall(reqs):
                self.new_sends.append((reqs, msg, bufs, dest))
        stats["messages"] += 1
        stats["inband_bytes"] += len(msg)
        self.last_post = _perf()
        if self.sleeping:
            self.wake_evt.set()

    def _new_tally(self) -> List[int]:
        sent = self.tally.sent = [0] * self.size
        with self.lock:
            self.tallies.append(sent)
        return sent

    def enqueue(self, kind: int, dest: int, obj: Any) -> None:
        """Queue a control message for the progress thread (safe from ``__del__``)."""
        if self.running:
            self.ctlq.append((kind, dest, obj))
            if self.sleeping:
                self.wake_evt.set()

    def gone_error(self, dest: int, what: str, waiting: bool) -> PeerFailedError:
        info = self.infos[dest]
        state = (f"stopped waiting for a reply from {info!r}" if waiting
                 else f"cannot send to {info!r}")
        why = self.gone_why.get(dest)
        if why is not None:
            err = PeerFailedError(
                f"{what}: {self.where} {state}: that worker died without notice ({why}) and "
                "serves no requests any more. Make the call to a live worker; to carry on "
                "without it, have the surviving workers call rpc.shutdown(), which no longer "
                "waits for it")
        else:
            err = PeerFailedError(
                f"{what}: {self.where} {state}: that worker has left (it "
                "called shutdown(graceful=False) or its process exited) and serves no requests "
                "any more. Make the call to a live worker, or have every worker call "
                "rpc.shutdown() so that none leaves while others still need it")
        err.rank = dest  # type: ignore[attr-defined]
        return err

    # ------------------------------------------------------------------------ serving
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

    def _serve_call(self, src: int, reqid: int, data: Any, arrays: list) -> None:
        token = ctx = None
        try:
            try:
                call = _loads(data, buffers=arrays)
                del data, arrays
                if len(call) == 3:
                    func, args, kwargs = call
                else:
                    func, args, kwargs, ctx = call
                    token = _wire.hooks.enter(ctx)
                del call
                if func.__class__ is bytes:
                    func = _wire.load_func(func, self.funcs)
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
            if len(call) == 3:
                func, args, kwargs = call
            else:  # made inside a distributed autograd context: run inside it
                func, args, kwargs, ctx = call
                token = _wire.hooks.enter(ctx)
            del call
            if func.__class__ is bytes:
                func = _wire.load_func(func, self.funcs)
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

    # ------------------------------------------------------------------------ progress thread
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
        :data:`_watchdog._YIELD_S` without news; meanwhile the progress thread stands aside.
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
            end = now + _watchdog._YIELD_S
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
                if worked or took > _watchdog._BUSY_TEST_S:
                    end = now + _watchdog._YIELD_S
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
        yield_until = idle_since + _watchdog._YIELD_S
        try:
            while not self.stop_flag:
                if self.pollers:  # another thread polls: stand aside until it stops
                    self.standing_by = True
                    if self.pollers:
                        wake.wait(_watchdog._SLEEP_MAX_S)
                    self.standing_by = False
                    wake.clear()
                    idle_since = max(idle_since, self.active_at)
                    yield_until = max(yield_until, idle_since + _watchdog._YIELD_S)
                    continue
                with token:
                    worked, took = self._progress_once()
                now = _perf()
                if worked:
                    idle_since = now
                    yield_until = now + _watchdog._YIELD_S
                    continue
                posted = max(self.last_post, self.active_at)
                if posted > idle_since:  # a request just went out: its reply comes soon
                    idle_since = posted
                    yield_until = max(yield_until, posted + _watchdog._YIELD_S)
                if took > _watchdog._BUSY_TEST_S:
                    yield_until = max(yield_until, now + _watchdog._BUSY_WINDOW_S)
                if now < yield_until or ((self.sends or self.incoming)
                                         and now - idle_since < _TRANSFER_YIELD_S):
                    _yield()
                    continue
                nap = min(_watchdog._SLEEP_MAX_S, (now - idle_since) * _watchdog._SLEEP_FRACTION)
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

    # ------------------------------------------------------------------------ shutdown
    def idle(self) -> bool:
        """Nothing of this worker's own is under way (see the termination protocol)."""
        return (not self.pending and self.busy == 0 and not self.ctlq
                and not self.incoming)

    def live(self) -> List[int]:
        return [r for r in range(self.size) if r not in self.gone]

    def my_counts(self, live: List[int]) -> Tuple[int, int]:
        with self.lock:
            tallies = list(self.tallies)
        return (sum(t[r] for t in tallies for r in live), sum(self.recv_from[r] for r in live))

    def shutdown_graceful(self, timeout: float) -> None:
        """Wait until every live worker is idle with no message in flight, then stop."""
        self.in_shutdown = True
        t0 = _perf()
        deadline = t0 + (timeout if timeout > 0 else math.inf)
        backoff = _watchdog.Backoff(t0)
        rnd = 0
        prev: Optional[Tuple[int, int]] = None
        asked: Optional[List[int]] = None
        while not self.term_done:
            if not self.running:
                raise RpcNotInitializedError("shutdown: the RPC agent stopped while waiting")
            live = self.live()
            coord = live[0]
            now = _perf()
            if now >= deadline:
                raise DistributedTimeoutError(
                    f"shutdown on {self.where}: the workers did not all finish their work "
                    f"within {timeout:g} s (coordinator {self.infos[coord]!r}); some worker is "
                    "still making calls, serving a slow request, or has not called shutdown",
                    op="shutdown", elapsed=now - t0)
            if coord == self.rank:
                others = [r for r in live if r != self.rank]
                if asked is None or asked != live:
                    if asked is not None:
                        prev = None  # a worker left: both waves must count the same workers
                    rnd += 1
                    asked = live
                    for r in others:
                        self.post(r, _wire.PROBE, 0, rnd, b"", [])
                got = self.counts.get(rnd, {})
                if self.idle() and all(r in got for r in others):
                    mine = self.my_counts(live)
                    sent = mine[0] + sum(got[r][0] for r in others)
                    recv = mine[1] + sum(got[r][1] for r in others)
                    self.counts.pop(rnd, None)
                    if sent == recv and prev == (sent, recv):
                        for r in others:
                            self.post(r, _wire.DONE, 0, rnd, b"", [])
                        break
                    prev = (sent, recv)
                    asked = None  # next round
                    backoff = _watchdog.Backoff(_perf())
                    continue
            else:
                probe = self.probe
                if probe is not None and probe[0] == coord and self.idle():
                    self.probe = None
                    data, _ = _wire.dumps(self.my_counts(live), coord)
                    self.post(coord, _wire.COUNT, 0, probe[1], data, [])
                    backoff = _watchdog.Backoff(_perf())
                    continue
            backoff.pause(_perf(), 0.0)
        self.stop(leave=False)

    def stop(self, leave: bool) -> None:
        """Stop serving: tell the peers (``leave``), end the progress thread, fail waiters."""
        if not self.running and self.stop_flag:
            return
        MPI = self.MPI
        if leave:
            reqs = []
            for r in self.live():
                if r != self.rank:
                    try:
                        msg = _wire.pack(_wire.LEAVE, 0, 0, 0, b"", [])
                        reqs.append((self.comm.Isend([msg, MPI.BYTE], r, _wire.TAG_HEADER), msg))
                    except Exception:  # noqa: BLE001 - a peer gone already: tell the others
                        pass
            end = _perf() + _LEAVE_WAIT_S
            while reqs and _perf() < end:
                reqs = [x for x in reqs if not x[0].Test()]
                if reqs:
                    time.sleep(1e-4)
            self.abandoned += reqs  # never freed while MPI may still touch them
        else:
            # the last messages (DONE, COUNT) must leave before the progress thread stops
            end = _perf() + _LEAVE_WAIT_S
            while (self.new_sends or self.sends) and _perf() < end:
                time.sleep(1e-4)
        self.running = False
        self.stop_flag = True
        self.wake_evt.set()
        if threading.current_thread() is not self.thread:
            self.thread.join()
        self._fail_all(lambda p: RpcNotInitializedError(
            f"{p.what}: the RPC agent of {self.where} was shut down before the reply came"))
        self.pool.shutdown(wait=not leave, cancel_futures=leave)
        if not leave and not self.gone:
            try:
                self.comm.Free()
            except Exception:  # noqa: BLE001 - MPI finalising: nothing to free
                pass


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
