"""Bounded waits: every blocking operation polls its MPI request instead of blocking in MPI.

:func:`wait` is the one place a rank waits for communication. It

* polls ``Request.Test`` with an adaptive back-off (:class:`Backoff`): 50 µs of pure polling
  (small operations finish within it, so their latency is not hurt; skipped where the node has
  more ranks than CPUs, see :func:`set_node_load`), then polling with ``sched_yield`` for 2 ms
  (without the yield 4 ranks on 2 cores ran 5x slower), then short sleeps that grow with the
  time waited, up to 1 ms, so that a rank waiting on a slow peer leaves its core to the ranks
  that work (after 100 ms of waiting it uses about 1 % of a core). MPI progresses only inside
  its calls, and a multi-round transfer starves if its ranks sleep between them (a 32 MiB
  all_to_all took 1 s instead of 5 ms with blind sleeps of up to 1 ms), so a ``Test`` call that
  took long enough to have moved data earns a short window of yielding;
* after ``notify_after`` seconds sends an *arrival notice* ``(kind, seq, op)`` to the other
  members on the group's private notice communicator, and reads theirs, so that a rank that
  times out can say which ranks never arrived and where the others are waiting instead;
* on the same millisecond tick reads the group's fault notices (:func:`fault_in_wait`, see
  ``faults``): a peer that failed before this call, left, or broke the group ends the wait
  with :class:`~mpitensor.errors.PeerFailedError`;
* past the stall threshold logs a stall report (logger ``mpitensor.distributed``, WARNING):
  the operation, how long it waited, the group's last collectives and the Python stack;
* past the group's timeout raises :class:`~mpitensor.errors.DistributedTimeoutError`.

Nothing here costs anything on the fast path: notices are only sent by ranks that have
already waited ``notify_after`` seconds, and history is a 16-slot ring of tuples formatted
only when a report is written.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Optional

from ..._base import config as _config
from ...errors import DistributedTimeoutError, PeerFailedError
from . import faults, posted
from .backoff import Backoff, _yield, poll
from .state import HISTORY, GroupHealth

if TYPE_CHECKING:
    from mpi4py import MPI

logger = logging.getLogger("mpitensor.distributed")

NOTICE_TAG = 1  # on the notice communicator: arrival notices
VERDICT_TAG = 2  # on the notice communicator: debug-mode p2p verdicts (receiver -> sender)
_SPIN_S = 5e-5  # pure polling inline in wait() (0 on an oversubscribed node: set_node_load)
_CHECK_EVERY_S = 1e-3  # while polling slowly: notices, stall report, timeout
_perf = time.perf_counter


def set_node_load(local_ranks: int, cpus: int) -> None:
    """Tune the polling for ``local_ranks`` ranks sharing ``cpus`` CPUs (the union of their
    affinities: ranks bound one to a core each are not oversubscribed).

    With more ranks than CPUs, every microsecond a waiting rank spins is taken from a peer that
    needs the core to make progress (measured, 4 ranks on 2 cores: small all_reduce 22 µs with
    MPICH's blocking call, 33 µs yielding at once, 78 µs after a 50 µs spin, 546 µs after a
    500 µs spin), so the spin phase is skipped there.
    """
    global _SPIN_S
    _SPIN_S = 0.0 if local_ranks > cpus else 5e-5


def may_spin() -> bool:
    """Whether a waiting rank spins before it yields (not where ranks outnumber cores)."""
    return _SPIN_S > 0


def stall_warn_seconds(timeout: float) -> float:
    """The stall-report threshold for a group with this timeout."""
    if _config.STALL_WARN_S is not None:
        return _config.STALL_WARN_S
    return min(60.0, timeout / 2)


def notify_seconds(timeout: float) -> float:
    """How long a rank waits before telling the others where it is waiting."""
    return min(1.0, timeout / 4)


def wait(h: GroupHealth, req: Any, op: str, seq: int, kind: str = "coll",
         status: Optional[MPI.Status] = None, timeout: Optional[float] = None,
         peer: Optional[int] = None, tag: Optional[int] = None, cancel: bool = False,
         nbytes: int = 0) -> None:
    """Wait for ``req`` to complete, bounded by ``timeout`` (default: the group's).

    Args:
        h: the health of the MPI group the request belongs to.
        req: an MPI request (or anything with ``Test(status)``).
        op: the operation's name, for reports.
        seq: its sequence number (collective or p2p counter).
        kind: ``"coll"`` or ``"p2p"``.
        status: filled in on completion.
        timeout: seconds; ``None`` uses ``h.timeout``.
        peer: for p2p, the peer's group rank (``None`` for any source).
        tag: for p2p, the tag.
        cancel: on timeout, cancel the request (a blocking receive: the link stays usable).
        nbytes: the bytes the call moves (its largest buffer; ``bytes_of``): a longer call
            polls longer before its wait sleeps (:class:`~.backoff.Backoff`).

    Raises:
        DistributedTimeoutError: the request did not complete in time.
    """
    if req.Test(status):
        return
    t0 = _perf()
    spin = _SPIN_S
    while _perf() - t0 < spin:
        if req.Test(status):
            return
    _slow_wait(h, req, op, seq, kind, status, timeout, peer, tag, t0, cancel, nbytes)


def bytes_of(keep: Any, depth: int = 2) -> int:
    """The bytes of a call's buffers (an array or memoryview, or tuples or lists of them, two
    deep: ``([buf, MPI.BYTE], header)``; its largest), for :func:`wait`'s ``nbytes``; 0 for
    anything else."""
    n = getattr(keep, "nbytes", None)
    if n is not None:
        return int(n)
    if depth and (type(keep) is tuple or type(keep) is list):
        return max((bytes_of(k, depth - 1) for k in keep), default=0)
    return 0


#: tests of a request between two yields of the bounded wait's first millisecond
_TESTS_PER_YIELD = 4


def _tests(test: Any, status: Any) -> bool:
    """Whether ``test(status)`` succeeds within :data:`_TESTS_PER_YIELD` calls."""
    for _ in range(_TESTS_PER_YIELD):
        if test(status):
            return True
    return False


def _polled(h: GroupHealth, req: Any, test: Any, status: Any, timeout: Optional[float],
            op: str, seq: int, kind: str, until: float) -> bool:
    """The bounded wait's first phase: whether ``req`` completed by ``until``, polling and
    yielding and nothing else (what Backoff does then, without its bookkeeping).

    Where ranks outnumber cores, a poll's Python is time the ranks with work wait for, and the
    full loop of :func:`_slow_wait` made a 64 KiB all_reduce on 4 ranks of 2 cores 10 % slower
    than this one. A yield comes after _TESTS_PER_YIELD tests: after each one, an MPI
    Iallgather of 64 KiB-1 MiB on 4 ranks of 2 cores took 1.06-1.22x the blocking call, after
    four 0.91-1.00x (MPI's own Wait: 1.01-1.11x). The bookkeeping's setup comes after it, only
    for a wait that lasts: made first (about 1 µs), it cost 15-35 µs a call there, 6-10 % of an
    all_reduce of 256-512 KiB (a persistent request, 4 ranks on 2 cores, 2026-11-30)."""
    try:
        while not (done := _tests(test, status)) and _perf() < until:
            _yield()
    except BaseException as exc:
        _ended_posted(h, req, exc, timeout, op, seq, kind)
        raise
    return done


def _slow_wait(h: GroupHealth, req: Any, op: str, seq: int, kind: str, status: Any,
               timeout: Optional[float], peer: Optional[int], tag: Optional[int],
               t0: float, cancel: bool = False, nbytes: int = 0) -> None:
    limit = h.timeout if timeout is None else float(timeout)
    test = req.Test
    next_check = t0 + min(_CHECK_EVERY_S, limit)
    passive = getattr(req, "passive", False)
    done = False
    if not passive and _polled(h, req, test, status, timeout, op, seq, kind, next_check):
        return
    warn_at = stall_warn_seconds(h.timeout)
    notify_at = notify_seconds(limit) if math.isfinite(limit) else 1.0
    diag = h.diag
    announced = warned = False
    me = (kind, seq, op)
    # a request whose Test moves no data says so (moves_data = False): a slow Test there
    # earns no window of yielding (Backoff)
    backoff = Backoff(t0, passive, nbytes, getattr(req, "moves_data", True))
    # a request may look at its peers before each round of checks (shm_pipe: whether their
    # processes live), which MPI's own calls must not be the first to find out
    before_check = getattr(req, "before_check", None)
    try:
        # The bookkeeping runs about once a millisecond, whatever the pause between tests.
        while not done:
            before = _perf()
            if test(status):
                break
            now = _perf()
            if now >= next_check:
                next_check = now + _CHECK_EVERY_S
                elapsed = now - t0
                if before_check is not None:
                    before_check()
                if diag is not None:
                    fault = fault_in_wait(h, kind, seq, op, peer, t0)
                    if fault is not None:
                        if cancel and not _cancelled(req, status):
                            return  # matched while being cancelled: the receive completed
                        if cancel:
                            req = None  # cancelled: nothing is left posted
                        fault.request = req
                        raise fault
                    if drain_notices(h, me) and not announced:
                        announced = _announce(h, me, waiting=True)
                    if elapsed >= notify_at and not announced:
                        announced = _announce(h, me, waiting=True)
                if elapsed >= warn_at and not warned:
                    warned = True
                    logger.warning("%s", stall_report(h, op, seq, kind, elapsed, limit, peer,
                                                      tag))
                if elapsed >= limit:
                    if cancel and _cancelled(req, status):
                        req = None
                    elif cancel:
                        return  # matched while being cancelled: the receive completed
                    if timeout is None:  # the group's own bound: the call is given up
                        _break(h, op, seq, kind, _timed_out(h, op, seq, kind, limit, req))
                    err = timeout_error(h, op, seq, kind, elapsed, limit, peer, tag, status,
                                        broke=timeout is None)
                    err.request = req
                    try:
                        raise err
                    finally:
                        # no cycle error -> traceback -> this frame -> error: a work dropped
                        # after its own wait(timeout=...) ran out is collected at once
                        del err
            backoff.pause(now, now - before)
    except BaseException as exc:
        _ended_posted(h, req, exc, timeout, op, seq, kind)
        raise
    finally:
        if announced:
            _announce(h, me, waiting=False)


def _ended_posted(h: GroupHealth, req: Any, exc: BaseException, timeout: Optional[float],
                  op: str, seq: int, kind: str) -> None:
    """A wait ended by ``exc`` with ``req`` (None: cancelled) still posted in MPI.

    The request is kept for the life of the process (``posted``: never collected while MPI
    works on it), except where a wait with a bound of its own (``Work.wait(timeout=...)``) ran
    out: its work stays pending, to be waited on again. Anything but a peer's failure
    (``faults``' business), a timeout or an MPI error (the caller's: a truncated receive
    completed) that ends the group's own wait (KeyboardInterrupt, an error from a check's
    request) breaks the group: the call is left posted where the peers' next one meets it."""
    mpi = sys.modules.get("mpi4py.MPI")
    mpi_error = mpi is not None and isinstance(exc, mpi.Exception)
    if req is not None and not mpi_error and not (
            timeout is not None and isinstance(exc, DistributedTimeoutError)):
        posted.keep(req)
    if timeout is None and not mpi_error and not isinstance(exc, (DistributedTimeoutError,
                                                                  PeerFailedError)):
        text = str(exc).splitlines()[0] if str(exc) else ""
        _break(h, op, seq, kind, f"{type(exc).__name__}{': ' if text else ''}{text[:200]} "
               "(raised while it waited); its request is still posted in MPI, where a later "
               "call would meet it")


