"""Backend-neutral pieces of the communicator layer: reduce ops, work handles, the group base.

A :class:`ProcessGroup` is one communicator: the world, or a sub-group made by ``new_group``.
Concrete subclasses (:class:`~mpitensor.distributed.backends.mpi.group.MPIGroup`,
:class:`~mpitensor.distributed.backends.nccl.NCCLGroup`) implement the operations; this module holds
what they share: rank translation, sequence numbers, error wording and the ``Work`` handle.
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Callable, Optional, Sequence

from .._base import config as _config
from ..errors import DistributedTimeoutError, MpiTensorError, NotAGroupMemberError
from .health import faults as _faults
from .health import watchdog as _watchdog

__all__ = ["ReduceOp", "reduce_op", "Work", "ProcessGroup", "GroupMember"]


class ReduceOp:
    """Reduction operations, named as in ``torch.distributed.ReduceOp``.

    ``ReduceOp.SUM``, ``PRODUCT``, ``MIN``, ``MAX``, ``BAND``, ``BOR``, ``BXOR``, ``AVG``.
    ``AVG`` is defined for floating and complex dtypes; ``BAND``/``BOR``/``BXOR`` for integer and
    bool dtypes; ``MAX``/``MIN`` for real dtypes. Any other combination raises ``ValueError``
    before any message is sent.

    The members are plain singletons rather than ``enum.Enum`` members: an Enum's attribute
    access and hash cost ~0.5 µs together, which would double the overhead of a small all_reduce.
    """

    __slots__ = ("name",)
    SUM: "ReduceOp"
    PRODUCT: "ReduceOp"
    MIN: "ReduceOp"
    MAX: "ReduceOp"
    BAND: "ReduceOp"
    BOR: "ReduceOp"
    BXOR: "ReduceOp"
    AVG: "ReduceOp"
    members: "dict[str, ReduceOp]" = {}

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<ReduceOp.{self.name}>"

    __str__ = __repr__

    def __reduce__(self) -> "tuple":
        return (getattr, (ReduceOp, self.name))


for _name in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"):
    setattr(ReduceOp, _name, ReduceOp(_name))
    ReduceOp.members[_name] = getattr(ReduceOp, _name)
del _name


class _LegacyReduceOp:
    """The deprecated ``reduce_op`` namespace of old torch tutorials (``dist.reduce_op.SUM``)."""

    SUM = ReduceOp.SUM
    PRODUCT = ReduceOp.PRODUCT
    MIN = ReduceOp.MIN
    MAX = ReduceOp.MAX

    def __repr__(self) -> str:
        return "reduce_op (legacy alias of ReduceOp)"


reduce_op = _LegacyReduceOp()


#: the name ``record_comm(name)`` gives the collectives called inside it ("" outside): the
#: error prefixes of their argument checks carry it
COMM_NAME = [""]


class Work:
    """Handle of an asynchronous operation (``async_op=True``, ``isend``, ``irecv``).

    ``wait()`` blocks until the operation is done and its output is in place; ``is_completed()``
    polls without blocking. Finishing steps (writing back a staged buffer, dividing for ``AVG``,
    unpacking into output lists) run exactly once, in whichever of the two completes it.
    ``wait()`` without a timeout is bounded by the group's timeout (``init_process_group``).

    Example:
        >>> work = dist.all_reduce(t, async_op=True)
        >>> ...                      # overlap other work here
        >>> work.wait()
    """

    __slots__ = ("_request", "_finish", "_done", "_result", "_source", "_describe", "_keep",
                 "_exception", "_status", "_group", "_info", "_orphan", "__weakref__")

    def __init__(
        self,
        request: Any,
        finish: Optional[Callable[[], None]] = None,
        result: Any = None,
        describe: Optional[Callable[[], str]] = None,
        keep: Any = None,
        status: Any = None,
        group: Any = None,
        info: Optional[tuple] = None,
    ) -> None:
        self._request = request
        self._finish = finish
        self._done = False
        self._result = result
        self._source: Optional[int] = None
        self._describe = describe
        self._keep = keep  # buffers MPI reads or writes must outlive the request
        self._exception: Optional[BaseException] = None
        self._status = status
        self._group = group  # the MPI group whose timeout bounds wait()
        self._info = info  # (op, seq, kind, peer, tag) for timeout and stall reports
        self._orphan: Any = None  # after wait(timeout=...) ran out: breaks the group if dropped

    def _complete(self) -> None:
        self._done = True
        if self._orphan is not None:
            self._orphan.detach()
        finish, self._finish = self._finish, None
        self._keep = None
        if finish is not None:
            try:
                finish()
            except BaseException as exc:
                self._exception = exc
                raise

    def _await(self, timeout: Optional[float]) -> None:
        """Wait for the request itself (subclasses add steps, e.g. debug-mode verdicts)."""
        g = self._group
        if g is not None:
            op, seq, kind, peer, tag = self._info or ("operation", 0, "coll", None, None)
            _watchdog.wait(g, self._request, op, seq, kind, self._status, timeout, peer, tag)
            return
        if timeout is None:
            self._request.Wait(self._status)
            return
        if not _watchdog.poll(self._request, self._status, time.perf_counter() + float(timeout)):
            what = self._describe() if self._describe is not None else "operation"
            raise DistributedTimeoutError(
                f"{what} did not complete within {timeout:g} s; a peer may not have "
                "entered the matching call. Check that every rank makes the same calls "
                "in the same order (MPITENSOR_DEBUG=1 checks collectives).")

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the operation completes; return True.

        Args:
            timeout: seconds to wait at most (a ``float`` or ``datetime.timedelta``); ``None``
                waits up to the group's timeout.

        Raises:
            DistributedTimeoutError: the operation did not complete in time.
        """
        if self._done:
            if self._exception is not None:
                raise self._exception
            return True
        if timeout is not None and hasattr(timeout, "total_seconds"):
            timeout = timeout.total_seconds()
        try:
            self._await(timeout)
        except DistributedTimeoutError:
            if timeout is not None and self._orphan is None and self._group is not None:
                self._orphan = _guard_dropped(self)
            raise
        self._complete()
        return True

    def is_completed(self) -> bool:
        """Return True when the operation has finished (never blocks)."""
        if self._done:
            return True
        if self._request.Test(self._status):
            self._complete()
            return True
        return False

    def is_success(self) -> bool:
        """Return True when the operation completed without error."""
        return self._done and self._exception is None

    def exception(self) -> Optional[BaseException]:
        """Return the error the operation finished with, if any."""
        return self._exception

    def result(self) -> Any:
        """Return the output tensors (a list) after waiting for completion."""
        self.wait()
        return self._result

    def get_future(self) -> Any:
        """A :class:`~mpitensor.futures.Future` of this operation, holding its list of output
        tensors. MPI has no progress thread: the future completes when it (or a future chained
        from it with ``then``) is waited on, and its callbacks run then."""
        from ._work_future import WorkFuture

        return WorkFuture.of_work(self)

    def source_rank(self) -> int:
        """For a completed ``irecv``: the global rank the message came from."""
        if not self._done:
            raise RuntimeError("source_rank() needs a completed irecv: call wait() first")
        if self._source is None:
            raise RuntimeError("source_rank() is only defined for irecv work handles")
        return self._source

    def __repr__(self) -> str:
        what = self._describe() if self._describe is not None else "work"
        return f"<Work {what} {'done' if self._done else 'pending'}>"


