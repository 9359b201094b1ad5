"""Fault notices: one rank's error never lets the others complete the wrong call.

A collective call that raises on one rank before it has sent anything (a read-only buffer, a
wrong list on the root, an MPI error while posting) leaves the other members inside that call,
or on their way to it. Without care they would later complete it against the failing rank's
*next* call: two different calls mixed, silently. This module closes that gap with messages on
each group's private notice communicator (``GroupHealth.diag``; user messages can never match them):

* **fail** ``(seq, op, error)``: sent by a rank whose collective ``#seq`` failed before any
  traffic, to every other member; the rank raises its own error at once. Its next call on the
  group first *settles* the failure: it waits (bounded by the group's timeout) for every
  peer's answer. Peers that failed in the same call answer with their own *fail* notice:
  nobody posted anything, the group stays usable, and every rank has raised its own error (the
  usual case of a bad argument passed on every rank). Any other answer means some peer had
  posted the call: the group is *broken*.
* **broken** ``(origin)``: sent by a rank that learnt the group cannot be used any more (it
  was waiting in a call that a failed or departed rank will never make). A rank waiting in any
  call on the group ends its wait with :class:`~mpitensor.errors.PeerFailedError` at once,
  unless the group broke in a later collective than the one it waits in: its origin completed
  this one, so every member's part of it was there; the rank finishes it and meets the break
  in its next call (a peer descheduled under load is often one call behind).
* **left** ``(last seq)``: sent at interpreter exit by a rank that still holds the group
  (``sys.exit``, returning from the script). A peer waiting in a collective that the leaver
  never reached, or in a receive from it, raises instead of waiting for the timeout.

A call that ends with its data still posted in MPI breaks its group too: one that ran past the
group's timeout, or raised while it waited (:func:`break_after`, from ``watchdog``).
Its request stays posted, and a peer's later call would complete against it: two different
calls mixed, silently. The rank sends the *broken* notice at once, before it words its error.

A broken group refuses every later call, collective or point-to-point, on every rank that
knows, with the same story (which rank, which operation, which call number, why). Waiting
ranks read these notices on their slow-poll tick (once a millisecond, after the first 50 µs);
a rank entering a call looks whether a member broke the group (``ProcessGroup.slow``), so
that a call that would complete at once against a broken peer's posted request is refused
before it posts anything. Where the members share a machine that look is one word of shared
memory (:func:`shared_flag`), which a rank whose call was left posted sets before it sends its
notice (other breaks are found by every member, or leave nothing posted, and do not set it): MPI
alone is no good here, since MPICH moves one queued message a probe, and a rank back from a
long computation may hold several before the notice. Across machines it is an ``Iprobe`` on
the notice communicator, which can miss a notice stuck behind others: there a call entered in
the first moments after the break may still complete against the posted request.
"""

from __future__ import annotations

import atexit
import sys
import time
import weakref
from typing import Any, Optional

from ...errors import PeerFailedError
from ..backends.mpi import shm as _shm
from .abort import _OUTPUT_GRACE_S, _wait_output_read
from .backoff import Backoff
from .state import GroupHealth, Story

FAULT_TAG = 3  # on the notice communicator (1: arrival notices, 2: debug verdicts)
_LEFT_GRACE_S = 0.2  # a receive from a rank that left: the data may still be on its way
_NOTICE_WAIT_S = 5.0  # the flag is up: the breaking rank's notice follows, within this
FLAG_BYTES = 64  # the shared flag's segment: one word, on a cache line of its own

_live: "weakref.WeakSet" = weakref.WeakSet()  # groups to tell when this process exits
_hooked = False