def _break(h: GroupHealth, op: str, seq: int, kind: str, reason: str) -> None:
    """Break the group on every member (``faults.break_after``): its call ``#seq`` ended with
    its data still posted."""
    faults.break_after(h, op, seq, kind, reason)


def fault_in_wait(h: GroupHealth, kind: str, seq: int, op: str, peer: Optional[int],
                  since: float) -> Optional[PeerFailedError]:
    """For a rank waiting in ``op`` (the slow tick): the error that ends the wait, if any.

    First the agreement check's slots (``fingerprint``): a mismatch that MPI may never
    complete is raised now, and before any notice of a peer that saw it first (which would say
    less: PeerFailedError); then the fault notices (``faults.in_wait``)."""
    node = h.fp_node
    if node is not None and kind == "coll":
        tok = h.fp_tok
        if tok is None or tok[0] != seq:
            tok = h.fp_async.get(seq)
        if tok is not None and tok[0] == seq:
            node.peek(tok, h)
        if h.tiny is not None:  # a member that made this call on the small calls' board
            h.tiny.look(seq, op)
    return faults.in_wait(h, kind, seq, op, peer, since)


def _timed_out(h: GroupHealth, op: str, seq: int, kind: str, limit: float, req: Any) -> str:
    """Why a call that ran past the group's timeout broke it (the story its peers are told)."""
    head = f"DistributedTimeoutError: it did not complete within the timeout of {limit:g} s"
    if kind == "coll":
        missing, _ = _others(h, op, seq, kind)
        if missing:
            head += f" (ranks that had not arrived: {missing})"
    if req is None:  # a receive, cancelled: the message it waited for may still come
        return (f"{head}; the message may still come, and a later receive would take it")
    return f"{head}; its request is still posted in MPI, where a later call would meet it"


