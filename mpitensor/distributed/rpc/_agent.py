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

The agent's code is in three modules, one part each: this one (addressing, calls out, the
shutdown protocol), :mod:`._serving` (requests served, RRefs owned) and :mod:`._progress` (the
progress engine: messages in, transfers, deadlines, dead peers).
"""

from __future__ import annotations

import collections
import itertools
import math
import pickle
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from mpitensor.futures import Future

from ...errors import DistributedTimeoutError, PeerFailedError
from ..health import watchdog as _watchdog
from . import _liveness, _wire
from ._pool import WorkerPool
from ._progress import Progress, _Incoming, _Pending, _SyncReply
from ._serving import OwnerEntry, Serving
from .errors import RpcNotInitializedError, UnknownWorkerError

_perf = time.perf_counter
_LEAVE_WAIT_S = 0.5  # how long a leaving agent waits for its notices to go out
_NUMBERS = (int, float)
_pack_head = _wire.HEADER.pack
_TAG_HEADER = _wire.TAG_HEADER
_dumps_plain = pickle.dumps
_plain_args = _wire.plain_args


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


class Agent(Serving, Progress):
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
        try:
            _check_unique(names)
        except ValueError:
            self.comm.Free()
            raise
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


def _check_unique(names: List[str]) -> None:
    """Every worker's name, by rank: two ranks with one name raise (on every rank alike)."""
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        ranks = {n: [r for r, m in enumerate(names) if m == n] for n in dup}
        raise ValueError(f"init_rpc: worker names must be unique, but {ranks} (name: "
                         f"ranks) share names; give each rank its own name, e.g. "
                         f"f'worker{{rank}}'")