def error(h: GroupHealth, story: Story, opname: str, seq: Optional[int] = None,
          waiting: bool = False) -> PeerFailedError:
    """The error a call on a broken group raises (``waiting``: it was inside the call)."""
    me = h.global_rank
    call = f"{opname} (#{seq} on {h.name})" if seq is not None else f"{opname} on {h.name}"
    culprit = f"rank {story.rank}" + (" (this rank)" if story.rank == me else "")
    head = (f"rank {me}: {call} cannot complete" if waiting
            else f"rank {me}: {call} refused: the group is unusable")
    what = (f"{culprit}: {story.reason}" if story.op == "exit" else
            f"{culprit} failed in {story.call(h.name)}: {story.reason}")
    msg = (f"{head}: {what}. The other ranks may have entered calls that will never be matched, "
           f"so every later call on {h.name} raises this error on every rank that knows; "
           "create a new group (new_group), or destroy_process_group() and "
           "init_process_group() again, or end the job.")
    err = PeerFailedError(msg)
    err.rank, err.op, err.seq, err.group, err.reason = story.rank, story.op, story.seq, \
        h.name, story.reason
    err.kind = story.kind
    return err


def _send(h: GroupHealth, msg: tuple) -> None:
    """Send ``msg`` to every other member (non-blocking; the requests are kept and reaped)."""
    diag = h.diag
    if diag is None:
        return
    reqs = [r for r in h.notice_reqs if not r.Test()]
    for r in range(h.size):
        if r != h.rank:
            try:
                reqs.append(diag.isend(msg, r, FAULT_TAG + h.tag_base))
            except Exception:  # noqa: BLE001 - a peer gone, MPI finalising: tell the others
                pass
    h.notice_reqs = reqs


def drain(h: GroupHealth) -> None:
    """Read every fault notice that has arrived into ``h.faults`` (in arrival order)."""
    diag = h.diag
    if diag is None:
        return
    from mpi4py import MPI  # imported where used: importing mpitensor must not start MPI

    status = MPI.Status()
    tag = FAULT_TAG + h.tag_base
    while diag.Iprobe(MPI.ANY_SOURCE, tag, status):
        src = status.Get_source()
        h.faults.append((src, diag.recv(None, src, tag)))


def shared_flag(comm: Any) -> Optional[Any]:
    """Collective over ``comm``: a word of shared memory that every member maps (an ``mmap``),
    or None on every member where they do not share a machine (or /dev/shm, or x86-64).

    Nonzero once a member broke the group: that member's global rank + 1 (:func:`mark_broken`).
    """
    if comm.Get_size() < 2:
        return None
    return _shm.shared(comm, "mpitensor-fault-", FLAG_BYTES)


def mark_broken(h: GroupHealth, story: Story, tell: bool = True, flag: bool = False) -> None:
    """Make every later call on ``h`` raise; tell the other members unless they told us.

    ``flag``: a call of this rank was left posted (:func:`break_after`): raise the
    group's shared flag first (where it has one), then send the notice, so that a member
    entering a call sees the flag at once (and waits for the notice that says why) instead of
    completing against the posted call. The other breaks (a mismatch every member finds, a
    failure before any traffic) leave it down: the members learn them from the notice.
    """
    if h.broken is not None:
        return
    h.broken = story
    h.slow = True  # fast paths off: every call reaches the check in _begin
    if flag:
        word = h.fault_word
        if word is not None and not word[0]:
            word[0] = h.global_rank + 1
    if tell:
        _send(h, ("broken", story.as_tuple()))


def break_after(h: GroupHealth, op: str, seq: int, kind: str, reason: str) -> None:
    """Call ``op`` (``#seq``, ``kind`` ``"coll"`` or ``"p2p"``) ended, for ``reason``, while
    its data was posted in MPI: break the group here and tell the other members, whose
    waits end with PeerFailedError and whose later calls are refused.

    A peer's later call would otherwise complete against what is still posted: the
    timed-out all_reduce of one rank summed with the next all_reduce of another."""
    if h.rank < 0 or h.broken is not None:
        return
    mark_broken(h, Story(h.global_rank, op, seq, reason, kind), flag=True)