def _cancelled(req: Any, status: Any) -> bool:
    """Cancel a pending receive; True if it was cancelled, False if it completed instead."""
    from mpi4py import MPI  # imported where used: importing mpitensor must not start MPI

    st = status if status is not None else MPI.Status()
    try:
        req.Cancel()
        req.Wait(st)
        return bool(st.Is_cancelled())
    except Exception:  # not cancellable: report the timeout and leave the request as it is
        return True


# ---------------------------------------------------------------------------- notices
def _announce(h: GroupHealth, me: tuple, waiting: bool) -> bool:
    """Tell the other members that this rank waits in (or has left) the operation ``me``."""
    diag = h.diag
    reqs = [r for r in h.notice_reqs if not r.Test()]
    for r in range(h.size):
        if r != h.rank:
            reqs.append(diag.isend((me, waiting, time.time()), r, NOTICE_TAG + h.tag_base))
    h.notice_reqs = reqs
    return True


def drain_notices(h: GroupHealth, me: Optional[tuple] = None) -> bool:
    """Read every arrival notice that has come in; True if one is about ``me``."""
    from mpi4py import MPI

    diag = h.diag
    status = MPI.Status()
    hit = False
    tag = NOTICE_TAG + h.tag_base
    while diag.Iprobe(MPI.ANY_SOURCE, tag, status):
        src = status.Get_source()
        what, waiting, _ = diag.recv(None, src, tag)
        h.notices[src] = (what, waiting)
        if waiting and what == me:
            hit = True
    return hit


