"""Backend-neutral pieces of the communicator layer: reduce ops, work handles, the group base.

A :class:`ProcessGroup` is one communicator: the world, or a sub-group made by ``new_group``.
Concrete subclasses (:class:`~mpitensor.distributed.backends.mpi.group.MPIGroup`,
:class:`~mpitensor.distributed.backends.nccl.NCCLGroup`) implement the operations; this module holds
what they share: rank translation, sequence numbers, error wording and the ``Work`` handle.
"""

from __future__ import annotations

import time
import weakref
from operator import attrgetter
from typing import Any, Callable, List, Optional, Sequence

from .._base import config as _config
from ..errors import DistributedTimeoutError, MpiTensorError, NotAGroupMemberError
from .health import faults as _faults
from .health import posted as _posted
from .health import watchdog as _watchdog
from .health.state import MASK, GroupHealth, Story

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

    def __del__(self) -> None:
        # dropped unfinished (``dist.isend`` never waited on): MPI still works on the request
        # and its buffers, which must not be collected before it is done (see health.posted)
        if not self._done and self._request is not None:
            _posted.keep_dropped(self._request, self._keep)

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
            _watchdog.wait(g.health, self._request, op, seq, kind, self._status, timeout, peer, tag,
                           nbytes=_watchdog.bytes_of(self._keep))
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