def _guard_dropped(work: Work) -> Any:
    """A work whose ``wait(timeout=...)`` ran out stays pending, to be waited on again; should
    the program drop it unfinished instead, its request is still posted, and a peer's later call
    would meet it: break the group then (when the work is collected)."""
    fin = weakref.finalize(work, _dropped, work._group, work._request, work._info)
    fin.atexit = False  # at exit MPI may be gone, and the peers hear that this rank left
    return fin


def _dropped(g: Any, request: Any, info: Optional[tuple]) -> None:
    try:
        if request.Test():
            return  # completed after all: nothing is left posted
    except Exception:  # noqa: BLE001 - failed, or MPI gone: nothing left to match
        return
    op, seq, kind = (info or ("operation", 0, "coll"))[:3]
    g.break_after(op, seq, kind, "its work was dropped unfinished after wait(timeout=...) ran "
                  "out; its request is still posted in MPI, where a later call would meet it")


class _Completed(Work):
    """A work handle that is already complete (a no-op, or a blocking fallback)."""

    __slots__ = ()

    def __init__(self, result: Any = None) -> None:
        super().__init__(None, None, result)
        self._done = True


class ProcessGroup:
    """A communicator over a set of global ranks.

    Attributes:
        ranks: the global ranks of the members, in group-rank order.
        rank_: this process's rank in the group (-1 when not a member).
        name: a readable name used in error messages.
    """

    backend_name = "undefined"

    def __init__(self, ranks: Sequence[int], my_global_rank: int, name: str,
                 timeout: float, debug: bool) -> None:
        self._set_identity(ranks, my_global_rank, name)
        self.timeout = timeout
        self.broken: Any = None  # a _faults.Story once the group is unusable
        self.unsettled: Any = None  # the Story of a local failure the peers were told of
        self.debug = debug
        self.faults: list = []  # fault notices read and not yet consumed: (group rank, msg)
        self.sent = 0  # calls that reached MPI (posted traffic): a failure before it is local
        self.seq = 0  # collectives: the same count on every member
        self.p2p_seq = 0  # point-to-point calls: counted per rank
        self.stall_warn = _watchdog.stall_warn_seconds(timeout)
        self.history: list = [None] * _watchdog.HISTORY  # (seq, op, dtype, shape) ring
        self.diag: Any = None  # private communicator for arrival notices (MPI groups)
        self.tag_base = 0  # added to the notice tags on ``diag``: this group's incarnation
        # collectives of this many bytes and more check agreement beside the data (MPI groups;
        # _fingerprint): the same value on every rank, or a straddling call waits for a partner
        self.check_bytes: int = _config.CHECK_BYTES
        self.notices: dict = {}  # group rank -> its latest arrival notice
        self.notice_reqs: list = []

    @property
    def debug(self) -> bool:
        """Debug mode (argument agreement before every collective, p2p headers)."""
        return self._debug_on

    @debug.setter
    def debug(self, value: bool) -> None:
        self._debug_on = bool(value)
        self._set_slow()

    _slow = False
    _heard: Optional[Callable[[], bool]] = None  # True while a fault notice waits in MPI

    @property
    def slow(self) -> bool:
        """True: a call takes the general path, which checks the group before any traffic.

        Set for debug mode, a failure to settle and a broken group; also true while a peer's
        fault notice waits unread (one ``Iprobe`` on the notice communicator, about 0.3 µs):
        a peer may have broken the group, and this call must not complete against the
        request its broken call left posted (``_faults``)."""
        if self._slow:
            return True
        heard = self._heard
        return heard is not None and heard()

    @slow.setter
    def slow(self, value: bool) -> None:
        self._slow = bool(value)

    def _set_slow(self) -> None:
        # True: every call takes the general path (debug checks, or a failure to settle)
        self.slow = self._debug_on or self.broken is not None or self.unsettled is not None

    def check_usable(self, opname: str) -> None:
        """Settle a local failure with the peers first (``_faults.settle``), read the fault
        notices that came (a peer that broke the group), then raise the group's
        PeerFailedError if a failure made it unusable."""
        if self.unsettled is not None:
            story, self.unsettled = self.unsettled, None
            try:
                _faults.settle(self, story)
            finally:
                self._set_slow()
        if self.broken is None and self._heard is not None:
            _faults.heed(self)
        if self.broken is not None:
            raise _faults.error(self, self.broken, opname)

    def break_after(self, op: str, seq: int, kind: str, reason: str) -> None:
        """Call ``op`` (``#seq``, ``kind`` ``"coll"`` or ``"p2p"``) ended, for ``reason``, while
        its data was posted in MPI: break the group here and tell the other members, whose
        waits end with PeerFailedError and whose later calls are refused (``_faults``).

        A peer's later call would otherwise complete against what is still posted: the
        timed-out all_reduce of one rank summed with the next all_reduce of another."""
        if self.rank_ < 0 or self.broken is not None:
            return
        _faults.mark_broken(self, _faults.Story(self.global_rank, op, seq, reason, kind),
                            flag=True)

    def fault_in_wait(self, kind: str, seq: int, op: str, peer: Optional[int],
                      since: float) -> Any:
        """For a rank waiting in ``op`` (``_watchdog``'s slow tick): the PeerFailedError that
        ends the wait, if a fault notice says the call can never complete (``_faults``)."""
        return _faults.in_wait(self, kind, seq, op, peer, since)

    def mark_unusable(self, opname: str, reason: str) -> None:
        """Declare the group unusable because of this rank (e.g. DDP's backward stopped
        half-way): tell the other members, whose waits end with PeerFailedError, and make
        every later call on it raise."""
        if self.rank_ >= 0 and self.broken is None:
            _faults.mark_broken(self, _faults.Story(self.global_rank, opname, self.seq,
                                                    reason))

    def call_guarded(self, opname: str, body: Callable[..., Any], *args: Any,
                     **kwargs: Any) -> Any:
        """Run a collective's ``body``; if it raises before any traffic, tell the peers at
        once (see ``_faults``) and raise; the group's next call settles it with them: the group
        stays usable only if they all failed the same call.
        """
        sent0, seq0 = self.sent, self.seq
        try:
            return body(*args, **kwargs)
        except Exception as exc:
            if self.sent == sent0 and self.rank_ >= 0 and self.broken is None:
                if self.seq == seq0:
                    self._count(opname)
                story = _faults.announce_failure(self, opname, self.seq, exc)
                if story is not None:
                    self.unsettled = story
                    self.slow = True
                    exc.add_note(f"the other members of {self.name} were told: if all of "
                                 "them failed this call too, the group stays usable; if any "
                                 "had entered it, the group is unusable from here on and its "
                                 "next call raises PeerFailedError")
            raise

    def _set_identity(self, ranks: Sequence[int], my_global_rank: int, name: str) -> None:
        """Members, this process's place among them, and the name used in messages."""
        self.ranks = tuple(int(r) for r in ranks)
        self._global_to_group = {g: i for i, g in enumerate(self.ranks)}
        self.global_rank = my_global_rank
        self.rank_ = self._global_to_group.get(my_global_rank, -1)
        self.size_ = len(self.ranks)
        self.name = name

    def set_timeout(self, seconds: float) -> None:
        """Change the group's timeout (and the stall threshold that follows from it)."""
        self.timeout = float(seconds)
        self.stall_warn = _watchdog.stall_warn_seconds(self.timeout)

    def _count(self, opname: str, arr: Any = None) -> int:
        """Count one collective that passed its checks; remember it for stall reports."""
        s = self.seq = self.seq + 1
        if isinstance(arr, (list, tuple)):
            arr = arr[0] if arr else None
        a = getattr(arr, "_data", arr)
        self.history[s & _watchdog.MASK] = (s, opname, getattr(a, "dtype", None),
                                            getattr(a, "shape", None))
        return s

    # -- membership and rank translation ------------------------------------------------
    @property
    def is_member(self) -> bool:
        return self.rank_ >= 0

    def rank(self) -> int:
        """This process's rank in the group (-1 when not a member, as in torch)."""
        return self.rank_

    def size(self) -> int:
        """Number of ranks in the group."""
        return self.size_

    destroyed = False  # set by free(): the group's communicators are gone

    def _mark_destroyed(self) -> None:
        """After free(): every later call fails in require_member, with the reason."""
        self.destroyed = True
        self.rank_ = -1  # sends every call, fast paths included, to require_member

    def require_member(self, opname: str) -> None:
        if self.destroyed:
            raise MpiTensorError(
                f"rank {self.global_rank}: {opname} on {self.name}, which was destroyed "
                "(destroy_process_group); create a new group with new_group() and use that")
        if self.rank_ < 0:
            raise NotAGroupMemberError(
                f"rank {self.global_rank}: {opname} on {self.name} (global ranks "
                f"{list(self.ranks)}), but rank {self.global_rank} is not a member of that group. "
                "Only members may call its collectives and p2p operations; guard the call with "
                "`if dist.get_rank(group) >= 0:`."
            )

    def group_rank_of(self, global_rank: int, what: str, where: str) -> int:
        """Translate a global rank to a group rank, with a clear error for non-members."""
        if isinstance(global_rank, bool) or not isinstance(global_rank, int):
            if hasattr(global_rank, "__index__"):
                global_rank = global_rank.__index__()
            else:
                raise TypeError(f"{where}: {what} must be an int, "
                                f"got {type(global_rank).__name__} {global_rank!r}")
        r = self._global_to_group.get(global_rank)
        if r is None:
            raise ValueError(
                f"{where}: {what}={global_rank} is not a rank of {self.name} "
                f"(global ranks {list(self.ranks)}). Pass a global rank that is a member, or "
                f"use group_{what.split('=')[0]}= for a rank inside the group."
            )
        return r

    def check_group_rank(self, group_rank: int, what: str, where: str) -> int:
        if isinstance(group_rank, bool) or not hasattr(group_rank, "__index__"):
            raise TypeError(f"{where}: {what} must be an int, got {group_rank!r}")
        group_rank = group_rank.__index__()
        if not 0 <= group_rank < self.size_:
            raise ValueError(
                f"{where}: {what}={group_rank} is out of range for {self.name} of "
                f"size {self.size_}; valid group ranks are 0..{self.size_ - 1}."
            )
        return group_rank

    def resolve_peer(self, global_peer: Optional[int], group_peer: Optional[int], what: str,
                     where: str, allow_none: bool = False) -> Optional[int]:
        """Return the group rank of a peer given either as a global or a group rank."""
        if group_peer is not None:
            if global_peer is not None:
                raise ValueError(f"{where}: pass {what} or group_{what}, not both")
            return self.check_group_rank(group_peer, f"group_{what}", where)
        if global_peer is None:
            if allow_none:
                return None
            raise ValueError(f"{where}: {what} is required")
        if (not isinstance(global_peer, bool) and hasattr(global_peer, "__index__")
                and not 0 <= global_peer.__index__() < self.world_size):
            raise ValueError(
                f"{where}: {what}={global_peer} is out of range; valid global ranks "
                f"are 0..{self.world_size - 1} (world size {self.world_size})."
            )
        return self.group_rank_of(global_peer, what, where)

    world_size = 1  # set by the factory: size of the world the group lives in

    def where(self, opname: str, p2p: bool = False) -> str:
        """The prefix of every error message: rank, operation, group and sequence number.

        The number is the one this call gets: a call that fails its local checks is counted
        too, once its peers have heard of it (``_faults``), so the ranks' counters stay equal.
        """
        if COMM_NAME[0]:  # inside record_comm(name)
            opname = f"{opname} [{COMM_NAME[0]}]"
        if p2p:
            return f"rank {self.global_rank}: {opname} (p2p #{self.p2p_seq + 1} on {self.name})"
        return f"rank {self.global_rank}: {opname} (#{self.seq + 1} on {self.name})"

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.name} ranks={list(self.ranks)} "
                f"rank={self.rank_} backend={self.backend_name}>")


class GroupMember:
    """Sentinels as in torch: ``GroupMember.WORLD`` (the default group) and ``NON_GROUP_MEMBER``."""

    WORLD: Any = None  # replaced by the default group when it exists
    NON_GROUP_MEMBER = -100