def _others(h: GroupHealth, op: str, seq: int, kind: str) -> "tuple[list, list]":
    """(global ranks with no sign of being in this operation, lines describing the others)."""
    missing, lines = [], []
    for r in range(h.size):
        if r == h.rank:
            continue
        who = h.ranks[r]
        seen = h.notices.get(r)
        if seen is None:
            if kind == "coll":
                missing.append(who)
                lines.append(f"rank {who}: no arrival notice (not in {op} #{seq})")
            continue
        (k, s, o), waiting = seen
        if kind == "coll" and (k, s, o) == (kind, seq, op):
            # one that has left this very call had arrived (the group broke, say)
            lines.append(f"rank {who}: " + (f"waiting in {op} #{seq} too" if waiting else
                                            f"arrived in {op} #{seq} too (and has left it)"))
            continue
        where = f"{o} #{s}" if k == "coll" else f"{o} (p2p #{s})"
        if kind == "coll":
            missing.append(who)
        lines.append(f"rank {who}: {'waiting in' if waiting else 'last seen leaving'} {where}")
    return missing, lines


def _pending_messages(h: GroupHealth) -> list:
    """Unreceived messages addressed to this rank (one per sender): a wrong-tag hint."""
    out = []
    comm = h.comm
    if comm is None:
        return out
    from mpi4py import MPI

    status = MPI.Status()
    for r in range(h.size):
        if r != h.rank and comm.Iprobe(r, MPI.ANY_TAG, status):
            out.append(f"from rank {h.ranks[r]} with tag {status.Get_tag()} "
                       f"({status.Get_count(MPI.BYTE)} bytes)")
    return out