def heed(h: GroupHealth) -> None:
    """A rank entering a call on ``h``: read the fault notices that have come, and break ``h``
    here too if one says a peer broke it (the others stay for ``in_wait`` and ``settle``).

    Where the shared flag is up, the breaking rank's notice is on its way: wait for it (it
    names the call), at most a few seconds."""
    if _heed_notices(h):
        return
    word = h.fault_word
    if word is None or not word[0]:
        return
    t0 = time.perf_counter()
    backoff = Backoff(t0)
    while True:
        if _heed_notices(h):
            return
        now = time.perf_counter()
        if now - t0 >= _NOTICE_WAIT_S:
            mark_broken(h, Story(word[0] - 1, "a call", -1, "it marked the group broken, but "
                                 f"its notice of why did not arrive within {_NOTICE_WAIT_S:g} s"),
                        tell=False)
            return
        backoff.pause(now, 0.0)


def _heed_notices(h: GroupHealth) -> bool:
    """Drain ``h``'s fault notices; True once ``h`` is broken (here, or by a peer's notice)."""
    drain(h)
    if h.broken is not None:
        return True
    for _, msg in h.faults:
        if msg[0] == "broken":
            mark_broken(h, Story(*msg[1]), tell=False)  # its origin told every member
            return True
    return False


def in_wait(h: GroupHealth, kind: str, seq: int, op: str, peer: Optional[int],
            since: float) -> Optional[PeerFailedError]:
    """Called by a waiting rank on its slow tick: the error that ends the wait, if any.

    ``kind``/``seq``: the call waited on (``"coll"`` with the group's call number, or ``"p2p"``);
    ``peer``: the p2p peer's group rank (``None``: any source); ``since``: when the wait began.
    """
    drain(h)
    if h.broken is not None and not _after(h.broken, kind, seq):
        return error(h, h.broken, op, seq if kind == "coll" else None, waiting=True)
    left = {src for src, msg in h.faults if msg[0] == "left"}
    for src, msg in h.faults:
        what = msg[0]
        if what == "broken":
            story = Story(*msg[1])
            if _after(story, kind, seq):
                continue  # kept: the group's next call meets it (heed)
        elif what == "fail" and kind == "coll" and msg[1] <= seq:
            # the failing rank never posted call msg[1]: this call (msg[1] itself, or a later
            # one this rank reached because its part of msg[1] completed locally) cannot match
            story = Story(h.ranks[src], msg[2], msg[1], msg[3])
        elif what == "left" and (kind == "coll" and msg[1] < seq or kind == "p2p" and (
                peer == src or peer is None and len(left) == h.size - 1)):
            if kind == "p2p" and time.perf_counter() - since < _LEFT_GRACE_S:
                continue  # what it sent before leaving may still be on its way
            story = Story(h.ranks[src], "exit", msg[1],
                          f"the process left (sys.exit or the end of its script) after "
                          f"collective #{msg[1]}, while this rank still waited for it")
            if kind == "coll":  # no collective can complete on this group any more
                mark_broken(h, story, tell=False)
            # the leaver's last output (its traceback, say) has reached its launcher proxy
            # (_at_exit); give the proxy the abort path's moment to pass it on before this
            # error perhaps ends the job
            time.sleep(_OUTPUT_GRACE_S)
            return error(h, story, op, seq if kind == "coll" else None, waiting=True)
        else:
            continue
        mark_broken(h, story)
        return error(h, story, op, seq if kind == "coll" else None, waiting=True)
    return None


def _after(story: Story, kind: str, seq: int) -> bool:
    """Whether a break leaves collective ``#seq`` to complete: it happened in a later
    collective of the group, which its origin reached by completing ``#seq`` (every member's
    part of ``#seq`` was there). The waiting rank finishes ``#seq`` and meets the break at its
    next call; a break in ``#seq`` itself, an earlier one, a point-to-point one (numbered
    apart) or one of unknown number ends the wait."""
    return kind == "coll" and story.kind == "coll" and story.seq > seq


