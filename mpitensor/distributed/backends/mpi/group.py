"""The MPI process group: every torch.distributed operation on mpi4py's buffer methods.

Collectives map one-to-one onto MPI collectives (``Allreduce``, ``Iallreduce``, ``Allgatherv``,
...), point-to-point onto ``Send``/``Recv``/``Isend``/``Irecv``. Only the ``*_object`` functions
use mpi4py's pickle methods. CuPy arrays go to MPI directly where MPI is CUDA-aware and through
host copies otherwise.
"""


from __future__ import annotations

import functools
import operator
import secrets
import time
from typing import Any, Callable, List, Optional, Sequence

from mpi4py import MPI

from ...._base.config import OFF_BYTES
from ....errors import (
    CollectiveMismatchError,
    MpiTensorError,
    PeerFailedError,
)
from ...health import faults as _faults
from ...health import fingerprint as _fp
from ...health import watchdog as W
from ...health.state import MASK as _MASK
from ...process_group import COMM_NAME, ProcessGroup, Work
from . import hierarchical as _hier
from . import shm_coll as _shmc
from . import shm_tiny as _tiny
from .collectives import Collectives
from .objects import ObjectCollectives
from .p2p import PointToPoint

__all__ = ["MPIGroup"]

_ANY_SOURCE = MPI.ANY_SOURCE
_wait = W.wait