def _grace(h: GroupHealth) -> None:
    """Give late notices a moment to arrive before naming missing ranks."""
    if h.diag is None:
        return
    end = _perf() + 0.05
    while _perf() < end:
        drain_notices(h)
        time.sleep(0.005)


# ---------------------------------------------------------------------------- reports
def _label(op: str, seq: int, kind: str, h: GroupHealth, peer: Optional[int],
           tag: Optional[int]) -> str:
    if kind == "coll":
        return f"{op} (#{seq} on {h.name})"
    side = "from" if "recv" in op else "to"
    who = "any rank" if peer is None else f"rank {h.ranks[peer]}"
    return f"{op} {side} {who} (tag {tag}, p2p #{seq} on {h.name})"


def history_lines(h: GroupHealth) -> list:
    """The group's last collectives, oldest first, formatted."""
    entries = sorted((e for e in h.history if e is not None), key=lambda e: e[0])
    lines = []
    for s, o, dt, shape in entries:
        arg = "" if dt is None else f" {dt}{list(shape) if shape is not None else ''}"
        lines.append(f"#{s} {o}{arg}")
    return lines


def stall_report(h: GroupHealth, op: str, seq: int, kind: str, elapsed: float, limit: float,
                 peer: Optional[int] = None, tag: Optional[int] = None) -> str:
    """The text of a stall report (see docs/failures.md for how to read it)."""
    _, others = _others(h, op, seq, kind)
    hist = history_lines(h) or ["(none yet)"]
    stack = "".join(traceback.format_stack()[:-3]).rstrip()
    lim = f"{limit:g} s" if math.isfinite(limit) else "none"
    return (
        f"rank {h.global_rank}: STALL: {_label(op, seq, kind, h, peer, tag)} has waited "
        f"{elapsed:.1f} s (timeout {lim})\n"
        f"  last {HISTORY} collectives on {h.name} (oldest first): " + "; ".join(hist) + "\n"
        "  other ranks (from their arrival notices): " + ("; ".join(others) or "-") + "\n"
        f"  Python stack of thread {threading.current_thread().name!r} "
        "(most recent call last):\n" + "\n".join("    " + ln for ln in stack.splitlines())
    )