def announce_failure(h: GroupHealth, op: str, seq: int, exc: BaseException) -> Optional[Story]:
    """A rank's collective ``#seq`` failed before any traffic: tell the peers (at once, without
    waiting; :func:`settle` hears their answers at the group's next call). Returns the story
    to settle, or ``None`` when there is nobody to tell."""
    if h.size < 2 or h.diag is None:
        return None
    text = str(exc).splitlines()[0] if str(exc) else ""
    prefix = f"rank {h.global_rank}: {op} (#{seq} on {h.name}): "
    if text.startswith(prefix):  # our own messages start with the call: said already
        text = text[len(prefix):]
    reason = f"{type(exc).__name__}: {text}"
    if len(reason) > 300:
        reason = reason[:297] + "..."
    _send(h, ("fail", seq, op, reason))
    return Story(h.global_rank, op, seq, reason)


def settle(h: GroupHealth, mine: Story) -> None:
    """Hear every peer out about the failed call ``mine.seq`` (at most the group's timeout).

    Peers that failed in the same call answer with their own *fail* notice: nobody posted
    anything and the group stays usable. Any other answer (a *broken* notice from a peer that
    was waiting in the call, a failure elsewhere, a departure), or silence until the timeout,
    marks the group broken.
    """
    seq = mine.seq
    need = set(range(h.size)) - {h.rank}
    t0 = time.perf_counter()
    deadline = t0 + h.timeout
    backoff = Backoff(t0)
    other: Optional[Story] = None
    while True:
        drain(h)
        keep = []
        for src, msg in h.faults:
            if msg[0] == "fail" and msg[1] == seq:
                need.discard(src)  # failed in this very call too: consumed
                continue
            keep.append((src, msg))
            if other is None and msg[0] == "broken":
                other = Story(*msg[1])
            elif msg[0] == "fail" and src not in need and msg[1] > seq:
                # it failed this call too (notices from one rank arrive in order) and has
                # since failed a later one: kept for that call's settling, not a fault here
                continue
            elif other is None:  # failed elsewhere, or left: it had passed this call
                other = mine
        h.faults = keep
        if not need:
            return
        if other is not None or h.broken is not None:
            break
        now = time.perf_counter()
        if now >= deadline:
            ranks = sorted(h.ranks[r] for r in need)
            mine.reason += (f" (ranks {ranks} neither failed in this call nor answered within "
                            f"the group's timeout of {h.timeout:g} s)")
            break
        backoff.pause(now, 0.0)
    story = h.broken or other or mine
    mark_broken(h, story, tell=h.broken is None)


def track(h: GroupHealth) -> None:
    """Remember ``h`` so that its peers hear of it when this process exits."""
    global _hooked
    _live.add(h)
    if not _hooked:
        _hooked = True
        atexit.register(_at_exit)  # after mpi4py's (LIFO): runs while MPI is still up


def forget(h: GroupHealth) -> None:
    _live.discard(h)


def _at_exit() -> None:
    """Tell the peers of every live group that this process is leaving (see module doc)."""
    try:
        from mpi4py import MPI

        if not MPI.Is_initialized() or MPI.Is_finalized():
            return
    except Exception:  # noqa: BLE001
        return
    groups = [h for h in list(_live) if h.diag is not None and h.rank >= 0]
    if not groups:
        return
    # what this rank printed last (an uncaught exception's traceback comes before atexit)
    # must reach the launcher before a peer's reaction to the notice can end the job
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not stop the notice
            pass
    _wait_output_read()
    for h in groups:
        _send(h, ("left", h.last_seq))
    end = time.monotonic() + 0.5  # small eager messages: done at once unless MPI is wedged
    for h in groups:
        for r in h.notice_reqs:
            while not r.Test() and time.monotonic() < end:
                time.sleep(1e-3)