def abstract(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` as an operation of the backend contract: every concrete group class must
    define it (checked when the class is made, see ``ProcessGroup.__init_subclass__``)."""
    fn.__isabstractmethod__ = True  # type: ignore[attr-defined]
    return fn


def _health_field(name: str, doc: str, cast: Optional[Callable[[Any], Any]] = None) -> property:
    """A group property that is its ``GroupHealth``'s field ``name`` (read-only unless ``cast``
    is given: then set through ``cast``)."""

    def fset(group: Any, value: Any) -> None:
        setattr(group.health, name, cast(value))

    return property(attrgetter(f"health.{name}"), fset if cast else None, doc=doc)


class ProcessGroup:
    """A communicator over a set of global ranks, and the contract every backend implements.

    The operations below marked *contract* are what ``mpitensor.distributed``'s functions
    call; a backend class (:class:`~mpitensor.distributed.backends.mpi.group.MPIGroup`,
    :class:`~mpitensor.distributed.backends.nccl.NCCLGroup`) that leaves one out fails when
    the class is made, not when a program first calls it. Every collective is called by every
    member with matching arguments and in the same order as its other collectives on the group;
    ``async_op=True`` returns a :class:`Work` (the data may be read or written until it
    completes), else the call returns ``None`` once its output is in place. Ranks are global
    unless the parameter says ``group_``. A call that fails its checks raises before any
    traffic, and the group's other members hear of it (``call_guarded``).

    Attributes:
        ranks: the global ranks of the members, in group-rank order.
        rank_: this process's rank in the group (-1 when not a member).
        name: a readable name used in error messages.
        health: the group's :class:`~mpitensor.distributed.health.state.GroupHealth`.
    """

    backend_name = "undefined"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        missing = sorted(name for name in dir(cls)
                         if getattr(getattr(cls, name, None), "__isabstractmethod__", False))
        if missing:
            raise TypeError(f"{cls.__name__} does not implement the process-group contract: "
                            f"{', '.join(missing)} missing. Define each of them (a backend "
                            "without an operation may hand it to a group that has it).")

    def __init__(self, ranks: Sequence[int], my_global_rank: int, name: str,
                 timeout: float, debug: bool) -> None:
        self._set_identity(ranks, my_global_rank, name)
        self.health = GroupHealth(name=name, ranks=self.ranks, rank=self.rank_,
                                  global_rank=my_global_rank, timeout=float(timeout),
                                  stall_warn=_watchdog.stall_warn_seconds(timeout),
                                  check_bytes=_config.CHECK_BYTES)
        self.history = self.health.history  # the same ring: calls write it, reports read it
        self.unsettled: Any = None  # the Story of a local failure the peers were told of
        self.debug = debug
        self.sent = 0  # calls that reached MPI (posted traffic): a failure before it is local
        self.seq = 0  # collectives: the same count on every member
        self.p2p_seq = 0  # point-to-point calls: counted per rank

    # -- what the group shows of its health (explicitly: each read goes to ``health``) ----
    timeout = _health_field("timeout", "Seconds a call may wait for its peers before it "
                            "raises DistributedTimeoutError.", float)
    stall_warn = _health_field("stall_warn", "Seconds a call waits before a stall report is "
                               "logged.")
    broken = _health_field("broken", "Why the group is unusable (a ``Story``), or None while "
                           "it works.")
    check_bytes = _health_field("check_bytes", "Collectives of this many bytes and more check "
                                "agreement beside the data (``MPITENSOR_CHECK_BYTES``; the same "
                                "value on every rank).", int)
    fp_node = _health_field("fp_node", "The agreement check's shared slots (members on one "
                            "machine), else None.")
    notices = _health_field("notices", "Group rank -> the latest arrival notice read from it "
                            "(see ``health/watchdog``).")

    @property
    def debug(self) -> bool:
        """Debug mode (argument agreement before every collective, p2p headers)."""
        return self._debug_on

    @debug.setter
    def debug(self, value: bool) -> None:
        self._debug_on = bool(value)
        self._set_slow()

    @property
    def slow(self) -> bool:
        """True: a call takes the general path, which checks the group before any traffic.

        Set for debug mode, a failure to settle and a broken group; also true while a peer's
        fault notice waits unread (``GroupHealth.heard``: one word of shared memory, or one
        ``Iprobe`` on the notice communicator, about 0.3 µs): a peer may have broken the
        group, and this call must not complete against the request its broken call left
        posted (``health/faults``)."""
        h = self.health
        if h.slow:
            return True
        heard = h.heard
        return heard is not None and heard()

    @slow.setter
    def slow(self, value: bool) -> None:
        self.health.slow = bool(value)

    def _set_slow(self) -> None:
        # True: every call takes the general path (debug checks, or a failure to settle)
        self.slow = (self._debug_on or self.health.broken is not None
                     or self.unsettled is not None)

    # -- health: settling failures with the peers ------------------------------------------
    def check_usable(self, opname: str) -> None:
        """Settle a local failure with the peers first (``faults.settle``), read the fault
        notices that came (a peer that broke the group), then raise the group's
        PeerFailedError if a failure made it unusable."""
        h = self.health
        if self.unsettled is not None:
            story, self.unsettled = self.unsettled, None
            try:
                _faults.settle(h, story)
            finally:
                self._set_slow()
        if h.broken is None and h.heard is not None:
            _faults.heed(h)
        if h.broken is not None:
            raise _faults.error(h, h.broken, opname)

    def break_after(self, op: str, seq: int, kind: str, reason: str) -> None:
        """Call ``op`` ended while its data was posted in MPI: break the group on every
        member (``faults.break_after``)."""
        _faults.break_after(self.health, op, seq, kind, reason)

    def mark_unusable(self, opname: str, reason: str) -> None:
        """Declare the group unusable because of this rank (e.g. DDP's backward stopped
        half-way): tell the other members, whose waits end with PeerFailedError, and make
        every later call on it raise."""
        if self.rank_ >= 0 and self.health.broken is None:
            _faults.mark_broken(self.health, Story(self.global_rank, opname, self.seq, reason))

    def call_guarded(self, opname: str, body: Callable[..., Any], *args: Any,
                     **kwargs: Any) -> Any:
        """Run a collective's ``body``; if it raises before any traffic, tell the peers at
        once (see ``health/faults``) and raise; the group's next call settles it with them:
        the group stays usable only if they all failed the same call.
        """
        sent0, seq0 = self.sent, self.seq
        try:
            return body(*args, **kwargs)
        except Exception as exc:
            if self.sent == sent0 and self.rank_ >= 0 and self.health.broken is None:
                if self.seq == seq0:
                    self.count_call(opname)
                story = _faults.announce_failure(self.health, opname, self.seq, exc)
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
        self.health.timeout = float(seconds)
        self.health.stall_warn = _watchdog.stall_warn_seconds(self.health.timeout)

    def count_call(self, opname: str, arr: Any = None) -> int:
        """Count one collective that passed its checks; remember it for stall reports."""
        s = self.seq = self.seq + 1
        if isinstance(arr, (list, tuple)):
            arr = arr[0] if arr else None
        a = getattr(arr, "_data", arr)
        self.history[s & MASK] = (s, opname, getattr(a, "dtype", None),
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
        self.health.rank = -1

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

    def root_rank(self, global_root: Optional[int], group_root: Optional[int], what: str,
                  where: str) -> int:
        """The group rank of a collective's root, given as a global or a group rank; group
        rank 0 when neither is given (torch's default)."""
        if global_root is None and group_root is None:
            group_root = 0
        return self.resolve_peer(global_root, group_root, what, where)

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

    # -- contract: how a public function begins a call ---------------------------------
    @abstract
    def begin(self, opname: str) -> str:
        """Enter collective ``opname`` on this rank: check that this rank is a member and the
        group is usable, and return the prefix of the call's error messages (rank, operation,
        call number). The call is counted once its arguments pass (:meth:`count_call`)."""

    @abstract
    def begin_p2p(self, opname: str) -> str:
        """As :meth:`begin`, for a point-to-point call (numbered among this rank's own)."""

    @abstract
    def peer_rank(self, peer: Optional[int], group_peer: Optional[int], what: str, where: str,
                  allow_any: bool = False) -> int:
        """The group rank of a p2p peer, given as a global rank (``peer``) or a group rank
        (``group_peer``); with ``allow_any`` and neither given, the backend's any-source value.
        A peer that is this rank, or not a member, raises ValueError naming it."""

    @abstract
    def check_tag(self, tag: Any, where: str) -> int:
        """``tag`` as an int the backend can carry; TypeError or ValueError naming it."""

    @abstract
    def agree(self, where: str, sig: dict, error: Optional[BaseException]) -> None:
        """Debug mode: every member passes the :meth:`signature` of the call it is in and the
        error its local checks raised (or None); every member raises (its own error, or
        CollectiveMismatchError naming each rank's arguments) if any failed or they differ."""

    def signature(self, opname: str, arr: Any = None, **extra: Any) -> dict:
        """What :meth:`agree` compares: the operation, its call number, the dtype of ``arr``
        and any ``extra`` fields (shape, reduction, root, split sizes)."""
        sig = {"op": opname, "seq": self.seq}
        if arr is not None and hasattr(arr, "dtype"):
            sig["dtype"] = str(arr.dtype)
        sig.update(extra)
        return sig

    # -- contract: collectives (every member calls each, in the same order) ---------------
    @abstract
    def all_reduce(self, tensor: Any, op: Any = ReduceOp.SUM,
                   async_op: bool = False) -> Optional[Work]:
        """Reduce ``tensor`` with ``op`` over the members, in place: every member passes a
        tensor of the same shape and dtype and gets the same result."""

    @abstract
    def broadcast(self, tensor: Any, src: Optional[int] = None, async_op: bool = False,
                  group_src: Optional[int] = None) -> Optional[Work]:
        """Copy ``src``'s ``tensor`` into every member's, in place: same shape and dtype on
        every member, the same ``src`` on every member."""

    @abstract
    def reduce(self, tensor: Any, dst: Optional[int] = None, op: Any = ReduceOp.SUM,
               async_op: bool = False, group_dst: Optional[int] = None) -> Optional[Work]:
        """As :meth:`all_reduce`, but only ``dst``'s tensor receives the result (the others'
        are left as they were)."""

    @abstract
    def all_gather(self, tensor_list: Any, tensor: Any, async_op: bool = False) -> Optional[Work]:
        """Every member's ``tensor`` into every member's ``tensor_list`` (one entry per member,
        in group-rank order, each of ``tensor``'s shape and dtype)."""

    @abstract
    def all_gather_into_tensor(self, output: Any, input: Any,
                               async_op: bool = False) -> Optional[Work]:
        """Every member's ``input`` laid end to end, in group-rank order, in every member's
        ``output`` (``size`` times as many elements as ``input``, same dtype)."""

    @abstract
    def gather(self, tensor: Any, gather_list: Any = None, dst: Optional[int] = None,
               async_op: bool = False, group_dst: Optional[int] = None) -> Optional[Work]:
        """Every member's ``tensor`` into ``dst``'s ``gather_list`` (one entry per member);
        the other members pass no list."""

    @abstract
    def scatter(self, tensor: Any, scatter_list: Any = None, src: Optional[int] = None,
                async_op: bool = False, group_src: Optional[int] = None) -> Optional[Work]:
        """Entry ``i`` of ``src``'s ``scatter_list`` into member ``i``'s ``tensor``; the other
        members pass no list."""

    @abstract
    def reduce_scatter(self, output: Any, input_list: Any, op: Any = ReduceOp.SUM,
                       async_op: bool = False) -> Optional[Work]:
        """Reduce entry ``i`` of every member's ``input_list`` (one per member, each of
        ``output``'s shape and dtype) into member ``i``'s ``output``."""

    @abstract
    def reduce_scatter_tensor(self, output: Any, input: Any, op: Any = ReduceOp.SUM,
                              async_op: bool = False) -> Optional[Work]:
        """As :meth:`reduce_scatter`, with the pieces laid end to end in ``input`` (``size``
        times as many elements as ``output``)."""

    @abstract
    def all_to_all(self, output_tensor_list: Any, input_tensor_list: Any,
                   async_op: bool = False) -> Optional[Work]:
        """Entry ``j`` of member ``i``'s ``input_tensor_list`` into entry ``i`` of member
        ``j``'s ``output_tensor_list``: what ``i`` sends ``j`` is what ``j`` expects."""

    @abstract
    def all_to_all_single(self, output: Any, input: Any, output_split_sizes: Any = None,
                          input_split_sizes: Any = None,
                          async_op: bool = False) -> Optional[Work]:
        """As :meth:`all_to_all`, with the pieces as rows of one tensor: even pieces when no
        member passes split sizes, else the sizes each member passes (member ``i``'s
        ``input_split_sizes[j]`` equals member ``j``'s ``output_split_sizes[i]``)."""

    @abstract
    def barrier(self, async_op: bool = False) -> Optional[Work]:
        """Return (or complete) once every member has entered it."""

    # -- contract: point-to-point (a matching call on the peer, in the same order per tag) --
    @abstract
    def send(self, tensor: Any, dst: Optional[int], tag: int = 0,
             group_dst: Optional[int] = None, async_op: bool = False) -> Optional[Work]:
        """Send ``tensor`` to ``dst``, which receives it with a tensor of the same dtype and
        number of elements and the same ``tag``; ``async_op`` is ``isend``."""

    @abstract
    def recv(self, tensor: Any, src: Optional[int] = None, tag: int = 0,
             group_src: Optional[int] = None, async_op: bool = False) -> Any:
        """Receive into ``tensor`` from ``src`` (any member when None); return the sender's
        global rank, or with ``async_op`` (``irecv``) a :class:`Work` whose
        ``source_rank()`` says it."""

    # -- contract: objects (pickled; called after begin/begin_p2p, checks and count) ------
    @abstract
    def bcast_obj(self, obj: Any, root: int, op: str = "broadcast_object_list") -> Any:
        """``root``'s (group rank) ``obj`` on every member; the others pass anything."""

    @abstract
    def allgather_obj(self, obj: Any, op: str = "all_gather_object") -> list:
        """Every member's ``obj``, in group-rank order, on every member."""

    @abstract
    def gather_obj(self, obj: Any, root: int, op: str = "gather_object") -> Optional[list]:
        """Every member's ``obj`` in group-rank order on ``root``; None on the others."""

    @abstract
    def scatter_obj(self, objs: Optional[list], root: int,
                    op: str = "scatter_object_list") -> Any:
        """Entry ``i`` of ``root``'s ``objs`` (one per member) on member ``i``."""

    @abstract
    def send_obj(self, obj: Any, peer: int, tag: int, op: str = "send_object") -> None:
        """Send ``obj`` to group rank ``peer``, which calls :meth:`recv_obj` with ``tag``."""

    @abstract
    def recv_obj(self, peer: int, tag: int, op: str = "recv_object") -> "tuple[Any, int]":
        """Receive an object from group rank ``peer`` (or any); return it and the sender's
        global rank."""

    # -- contract: groups ------------------------------------------------------------------
    @abstract
    def split(self, ranks: List[int], name: str, timeout: Optional[float] = None) -> Any:
        """A sub-group of global ``ranks``: called by every member of this group with the same
        ``ranks``; non-members of the sub-group get a group in which they have rank -1."""

    @abstract
    def free(self) -> None:
        """Release the group's communicators; every later call on it raises."""


class GroupMember:
    """Sentinels as in torch: ``GroupMember.WORLD`` (the default group) and ``NON_GROUP_MEMBER``."""

    WORLD: Any = None  # replaced by the default group when it exists
    NON_GROUP_MEMBER = -100