def timeout_error(h: GroupHealth, op: str, seq: int, kind: str, elapsed: float, limit: float,
                  peer: Optional[int], tag: Optional[int],
                  status: Any = None, broke: bool = True) -> DistributedTimeoutError:
    """Build the DistributedTimeoutError for an operation that ran out of time (``broke``:
    the group's own timeout, which broke the group; else a bound of the caller's own)."""
    _grace(h)
    missing, others = _others(h, op, seq, kind)
    parts = [f"rank {h.global_rank}: {_label(op, seq, kind, h, peer, tag)} did not complete "
             f"within {limit:g} s (waited {elapsed:.1f} s)."]
    if kind == "coll":
        if missing:
            parts.append(f"Ranks that had not arrived: {missing}.")
        if others:
            parts.append("Other ranks: " + "; ".join(others) + ".")
        parts.append("Every rank must make the same collective calls in the same order "
                     "(MPITENSOR_DEBUG=1 checks their arguments).")
    else:
        if peer is not None:
            seen = [ln for ln in others if ln.startswith(f"rank {h.ranks[peer]}:")]
            parts.append(f"The peer {seen[0] if seen else f'rank {h.ranks[peer]} sent no notice'}"
                         ".")
        if "recv" in op:
            pending = _pending_messages(h)
            if pending:
                parts.append("Unreceived messages waiting here: " + "; ".join(pending)
                             + " (wrong peer or tag?).")
        parts.append("Check that the peer makes the matching call with the same tag.")
    if broke:
        parts.append(f"{h.name} is broken from here on: every later call on it raises "
                     "PeerFailedError on every member (they were told). To go on, make a new "
                     "group (new_group), or destroy_process_group() and init_process_group() "
                     "again; uncaught, this error aborts the job.")
    else:
        parts.append("The operation is still pending: wait on it again (the group stays "
                     "usable); uncaught, this error aborts the job.")
    missing_ranks = missing if kind == "coll" else (
        [h.ranks[peer]] if peer is not None else None)
    return DistributedTimeoutError(" ".join(parts), op=op, group=h.name, seq=seq,
                                   elapsed=elapsed, missing=missing_ranks)


# ---------------------------------------------------------------------------- constructors
RENDEZVOUS_TAG = 4  # on the parent's notice communicator: "I am about to build this group"


def timed_dup(comm: Any, timeout: float, what: str) -> Any:
    """``comm.Dup()`` bounded by ``timeout``: the non-blocking ``Idup``, polled.

    A rank that never makes the call (it skipped ``init_process_group``, or died) would leave
    the blocking ``Dup`` waiting forever; here the others raise instead.
    """
    new, req = comm.Idup()
    if not poll(req, None, _perf() + timeout):
        raise DistributedTimeoutError(
            f"rank {comm.Get_rank()}: {what} did not complete within {timeout:g} s: not every "
            f"one of the {comm.Get_size()} ranks made the call (a rank that skipped it, exited "
            "early or hangs before it). Every rank must call it.", op=what,
            elapsed=timeout)
    return new


def rendezvous(h: GroupHealth, members: list, key: tuple, timeout: float, what: str) -> None:
    """Before a blocking communicator constructor among ``members`` (group ranks of ``h``):
    every member tells every other one it has arrived, on ``h``'s notice communicator, and
    waits for theirs, at most ``timeout`` seconds. Raises DistributedTimeoutError naming the
    members that never arrived, or CollectiveMismatchError if one arrived for another group.
    Costs one small message per pair of members, only when groups are made.
    """
    from mpi4py import MPI

    from ...errors import CollectiveMismatchError

    diag = h.diag
    me = h.rank
    others = [m for m in members if m != me]
    reqs = [diag.isend(key, m, RENDEZVOUS_TAG) for m in others]
    need = set(others)
    t0 = _perf()
    deadline = t0 + timeout
    backoff = Backoff(t0)
    while need:
        for m in sorted(need):
            if diag.Iprobe(m, RENDEZVOUS_TAG):
                theirs = diag.recv(None, m, RENDEZVOUS_TAG)
                need.discard(m)
                if theirs != key:
                    raise CollectiveMismatchError(
                        f"rank {h.global_rank}: {what}: rank {h.ranks[m]} is making "
                        f"{theirs[0]}({list(theirs[1])}) at the same point; every rank must "
                        "make the same new_group calls in the same order")
        if not need:
            break
        now = _perf()
        if now >= deadline:
            missing = sorted(h.ranks[m] for m in need)
            raise DistributedTimeoutError(
                f"rank {h.global_rank}: {what} did not complete within {timeout:g} s: ranks "
                f"{missing} never called it (members: {sorted(h.ranks[m] for m in members)}). "
                "Every member must call new_group with the same ranks, in the same order as "
                "its other new_group calls.", op=what, group=h.name, elapsed=now - t0,
                missing=missing)
        backoff.pause(now, 0.0)
    MPI.Request.Waitall(reqs)