class MPIGroup(Collectives, PointToPoint, ObjectCollectives, ProcessGroup):
    """A process group backed by an MPI communicator (``None`` on non-member ranks).

    The operations live in three mixins by kind (``collectives.py``, ``p2p.py``,
    ``objects.py``); this class holds the communicators and the plumbing every call shares:
    beginning a call, running its MPI request to the end, the agreement check beside it and,
    in debug mode, the agreement of every rank's arguments before it.
    """
    backend_name = "mpi"

    def __init__(self, comm: Optional[MPI.Comm], ranks: Sequence[int], my_global_rank: int,
                 name: str, timeout: float, debug: bool, world_size: int) -> None:
        super().__init__(ranks, my_global_rank, name, timeout, debug)
        self.comm = comm
        self.world_size = world_size
        self.tag_ub = int(comm.Get_attr(MPI.TAG_UB)) if comm is not None else 0
        self.verdicts: dict = {}  # debug mode: (receiver, my p2p seq) -> receiver's verdict
        self.opname = ""  # the collective being prepared (set by begin)
        self._gather_buf = None  # all_gather's flat receive buffer, kept for the next call
        # group rank == global rank: p2p peers need no translation
        self.identity = self.ranks == tuple(range(self.size_))
        if comm is not None:
            self._equip_health(comm)
            self.shm_min = _shmc.floor(self)  # shared-memory collectives: from what size
            self.shm_ar_min = self.shm_min  # (all_reduce's: lowered by the board, below)
            self.tiny = _tiny.make(self)  # small calls through a shared board, where it can
            self.hier = _hier.initial(self)  # may it span nodes (hierarchical.py)

    def _equip_health(self, comm: MPI.Comm) -> None:
        """Give the group's health what the members make together (collective: every member
        runs it): the private communicators, the notice tags, the shared flag that says a
        member broke the group, and the agreement check's slots or reductions."""
        h = self.health
        h.comm = comm
        # arrival notices and debug verdicts on one, debug-mode p2p headers on the other, so
        # neither can ever match the user's messages
        h.diag = comm.Dup()
        h.hdr = comm.Dup()
        # The notice tags carry this group's incarnation, drawn by its rank 0. A notice that
        # reaches a rank after it destroyed the group waits unmatched in MPI's queue, and
        # MPICH gives a later communicator the same context id: without the incarnation, a
        # later group read a dead group's "broken" notice as its own.
        # (at least 8: the tag_base itself tags the list-form all_gather's data, gather_p2p.py,
        # and the rendezvous of new groups is 4)
        span = max(2, self.tag_ub // 4 - 1)
        draw = secrets.randbelow(span - 1) + 2 if comm.Get_rank() == 0 else None
        h.tag_base = 4 * int(comm.bcast(draw, root=0))
        # asked by every call on its way in (ProcessGroup.slow): has a member broken the
        # group? A word of shared memory where the members share a machine, else a probe for
        # a fault notice (partials: no Python frame)
        h.fault_mm = _faults.shared_flag(comm)
        if h.fault_mm is not None:
            h.fault_word = memoryview(h.fault_mm).cast("q")
            h.heard = functools.partial(operator.getitem, h.fault_word, 0)
        elif comm.Get_size() > 1:
            h.heard = functools.partial(h.diag.Iprobe, _ANY_SOURCE, _faults.FAULT_TAG + h.tag_base)
        # the agreement check of large calls: shared slots where the members share a machine,
        # else a persistent reduction per call (fingerprint)
        h.fp_node = _fp.NodeCheck.create(comm) if comm.Get_size() > 1 else None
        h.fp_pool = _fp.Pool(h.diag) if h.fp_node is None else None
        _faults.track(h)  # its peers hear of it if this process exits mid-job

    # ------------------------------------------------------------------ plumbing
    def begin(self, opname: str) -> str:
        """Check membership; return the error prefix. The call is counted once checked."""
        if self.rank_ < 0:
            self.require_member(opname)
        if self.slow:  # debug mode, or a failure to settle or report (check_usable)
            self.check_usable(opname)
        self.opname = opname
        if COMM_NAME[0]:  # inside record_comm(name): messages carry the name
            opname = f"{opname} [{COMM_NAME[0]}]"
        return f"rank {self.global_rank}: {opname} (#{self.seq + 1} on {self.name})"

    def begin_p2p(self, opname: str) -> str:
        self.require_member(opname)
        self.check_usable(opname)
        return self.where(opname, p2p=True)

    def _mpi_error(self, where: str, exc: BaseException) -> BaseException:
        if isinstance(exc, MPI.Exception):
            text = exc.Get_error_string().strip().splitlines()[-1].strip()
            return MpiTensorError(f"{where}: MPI error: {text}")
        return exc

    def _run(self, where: str, nonblocking: Callable[[], Any],
             finish: Optional[Callable[[], None]], async_op: bool, result: Any = None,
             keep: Any = None, check: Optional[tuple] = None,
             splits: Optional[tuple] = None) -> Optional[Work]:
        """Start the counted collective (the last one ``count_call`` recorded) and finish it.

        Blocking calls too run as the non-blocking MPI operation plus a bounded wait: as fast
        as the blocking call for small messages on MPICH, and it can time out. ``check``:
        ``(array, reduce op, global root)`` for the agreement check of large calls
        (``_fingerprint``), which debug mode replaces with its own. ``splits``: ``(send counts,
        receive counts, what names the receive counts, elements per row)`` of an all-to-all
        whose pieces have sizes of their own, and their dtype, checked against the peers'
        beside the data (shared slots: ``NodeCheck.post_splits``, else ``_fingerprint.Splits``;
        debug mode checks them before).
        """
        h = self.health
        s = self.seq
        op = self.history[s & _MASK][1]
        chk = None
        if check is not None and not self.debug:
            chk = self._fp_first(s, op, check[0], check[1], check[2], keep)
        try:
            req = nonblocking()
        except MPI.Exception as exc:
            raise self._mpi_error(where, exc) from exc
        self.sent += 1
        if chk is not None:
            req = _fp.Checked(h, req, *chk)
        elif splits is not None and not self.debug and h.check_bytes < OFF_BYTES:
            node = h.fp_node
            if node is not None and node.board >= 0:  # shared slots and a board
                h.fp_tok = node.post_splits(s, op, *splits, keep)
            else:
                req = _fp.Splits(h, req, op, s, *splits, keep)
        if async_op:
            return Work(self._fp_async(req, s), finish, result, describe=lambda: where,
                        keep=keep, group=self, info=(op, s, "coll", None, None))
        try:
            if not req.Test():
                _wait(h, req, op, s, nbytes=W.bytes_of(keep))
        except MPI.Exception as exc:
            self._fp_failed(exc, op, s)
            raise self._mpi_error(where, exc) from exc
        if h.fp_tok is not None:
            self._fp_settle(op, s)
        if finish is not None:
            finish()
        return None

    def _fp_first(self, s: int, op: str, arr: Any, reduce: Any, root: int,
                  keep: Any) -> Optional[tuple]:
        """Begin the agreement check of call ``s`` (``arr`` at least ``check_bytes`` long),
        before its data is posted. With the group's shared slots, post this rank's
        fingerprint now (compared once the data is done: ``fp_tok`` says which call awaits
        that) and return None: every member whose data reached this rank posted its own
        before its data, so for all_reduce, all_gather, reduce_scatter and all_to_all the
        comparison finds every slot filled and never waits (posted after the data, a peer
        descheduled between its two steps sent this rank to sleep in ``_fp_settle``).
        Without slots, return the arguments of the reduction check (``_fp.Checked``) that
        wraps the data's request."""
        h = self.health
        if arr.nbytes < h.check_bytes:
            return None
        node = h.fp_node
        if node is None:
            return (op, s, arr, reduce, root, keep)
        h.fp_tok = node.post(s, op, arr, reduce, root, keep)
        return None

    def _fp_async(self, req: Any, s: int) -> Any:
        """Async call ``s``'s request, made to settle its fingerprint too (shared slots)."""
        h = self.health
        tok = h.fp_tok
        if tok is None:
            return req
        h.fp_tok = None
        if tok[0] != s:  # left by an earlier call that raised while it waited: not this one's
            return req
        pending = h.fp_async
        if len(pending) >= _fp.RING:  # never waited for: past the ring, they cannot settle
            pending.pop(next(iter(pending)))
        pending[s] = tok
        return _fp.NodeChecked(h, req, tok)

    def _fp_settle(self, op: str, s: int) -> None:
        """Blocking call ``s``'s data is done: compare the slots, waiting (bounded by the
        group's timeout) for members that have not posted theirs yet."""
        h = self.health
        tok = h.fp_tok
        h.fp_tok = None  # (also when that wait raises)
        if tok[0] != s:  # left by an earlier call that raised while it waited: not this one's
            return
        if not h.fp_node.settle(tok, h):
            h.fp_tok = tok  # (for the slow tick's look at the slots: fault_in_wait)
            _wait(h, _fp.Settling(h, tok), op, s)
            h.fp_tok = None

    def _fp_failed(self, exc: BaseException, op: str, s: int) -> None:
        """MPI failed collective ``s`` after it was posted: the members may be anywhere in it,
        so the group breaks (after the agreement check's explanation, where it has one)."""
        try:
            self._fp_explain(exc, s)
        finally:
            text = exc.Get_error_string().strip().splitlines()[-1].strip() \
                if isinstance(exc, MPI.Exception) else str(exc)
            self.break_after(op, s, "coll", f"MPI error: {text}")

    def _fp_explain(self, exc: BaseException, s: int) -> None:
        """MPI failed a checked call (MPICH: ``MPIDU_Sched_progress_state``...): where another
        member's fingerprint for it differs, raise that mismatch instead, which says why."""
        h = self.health
        tok = h.fp_tok
        h.fp_tok = None
        if tok is None or tok[0] != s:
            return
        deadline = time.monotonic() + 0.1  # a member may be about to post its fingerprint
        try:
            while not h.fp_node.settle(tok, h) and time.monotonic() < deadline:
                time.sleep(1e-4)
        except CollectiveMismatchError as mismatch:
            raise mismatch from exc

    def agree(self, where: str, sig: dict, error: Optional[BaseException]) -> None:
        """Debug mode: check that every rank entered this call with matching arguments."""
        sig = dict(sig)
        sig["error"] = None if error is None else f"{type(error).__name__}: {error}"
        self.sent += 1  # every rank takes part in the exchange: no fault settling after it
        sigs = self.allgather_obj(sig, f"{sig.get('op', 'collective')} (debug check)")
        problems = []
        if any(s["error"] for s in sigs):
            problems.append("argument errors")
        common = ("op", "seq", "dtype", "reduce", "root", "shape", "splits")
        for key in common:
            vals = [s.get(key) for s in sigs]
            if any(v != vals[0] for v in vals):
                problems.append(f"different {key}")
        sends = [s.get("send") for s in sigs]
        recvs = [s.get("recv") for s in sigs]
        n = len(sigs)
        for i in range(n):
            for j in range(n):
                a = sends[i][j] if sends[i] is not None else None
                b = recvs[j][i] if recvs[j] is not None else None
                if a is not None and b is not None and a != b:
                    problems.append(f"rank {self.ranks[i]} sends {a} elements to rank "
                                    f"{self.ranks[j]}, which expects {b}")
        if not problems:
            return
        if error is not None:
            raise error
        lines = []
        for g, s in zip(self.ranks, sigs):
            fields = ", ".join(f"{k}={s[k]}" for k in ("op", "seq", "dtype", "shape", "reduce",
                                                          "root", "splits")
                               if s.get(k) is not None)
            if s["error"]:
                fields += f", error={s['error']}"
            lines.append(f"  rank {g}: {fields}")
        raise CollectiveMismatchError(
            f"{where}: ranks disagree ({'; '.join(dict.fromkeys(problems))}):\n"
            + "\n".join(lines)
            + "\nEvery rank must make the same collective calls in the same order, with the same "
            "op, dtype and shape (and matching list sizes)."
        )

    def _debug(self, where: str, sig: dict, prepare: Callable[[], Any]) -> Any:
        error = None
        prepared = None
        try:
            prepared = prepare()
        except (TypeError, ValueError) as exc:
            error = exc
        self.agree(where, sig, error)
        return prepared

    def signature(self, opname: str, arr: Any = None, **extra: Any) -> dict:
        sig = {"op": opname, "seq": self.seq}
        if arr is not None and hasattr(arr, "dtype"):
            sig["dtype"] = str(arr.dtype)
        sig.update(extra)
        return sig

    def _maybe_debug(self, where: str, sig_fn: Callable[[], dict],
                     prepare: Callable[[], Any]) -> Any:
        """Check the arguments (and, in debug mode, agreement); count the call.

        With debug off a call that fails its local checks is not counted, so one rank's
        argument error cannot make its sequence numbers drift from the others'. In debug mode
        every rank exchanges signatures, so every rank counts the call.
        """
        op = self.opname
        if not self.debug:
            prepared = prepare()
            self.count_call(op, prepared[0])
            return prepared
        s = self.count_call(op)
        try:
            sig = sig_fn()
        except Exception:  # arguments too broken to describe: prepare() will say why
            sig = {"op": op, "seq": self.seq}
        prepared = self._debug(where, sig, prepare)
        self._count_fix(s, op, prepared[0])
        return prepared

    def _count_fix(self, s: int, op: str, arr: Any) -> None:
        if isinstance(arr, (list, tuple)):
            arr = arr[0] if arr else None
        self.history[s & _MASK] = (s, op, getattr(arr, "dtype", None),
                                   getattr(arr, "shape", None))

    # ------------------------------------------------------------------ groups
    def split(self, ranks: List[int], name: str,
              timeout: Optional[float] = None) -> "MPIGroup":
        """Make a sub-group of global ``ranks`` (only members touch MPI).

        ``Create_group`` blocks until every member calls it, so the members first meet in a
        timed rendezvous (``_watchdog.rendezvous``): a member that never comes is named in a
        DistributedTimeoutError after ``timeout`` (default: this group's) seconds.
        """
        comm = None
        if self.global_rank in ranks:
            try:
                self.check_usable("new_group")
            except PeerFailedError:
                # a broken parent still makes groups: the rendezvous and MPI's constructor
                # use tags of their own, which the calls left posted on it cannot match
                if self.health.broken is None:
                    raise
            members = [self._global_to_group[r] for r in ranks]
            W.rendezvous(self.health, members, ("new_group", tuple(ranks)),
                         self.timeout if timeout is None else timeout, f"new_group({ranks})")
            sub = self.comm.Get_group().Incl(members)
            comm = self.comm.Create_group(sub)
            sub.Free()
        return MPIGroup(comm, ranks, self.global_rank, name, self.timeout, self.debug,
                        self.world_size)

    def free(self) -> None:
        _shmc.free(self)  # its collectives' segment, if it made one
        _tiny.free(self)  # its small calls' board
        _hier.free(self)  # its node and cross-node sub-groups, if it made them
        self.free_persistent()  # its small calls' persistent requests (persistent.py)
        h = self.health
        if h.fp_pool is not None:
            h.fp_pool.free()
        if h.fp_node is not None:
            h.fp_node.close()
            h.fp_node = None
        for comm in (self.comm, h.diag, h.hdr):
            if comm is not None and comm != MPI.COMM_NULL:
                comm.Free()
        self.comm = h.comm = h.diag = h.hdr = None
        h.notice_reqs = []
        h.heard = None
        word, h.fault_word = h.fault_word, None
        if word is not None:
            word.release()
            h.fault_mm.close()
            h.fault_mm = None
        _faults.forget(h)
        self.identity = False  # no fast path either: every call meets require_member
        self._mark_destroyed()

