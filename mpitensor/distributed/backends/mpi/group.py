"""The MPI process group: every torch.distributed operation on mpi4py's buffer methods.

Collectives map one-to-one onto MPI collectives (``Allreduce``, ``Iallreduce``, ``Allgatherv``,
...), point-to-point onto ``Send``/``Recv``/``Isend``/``Irecv``. Only the ``*_object`` functions
use mpi4py's pickle methods. CuPy arrays go to MPI directly where MPI is CUDA-aware and through
host copies otherwise.
"""

from __future__ import annotations

import functools
import operator
import pickle
import re
import secrets
import time
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
from mpi4py import MPI

from ...._base.config import OFF_BYTES
from ....backend import array_module
from ....errors import (
    CollectiveMismatchError,
    MessageMismatchError,
    MessageTruncatedError,
    MpiTensorError,
    PeerFailedError,
)
from ....tensor import Tensor
from . import buffers as B
from ...health import faults as _faults
from ...health import fingerprint as _fp
from ...health import watchdog as W
from ...health.watchdog import MASK as _MASK
from ...process_group import COMM_NAME, ProcessGroup, ReduceOp, Work, _Completed

__all__ = ["MPIGroup"]

_IN_PLACE = MPI.IN_PLACE
_MOVE = B.MOVE_TYPES
_ANY_SOURCE = MPI.ANY_SOURCE
_SUM = ReduceOp.SUM
_wait = W.wait
_I64 = MPI.INT64_T
_BYTE = MPI.BYTE
_HDR_LEN = 16  # debug-mode p2p header: magic, sender's p2p seq, dtype code, nbytes, ndim, shape
_HDR_MAGIC = 0x6D7074  # "mpt"
_MAX_DIMS = _HDR_LEN - 5
_DTYPES = list(B.MOVE_TYPES)
_DTYPE_CODE = {dt: i for i, dt in enumerate(_DTYPES)}

# op -> {dtype: (MPI type, MPI op)} for reductions with no view, upcast or AVG step: the fast
# path of all_reduce (nested dicts: two identity-hash lookups, no tuple to build)
_FAST: dict = {op: {} for op in ReduceOp.members.values()}
for _dt in B.MOVE_TYPES:
    for _op in ReduceOp.members.values():
        _p = B._plan(_dt, _op)
        if not isinstance(_p, str) and _p.view is None and _p.upcast is None and not _p.average:
            _FAST[_op][_dt] = (_p.mpi_type, _p.mpi_op)
del _dt, _op, _p


def _fast_op(op: Any, dtype: Any) -> Any:
    """``(MPI datatype, MPI op)`` when ``op`` on ``dtype`` needs no plan (see _FAST), else None."""
    try:
        return _FAST[op].get(dtype)
    except (KeyError, TypeError):  # not a ReduceOp (a name, an int, unhashable): the general
        return None                # path coerces it or says why not


def _no_splits(splits: Any) -> bool:
    """``None`` or an empty list: split dimension 0 evenly (torch's convention)."""
    return splits is None or (isinstance(splits, (list, tuple)) and len(splits) == 0)


def _counts_displs(counts: Sequence[int]) -> "tuple[list, list]":
    displs, total = [], 0
    for c in counts:
        displs.append(total)
        total += c
    return list(counts), displs


def _guarded(opname: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A collective's general path: a failure before any traffic is settled with the peers
    (``ProcessGroup.call_guarded``, ``_faults``). Fast paths never raise before posting."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(self: "MPIGroup", *args: Any, **kwargs: Any) -> Any:
            return self.call_guarded(opname, fn, self, *args, **kwargs)
        return run
    return wrap


class MPIGroup(ProcessGroup):
    """A process group backed by an MPI communicator (``None`` on non-member ranks)."""

    backend_name = "mpi"
    fault_mm: Any = None  # the shared flag's segment (_faults.shared_flag), where there is one
    fault_word: Any = None  # its word: nonzero once a member broke the group

    def __init__(self, comm: Optional[MPI.Comm], ranks: Sequence[int], my_global_rank: int,
                 name: str, timeout: float, debug: bool, world_size: int) -> None:
        super().__init__(ranks, my_global_rank, name, timeout, debug)
        self.comm = comm
        self.world_size = world_size
        self.tag_ub = int(comm.Get_attr(MPI.TAG_UB)) if comm is not None else 0
        # private communicators (collective to create: every member runs this): arrival
        # notices and debug verdicts on one, debug-mode p2p headers on the other, so neither
        # can ever match the user's messages
        self.diag = comm.Dup() if comm is not None else None
        self.hdr = comm.Dup() if comm is not None else None
        if comm is not None:
            # The notice tags carry this group's incarnation, drawn by its rank 0. A notice
            # that reaches a rank after it destroyed the group waits unmatched in MPI's queue,
            # and MPICH gives a later communicator the same context id: without the
            # incarnation, a later group read a dead group's "broken" notice as its own.
            span = max(1, self.tag_ub // 4 - 1)
            draw = secrets.randbelow(span) + 1 if comm.Get_rank() == 0 else None
            self.tag_base = 4 * int(comm.bcast(draw, root=0))
            # asked by every call on its way in (ProcessGroup.slow): has a member broken the
            # group? A word of shared memory where the members share a machine, else a probe
            # for a fault notice (partials: no Python frame)
            self.fault_mm = _faults.shared_flag(comm)
            if self.fault_mm is not None:
                self.fault_word = memoryview(self.fault_mm).cast("q")
                self._heard = functools.partial(operator.getitem, self.fault_word, 0)
            elif comm.Get_size() > 1:
                self._heard = functools.partial(self.diag.Iprobe, _ANY_SOURCE,
                                                _faults.FAULT_TAG + self.tag_base)
        # the agreement check of large calls: shared slots where the members share a machine,
        # else a persistent reduction per call (_fingerprint)
        self.fp_node = (_fp.NodeCheck.create(comm)
                        if comm is not None and comm.Get_size() > 1 else None)
        self.fp_pool = _fp.Pool(self.diag) if comm is not None and self.fp_node is None \
            else None
        self.fp_tok: Optional[tuple] = None  # the blocking checked call in progress (slots)
        self.fp_async: dict = {}  # call number -> token of an async checked call not settled
        self.verdicts: dict = {}  # debug mode: (receiver, my p2p seq) -> receiver's verdict
        self.opname = ""  # the collective being prepared (set by _begin)
        # group rank == global rank: p2p peers need no translation
        self.identity = self.ranks == tuple(range(self.size_))
        if comm is not None:
            _faults.track(self)  # its peers hear of it if this process exits mid-job

    # ------------------------------------------------------------------ plumbing
    def _begin(self, opname: str) -> str:
        """Check membership; return the error prefix. The call is counted once checked."""
        if self.rank_ < 0:
            self.require_member(opname)
        if self.slow:  # debug mode, or a failure to settle or report (check_usable)
            self.check_usable(opname)
        self.opname = opname
        if COMM_NAME[0]:  # inside record_comm(name): messages carry the name
            opname = f"{opname} [{COMM_NAME[0]}]"
        return f"rank {self.global_rank}: {opname} (#{self.seq + 1} on {self.name})"

    def _begin_p2p(self, opname: str) -> str:
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
        """Start the counted collective (the last one ``_count`` recorded) and finish it.

        Blocking calls too run as the non-blocking MPI operation plus a bounded wait: as fast
        as the blocking call for small messages on MPICH, and it can time out. ``check``:
        ``(array, reduce op, global root)`` for the agreement check of large calls
        (``_fingerprint``), which debug mode replaces with its own. ``splits``: ``(send counts,
        receive counts, what names the receive counts, elements per row)`` of an all-to-all
        whose pieces have sizes of their own, and their dtype, checked against the peers'
        beside the data (shared slots: ``NodeCheck.post_splits``, else ``_fingerprint.Splits``;
        debug mode checks them before).
        """
        s = self.seq
        op = self.history[s & _MASK][1]
        try:
            req = nonblocking()
        except MPI.Exception as exc:
            raise self._mpi_error(where, exc) from exc
        self.sent += 1
        if check is not None and not self.debug and check[0].nbytes >= self.check_bytes:
            req = self._fp_check(req, s, op, check[0], check[1], check[2], keep)
        elif splits is not None and not self.debug and self.check_bytes < OFF_BYTES:
            node = self.fp_node
            if node is not None and node.board >= 0:  # shared slots and a board
                self.fp_tok = node.post_splits(s, op, *splits, keep)
            else:
                req = _fp.Splits(self, req, op, s, *splits, keep)
        if async_op:
            return Work(self._fp_async(req, s), finish, result, describe=lambda: where,
                        keep=keep, group=self, info=(op, s, "coll", None, None))
        try:
            if not req.Test():
                _wait(self, req, op, s)
        except MPI.Exception as exc:
            self._fp_failed(exc, op, s)
            raise self._mpi_error(where, exc) from exc
        if self.fp_tok is not None:
            self._fp_settle(op, s)
        if finish is not None:
            finish()
        return None

    def _fp_check(self, req: Any, s: int, op: str, arr: Any, reduce: Any, root: int,
                  keep: Any) -> Any:
        """Check agreement on call ``s``, whose data operation ``req`` was just posted: post
        this rank's fingerprint to the group's shared slots (compared once the data is done:
        ``fp_tok`` says which call awaits that), or, without slots, wrap ``req`` in a
        reduction check (``_fingerprint``)."""
        node = self.fp_node
        if node is None:
            return _fp.Checked(self, req, op, s, arr, reduce, root, keep)
        self.fp_tok = node.post(s, op, arr, reduce, root, keep)
        return req

    def _fp_async(self, req: Any, s: int) -> Any:
        """Async call ``s``'s request, made to settle its fingerprint too (shared slots)."""
        tok = self.fp_tok
        if tok is None:
            return req
        self.fp_tok = None
        if tok[0] != s:  # left by an earlier call that raised while it waited: not this one's
            return req
        pending = self.fp_async
        if len(pending) >= _fp.RING:  # never waited for: past the ring, they cannot settle
            pending.pop(next(iter(pending)))
        pending[s] = tok
        return _fp.NodeChecked(self, req, tok)

    def _fp_settle(self, op: str, s: int) -> None:
        """Blocking call ``s``'s data is done: compare the slots, waiting (bounded by the
        group's timeout) for members that have not posted theirs yet."""
        tok = self.fp_tok
        self.fp_tok = None  # (also when that wait raises)
        if tok[0] != s:  # left by an earlier call that raised while it waited: not this one's
            return
        if not self.fp_node.settle(tok, self):
            self.fp_tok = tok  # (for the slow tick's look at the slots: fault_in_wait)
            _wait(self, _fp.Settling(self, tok), op, s)
            self.fp_tok = None

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
        tok = self.fp_tok
        self.fp_tok = None
        if tok is None or tok[0] != s:
            return
        deadline = time.monotonic() + 0.1  # a member may be about to post its fingerprint
        try:
            while not self.fp_node.settle(tok, self) and time.monotonic() < deadline:
                time.sleep(1e-4)
        except CollectiveMismatchError as mismatch:
            raise mismatch from exc

    def fault_in_wait(self, kind: str, seq: int, op: str, peer: Optional[int],
                      since: float) -> Any:
        tok = self.fp_tok
        if tok is None or tok[0] != seq:
            tok = self.fp_async.get(seq)
        if tok is not None and kind == "coll" and tok[0] == seq:
            # a mismatch MPI may never complete: raise it now, and before any notice of a peer
            # that saw it first (which would say less: PeerFailedError)
            self.fp_node.peek(tok, self)
        return super().fault_in_wait(kind, seq, op, peer, since)

    def _agree(self, where: str, sig: dict, error: Optional[BaseException]) -> None:
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
        self._agree(where, sig, error)
        return prepared

    def _sig(self, opname: str, arr: Any = None, **extra: Any) -> dict:
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
            self._count(op, prepared[0])
            return prepared
        s = self._count(op)
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

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, tensor: Any, op: Any = _SUM, async_op: bool = False) -> Optional[Work]:
        arr = tensor._data if type(tensor) is Tensor else tensor
        if type(arr) is np.ndarray and not self.slow and self.rank_ >= 0:
            fast = _fast_op(op, arr.dtype)
            if fast is not None:
                flags = arr.flags
                if flags.c_contiguous and flags.writeable:
                    s = self._fast_count("all_reduce", arr)
                    req = self.comm.Iallreduce(_IN_PLACE, [arr, fast[0]], fast[1])
                    if arr.nbytes >= self.check_bytes:
                        node = self.fp_node
                        if node is not None:  # shared slots: post this rank's fingerprint
                            self.fp_tok = node.post(s, "all_reduce", arr, op, -1, arr)
                        else:
                            req = _fp.Checked(self, req, "all_reduce", s, arr, op, -1, arr)
                    return self._fast_finish(req, "all_reduce", s, [tensor], arr, async_op)
        return self._all_reduce(tensor, op, async_op)

    # Fast paths: a contiguous NumPy array (or a Tensor holding one) of a dtype MPI moves as
    # is, plain int ranks on a group whose ranks are the world's, debug off. Such a call needs
    # none of the checks, staging or plans of the general path, which it otherwise takes (and
    # which raises the errors). Each costs about as much as the mpi4py call itself.
    def _fast_count(self, op: str, arr: Any) -> int:
        s = self.seq = self.seq + 1
        self.history[s & _MASK] = (s, op, arr.dtype, arr.shape)
        return s

    def _fast_finish(self, req: Any, op: str, s: int, tensors: list, keep: Any,
                     async_op: bool) -> Optional[Work]:
        if async_op:
            return Work(self._fp_async(req, s), None, tensors, keep=keep, group=self,
                        describe=lambda: f"rank {self.global_rank}: {op} (#{s} on {self.name})",
                        info=(op, s, "coll", None, None))
        try:
            if not req.Test():
                _wait(self, req, op, s)
        except MPI.Exception as exc:
            self._fp_failed(exc, op, s)
            raise self._mpi_error(f"rank {self.global_rank}: {op} (#{s} on {self.name})",
                                  exc) from exc
        tok = self.fp_tok
        if tok is not None:
            if tok[0] == s and self.fp_node.settle(tok, self):
                self.fp_tok = None  # every member agreed (the common case, without a call)
            else:
                self._fp_settle(op, s)
        return None

    def _fast_root(self, root: Any, group_root: Any) -> bool:
        return (type(root) is int and group_root is None and self.identity and not self.slow
                and 0 <= root < self.size_)

    @staticmethod
    def _fast_pair(out: Any, inp: Any) -> Any:
        """The MPI datatype when ``out`` and ``inp`` qualify together (same dtype, ``out``
        writable, no shared memory: the in-place idioms take the general path), else None."""
        if (type(out) is np.ndarray and type(inp) is np.ndarray and out.dtype == inp.dtype
                and out.ndim and inp.ndim and out.flags.c_contiguous and out.flags.writeable
                and inp.flags.c_contiguous and not np.may_share_memory(out, inp)):
            return _MOVE.get(inp.dtype)
        return None

    @_guarded("all_reduce")
    def _all_reduce(self, tensor: Any, op: Any, async_op: bool) -> Optional[Work]:
        where = self._begin("all_reduce")

        def prepare() -> Any:
            arr = B.unwrap(tensor, "tensor", where)
            B.check_dtype(arr, "tensor", where)
            B.check_writable(arr, "tensor", where)
            plan = B.reduce_plan(arr.dtype, B.coerce_op(op, where), where)
            return arr, plan

        arr, plan = self._maybe_debug(
            where, lambda: self._sig("all_reduce", B.unwrap(tensor, "tensor", where),
                                     shape=tuple(B.unwrap(tensor, "tensor", where).shape),
                                     reduce=str(op)), prepare)
        buf, write_back = B.stage_out(arr)
        rbuf, narrow = B.apply_plan_out(buf, plan)
        avg = B.divider(rbuf, self.size_) if plan.average else None
        spec = [rbuf, plan.mpi_type]
        comm, mop = self.comm, plan.mpi_op
        return self._run(where, lambda: comm.Iallreduce(_IN_PLACE, spec, mop),
                         B.chain(avg, narrow, write_back), async_op, [tensor], keep=spec,
                         check=(arr, B.coerce_op(op, where), -1))

    def broadcast(self, tensor: Any, src: Optional[int] = None, async_op: bool = False,
                  group_src: Optional[int] = None) -> Optional[Work]:
        arr = tensor._data if type(tensor) is Tensor else tensor
        if (type(arr) is np.ndarray and self.rank_ >= 0 and self._fast_root(src, group_src)
                and arr.flags.c_contiguous and (arr.flags.writeable or src == self.rank_)):
            mt = _MOVE.get(arr.dtype)
            if mt is not None:
                s = self._fast_count("broadcast", arr)
                req = self.comm.Ibcast([arr, mt], src)
                if arr.nbytes >= self.check_bytes:
                    node = self.fp_node
                    if node is not None:  # shared slots: post this rank's fingerprint
                        self.fp_tok = node.post(s, "broadcast", arr, None, src, arr)
                    else:
                        req = _fp.Checked(self, req, "broadcast", s, arr, None, src, arr)
                return self._fast_finish(req, "broadcast", s, [tensor], arr, async_op)
        return self._broadcast(tensor, src, async_op, group_src)

    @_guarded("broadcast")
    def _broadcast(self, tensor: Any, src: Optional[int], async_op: bool,
                   group_src: Optional[int]) -> Optional[Work]:
        where = self._begin("broadcast")
        root = self.resolve_peer(src, group_src, "src", where)

        def prepare() -> Any:
            arr = B.unwrap(tensor, "tensor", where)
            mt = B.check_dtype(arr, "tensor", where)
            if self.rank_ != root:
                B.check_writable(arr, "tensor", where)
            return arr, mt

        arr, mt = self._maybe_debug(
            where, lambda: self._sig("broadcast", B.unwrap(tensor, "tensor", where),
                                     shape=tuple(B.unwrap(tensor, "tensor", where).shape),
                                     root=self.ranks[root]), prepare)
        if self.rank_ == root:
            buf, write_back = B.stage_in(arr), None
        else:
            buf, write_back = B.stage_out(arr)
        spec = [buf, mt]
        comm = self.comm
        return self._run(where, lambda: comm.Ibcast(spec, root),
                         write_back, async_op, [tensor], keep=spec,
                         check=(arr, None, self.ranks[root]))

    def reduce(self, tensor: Any, dst: Optional[int] = None, op: Any = _SUM,
               async_op: bool = False, group_dst: Optional[int] = None) -> Optional[Work]:
        arr = tensor._data if type(tensor) is Tensor else tensor
        root = 0 if dst is None and group_dst is None else dst
        if (type(arr) is np.ndarray and self.rank_ >= 0 and self._fast_root(root, group_dst)
                and arr.flags.c_contiguous and (arr.flags.writeable or root != self.rank_)):
            fast = _fast_op(op, arr.dtype)
            if fast is not None:
                s = self._fast_count("reduce", arr)
                if root == self.rank_:
                    req = self.comm.Ireduce(_IN_PLACE, [arr, fast[0]], fast[1], root)
                else:
                    req = self.comm.Ireduce([arr, fast[0]], None, fast[1], root)
                if arr.nbytes >= self.check_bytes:
                    node = self.fp_node
                    if node is not None:  # shared slots: post this rank's fingerprint
                        self.fp_tok = node.post(s, "reduce", arr, op, root, arr)
                    else:
                        req = _fp.Checked(self, req, "reduce", s, arr, op, root, arr)
                return self._fast_finish(req, "reduce", s, [tensor], arr, async_op)
        return self._reduce(tensor, dst, op, async_op, group_dst)

    @_guarded("reduce")
    def _reduce(self, tensor: Any, dst: Optional[int], op: Any, async_op: bool,
                group_dst: Optional[int]) -> Optional[Work]:
        where = self._begin("reduce")
        if dst is None and group_dst is None:
            group_dst = 0
        root = self.resolve_peer(dst, group_dst, "dst", where)
        is_root = self.rank_ == root

        def prepare() -> Any:
            arr = B.unwrap(tensor, "tensor", where)
            B.check_dtype(arr, "tensor", where)
            if is_root:
                B.check_writable(arr, "tensor", where)
            return arr, B.reduce_plan(arr.dtype, B.coerce_op(op, where), where)

        arr, plan = self._maybe_debug(
            where, lambda: self._sig("reduce", B.unwrap(tensor, "tensor", where),
                                     shape=tuple(B.unwrap(tensor, "tensor", where).shape),
                                     reduce=str(op), root=self.ranks[root]), prepare)
        comm, mop = self.comm, plan.mpi_op
        check = (arr, B.coerce_op(op, where), self.ranks[root])
        if is_root:
            buf, write_back = B.stage_out(arr)
            rbuf, narrow = B.apply_plan_out(buf, plan)
            avg = B.divider(rbuf, self.size_) if plan.average else None
            spec = [rbuf, plan.mpi_type]
            return self._run(where, lambda: comm.Ireduce(_IN_PLACE, spec, mop, root),
                             B.chain(avg, narrow, write_back), async_op, [tensor], keep=spec,
                             check=check)
        spec = [B.apply_plan_in(B.stage_in(arr), plan), plan.mpi_type]
        return self._run(where, lambda: comm.Ireduce(spec, None, mop, root), None, async_op,
                         [tensor], keep=spec, check=check)

    def _out_list(self, lst: Any, what: str, where: str, ref: Any,
                  ref_what: Optional[str] = None) -> list:
        """Unwrap a list of one tensor per rank; every item has ``ref``'s dtype and, when
        ``ref_what`` names ``ref``, its shape too (checked before any traffic: a slot of
        another size would be partly filled, or overrun, by the peer's message)."""
        if not isinstance(lst, (list, tuple)):
            raise TypeError(f"{where}: {what} must be a list of {self.size_} tensors, "
                            f"got {type(lst).__name__}")
        if len(lst) != self.size_:
            raise ValueError(
                f"{where}: {what} has {len(lst)} entries but {self.name} has {self.size_} ranks; "
                f"pass exactly one tensor per rank of the group"
            )
        arrs = [B.unwrap(x, f"{what}[{i}]", where) for i, x in enumerate(lst)]
        for i, a in enumerate(arrs):
            B.check_same_dtype(ref, a, ref_what or "tensor", f"{what}[{i}]", where)
            if ref_what is not None and a.shape != ref.shape:
                raise ValueError(
                    f"{where}: {what}[{i}] is {a.dtype}{list(a.shape)} but {ref_what} is "
                    f"{ref.dtype}{list(ref.shape)}; every entry of {what} must have the shape "
                    f"and dtype of {ref_what}")
        return arrs

    @_guarded("all_gather")
    def all_gather(self, tensor_list: Any, tensor: Any, async_op: bool = False) -> Optional[Work]:
        where = self._begin("all_gather")

        def prepare() -> Any:
            arr = B.unwrap(tensor, "tensor", where)
            mt = B.check_dtype(arr, "tensor", where)
            outs = self._out_list(tensor_list, "tensor_list", where, arr, "tensor")
            for i, o in enumerate(outs):
                B.check_writable(o, f"tensor_list[{i}]", where)
            return arr, mt, outs

        def sig() -> dict:
            arr = B.unwrap(tensor, "tensor", where)
            outs = [B.unwrap(x, "", where).size for x in tensor_list]
            return self._sig("all_gather", arr, shape=tuple(arr.shape),
                             send=[arr.size] * self.size_, recv=outs)

        arr, mt, outs = self._maybe_debug(where, sig, prepare)
        counts, displs = _counts_displs([arr.size] * self.size_)
        # zeros, not empty: never expose uninitialised memory, even if a peer sends too little
        flat = array_module(arr).zeros(sum(counts), dtype=arr.dtype)
        rbuf, copy_out = self._staged_list_out(flat, outs, counts, displs)
        sbuf = [B.stage_in(arr), mt]
        rspec = [rbuf, mt]
        comm = self.comm
        return self._run(where, lambda: comm.Iallgather(sbuf, rspec), copy_out, async_op,
                         list(tensor_list), keep=(sbuf, rspec), check=(arr, None, -1))

    def _staged_list_out(self, flat: Any, outs: list, counts: list,
                         displs: list) -> "tuple[Any, Callable[[], None]]":
        buf, write_back = B.stage_out(flat)

        def copy_out() -> None:
            if write_back is not None:
                write_back()
            for o, c, d in zip(outs, counts, displs):
                o[...] = flat[d:d + c].reshape(o.shape)

        return buf, copy_out

    def _packed_in(self, arrs: list) -> Any:
        xp = array_module(arrs[0]) if arrs else np
        if not arrs:
            return xp.empty(0)
        flat = xp.concatenate([a.reshape(-1) for a in arrs]) if len(arrs) > 1 else \
            xp.ascontiguousarray(arrs[0]).reshape(-1)
        return B.stage_in(flat)

    def all_gather_into_tensor(self, output: Any, input: Any,
                               async_op: bool = False) -> Optional[Work]:
        out = output._data if type(output) is Tensor else output
        inp = input._data if type(input) is Tensor else input
        if self.rank_ >= 0 and not self.slow:
            mt = self._fast_pair(out, inp)
            if mt is not None and out.size == inp.size * self.size_:
                s = self._fast_count("all_gather_into_tensor", inp)
                req = self.comm.Iallgather([inp, mt], [out, mt])
                if inp.nbytes >= self.check_bytes:
                    node = self.fp_node
                    if node is not None:  # shared slots: post this rank's fingerprint
                        self.fp_tok = node.post(s, "all_gather_into_tensor", inp, None, -1,
                                                (out, inp))
                    else:
                        req = _fp.Checked(self, req, "all_gather_into_tensor", s, inp, None, -1,
                                          (out, inp))
                return self._fast_finish(req, "all_gather_into_tensor", s, [output],
                                         (out, inp), async_op)
        return self._all_gather_into_tensor(output, input, async_op)

    @_guarded("all_gather_into_tensor")
    def _all_gather_into_tensor(self, output: Any, input: Any,
                                async_op: bool) -> Optional[Work]:
        where = self._begin("all_gather_into_tensor")

        def prepare() -> Any:
            out = B.unwrap(output, "output_tensor", where)
            inp = B.unwrap(input, "input_tensor", where)
            mt = B.check_dtype(inp, "input_tensor", where)
            B.check_same_dtype(inp, out, "input_tensor", "output_tensor", where)
            B.check_writable(out, "output_tensor", where)
            if out.size != inp.size * self.size_:
                raise ValueError(
                    f"{where}: output_tensor has {out.size} elements but needs group size × "
                    f"input size = {self.size_} × {inp.size} = {inp.size * self.size_} "
                    f"(output shape {tuple(out.shape)}, input shape {tuple(inp.shape)})")
            return out, inp, mt

        out, inp, mt = self._maybe_debug(
            where, lambda: self._sig("all_gather_into_tensor",
                                     B.unwrap(input, "input_tensor", where),
                                     shape=tuple(B.unwrap(input, "input_tensor", where).shape)),
            prepare)
        rbuf, write_back = B.stage_out(out)
        sspec, rspec = [B.unalias(B.stage_in(inp), rbuf), mt], [rbuf, mt]
        comm = self.comm
        return self._run(where, lambda: comm.Iallgather(sspec, rspec), write_back, async_op,
                         [output], keep=(sspec, rspec), check=(inp, None, -1))

    @_guarded("gather")
    def gather(self, tensor: Any, gather_list: Any = None, dst: Optional[int] = None,
               async_op: bool = False, group_dst: Optional[int] = None) -> Optional[Work]:
        where = self._begin("gather")
        if dst is None and group_dst is None:
            group_dst = 0
        root = self.resolve_peer(dst, group_dst, "dst", where)
        is_root = self.rank_ == root

        def prepare() -> Any:
            arr = B.unwrap(tensor, "tensor", where)
            mt = B.check_dtype(arr, "tensor", where)
            outs = None
            if is_root:
                if gather_list is None:
                    raise ValueError(f"{where}: gather_list is required on the destination rank "
                                     f"(a list of {self.size_} tensors)")
                outs = self._out_list(gather_list, "gather_list", where, arr, "tensor")
                for i, o in enumerate(outs):
                    B.check_writable(o, f"gather_list[{i}]", where)
            return arr, mt, outs

        def sig() -> dict:
            arr = B.unwrap(tensor, "tensor", where)
            send = [None] * self.size_
            send[root] = arr.size
            recv = ([B.unwrap(x, "", where).size for x in gather_list] if is_root else None)
            return self._sig("gather", arr, root=self.ranks[root], send=send, recv=recv)

        arr, mt, outs = self._maybe_debug(where, sig, prepare)
        sspec = [B.stage_in(arr), mt]
        comm = self.comm
        check = (arr, None, self.ranks[root])
        if not is_root:
            return self._run(where, lambda: comm.Igather(sspec, None, root), None, async_op, [],
                             keep=sspec, check=check)
        counts, displs = _counts_displs([arr.size] * self.size_)
        flat = array_module(arr).zeros(sum(counts), dtype=arr.dtype)
        rbuf, copy_out = self._staged_list_out(flat, outs, counts, displs)
        rspec = [rbuf, mt]
        return self._run(where, lambda: comm.Igather(sspec, rspec, root), copy_out, async_op,
                         list(gather_list), keep=(sspec, rspec), check=check)

    @_guarded("scatter")
    def scatter(self, tensor: Any, scatter_list: Any = None, src: Optional[int] = None,
                async_op: bool = False, group_src: Optional[int] = None) -> Optional[Work]:
        where = self._begin("scatter")
        if src is None and group_src is None:
            group_src = 0
        root = self.resolve_peer(src, group_src, "src", where)
        is_root = self.rank_ == root

        def prepare() -> Any:
            arr = B.unwrap(tensor, "tensor", where)
            mt = B.check_dtype(arr, "tensor", where)
            B.check_writable(arr, "tensor", where)
            ins = None
            if is_root:
                if scatter_list is None:
                    raise ValueError(f"{where}: scatter_list is required on the source rank "
                                     f"(a list of {self.size_} tensors)")
                ins = self._out_list(scatter_list, "scatter_list", where, arr, "tensor")
            return arr, mt, ins

        def sig() -> dict:
            arr = B.unwrap(tensor, "tensor", where)
            recv = [None] * self.size_
            recv[root] = arr.size
            send = ([B.unwrap(x, "", where).size for x in scatter_list] if is_root else None)
            return self._sig("scatter", arr, root=self.ranks[root], send=send, recv=recv)

        arr, mt, ins = self._maybe_debug(where, sig, prepare)
        rbuf, write_back = B.stage_out(arr)
        rspec = [rbuf, mt]
        comm = self.comm
        check = (arr, None, self.ranks[root])
        if not is_root:
            return self._run(where, lambda: comm.Iscatter(None, rspec, root), write_back, async_op,
                             [tensor], keep=rspec, check=check)
        sspec = [B.unalias(self._packed_in(ins), rbuf), mt]
        return self._run(where, lambda: comm.Iscatter(sspec, rspec, root), write_back, async_op,
                         [tensor], keep=(sspec, rspec), check=check)

    @_guarded("reduce_scatter")
    def reduce_scatter(self, output: Any, input_list: Any, op: Any = _SUM,
                       async_op: bool = False) -> Optional[Work]:
        where = self._begin("reduce_scatter")

        def prepare() -> Any:
            out = B.unwrap(output, "output", where)
            B.check_dtype(out, "output", where)
            B.check_writable(out, "output", where)
            ins = self._out_list(input_list, "input_list", where, out, "output")
            return out, ins, B.reduce_plan(out.dtype, B.coerce_op(op, where), where)

        def sig() -> dict:
            out = B.unwrap(output, "output", where)
            return self._sig("reduce_scatter", out, reduce=str(op),
                             send=[B.unwrap(x, "", where).size for x in input_list],
                             recv=[out.size] * self.size_)

        out, ins, plan = self._maybe_debug(where, sig, prepare)
        counts = [a.size for a in ins]
        sbuf = B.apply_plan_in(self._packed_in(ins), plan)
        buf, write_back = B.stage_out(out)
        rbuf, narrow = B.apply_plan_out(buf, plan)
        sbuf = B.unalias(sbuf, rbuf)
        avg = B.divider(rbuf, self.size_) if plan.average else None
        sspec, rspec = [sbuf, plan.mpi_type], [rbuf, plan.mpi_type]
        comm, mop = self.comm, plan.mpi_op
        return self._run(where, lambda: comm.Ireduce_scatter(sspec, rspec, counts, mop),
                         B.chain(avg, narrow, write_back), async_op, [output],
                         keep=(sspec, rspec), check=(out, B.coerce_op(op, where), -1))

    def reduce_scatter_tensor(self, output: Any, input: Any, op: Any = _SUM,
                              async_op: bool = False) -> Optional[Work]:
        out = output._data if type(output) is Tensor else output
        inp = input._data if type(input) is Tensor else input
        if self.rank_ >= 0 and not self.slow and self._fast_pair(out, inp) is not None \
                and inp.size == out.size * self.size_:
            fast = _fast_op(op, inp.dtype)
            if fast is not None:
                s = self._fast_count("reduce_scatter_tensor", inp)
                req = self.comm.Ireduce_scatter_block([inp, fast[0]], [out, fast[0]], fast[1])
                if inp.nbytes >= self.check_bytes:
                    node = self.fp_node
                    if node is not None:  # shared slots: post this rank's fingerprint
                        self.fp_tok = node.post(s, "reduce_scatter_tensor", inp, op, -1, (out, inp))
                    else:
                        req = _fp.Checked(self, req, "reduce_scatter_tensor", s, inp, op, -1,
                                          (out, inp))
                return self._fast_finish(req, "reduce_scatter_tensor", s, [output],
                                         (out, inp), async_op)
        return self._reduce_scatter_tensor(output, input, op, async_op)

    @_guarded("reduce_scatter_tensor")
    def _reduce_scatter_tensor(self, output: Any, input: Any, op: Any,
                               async_op: bool) -> Optional[Work]:
        where = self._begin("reduce_scatter_tensor")

        def prepare() -> Any:
            out = B.unwrap(output, "output", where)
            inp = B.unwrap(input, "input", where)
            B.check_dtype(inp, "input", where)
            B.check_same_dtype(inp, out, "input", "output", where)
            B.check_writable(out, "output", where)
            if inp.size != out.size * self.size_:
                raise ValueError(
                    f"{where}: input has {inp.size} elements but needs group size × output size "
                    f"= {self.size_} × {out.size} = {out.size * self.size_}")
            return out, inp, B.reduce_plan(out.dtype, B.coerce_op(op, where), where)

        out, inp, plan = self._maybe_debug(
            where, lambda: self._sig("reduce_scatter_tensor", B.unwrap(input, "input", where),
                                     shape=tuple(B.unwrap(input, "input", where).shape),
                                     reduce=str(op)), prepare)
        sbuf = B.apply_plan_in(B.stage_in(inp), plan)
        buf, write_back = B.stage_out(out)
        rbuf, narrow = B.apply_plan_out(buf, plan)
        sbuf = B.unalias(sbuf, rbuf)
        avg = B.divider(rbuf, self.size_) if plan.average else None
        sspec, rspec = [sbuf, plan.mpi_type], [rbuf, plan.mpi_type]
        comm, mop = self.comm, plan.mpi_op
        return self._run(where, lambda: comm.Ireduce_scatter_block(sspec, rspec, mop),
                         B.chain(avg, narrow, write_back), async_op, [output],
                         keep=(sspec, rspec), check=(inp, B.coerce_op(op, where), -1))

    @_guarded("all_to_all")
    def all_to_all(self, output_tensor_list: Any, input_tensor_list: Any,
                   async_op: bool = False) -> Optional[Work]:
        where = self._begin("all_to_all")

        def prepare() -> Any:
            if not isinstance(input_tensor_list, (list, tuple)) or not input_tensor_list:
                raise ValueError(f"{where}: input_tensor_list must be a list of {self.size_} "
                                 "tensors")
            ref = B.unwrap(input_tensor_list[0], "input_tensor_list[0]", where)
            mt = B.check_dtype(ref, "input_tensor_list[0]", where)
            ins = self._out_list(input_tensor_list, "input_tensor_list", where, ref)
            outs = self._out_list(output_tensor_list, "output_tensor_list", where, ref)
            for i, o in enumerate(outs):
                B.check_writable(o, f"output_tensor_list[{i}]", where)
            return ins, outs, mt

        def sig() -> dict:
            ins = [B.unwrap(x, "", where) for x in input_tensor_list]
            outs = [B.unwrap(x, "", where).size for x in output_tensor_list]
            return self._sig("all_to_all", ins[0], send=[a.size for a in ins], recv=outs)

        ins, outs, mt = self._maybe_debug(where, sig, prepare)
        scounts, sdispls = _counts_displs([a.size for a in ins])
        rcounts, rdispls = _counts_displs([o.size for o in outs])
        flat = array_module(ins[0]).zeros(sum(rcounts), dtype=ins[0].dtype)
        rbuf, copy_out = self._staged_list_out(flat, outs, rcounts, rdispls)
        sspec = [self._packed_in(ins), (scounts, sdispls), mt]
        rspec = [rbuf, (rcounts, rdispls), mt]
        comm = self.comm
        return self._run(where, lambda: comm.Ialltoallv(sspec, rspec), copy_out, async_op,
                         list(output_tensor_list), keep=(sspec, rspec),
                         splits=(scounts, rcounts, "output_tensor_list", 1, ins[0].dtype))

    def _splits(self, splits: Any, arr: Any, what: str, where: str) -> list:
        rows = arr.shape[0] if arr.ndim else 1
        if _no_splits(splits):
            if rows % self.size_:
                raise ValueError(
                    f"{where}: {what} is None, so dimension 0 ({rows}) must divide evenly "
                    f"among {self.size_} ranks; pass {what} explicitly")
            return [rows // self.size_] * self.size_
        splits = [int(s) for s in splits]
        if len(splits) != self.size_:
            raise ValueError(f"{where}: {what} has {len(splits)} entries but {self.name} has "
                             f"{self.size_} ranks")
        if any(s < 0 for s in splits) or sum(splits) != rows:
            raise ValueError(f"{where}: {what}={splits} must be non-negative and sum to "
                             f"dimension 0 of the tensor ({rows})")
        return splits

    def all_to_all_single(self, output: Any, input: Any, output_split_sizes: Any = None,
                          input_split_sizes: Any = None,
                          async_op: bool = False) -> Optional[Work]:
        out = output._data if type(output) is Tensor else output
        inp = input._data if type(input) is Tensor else input
        if (self.rank_ >= 0 and not self.slow and input_split_sizes is None
                and output_split_sizes is None):
            mt = self._fast_pair(out, inp)
            if (mt is not None and inp.shape == out.shape
                    and inp.shape[0] % self.size_ == 0):
                s = self._fast_count("all_to_all_single", out)
                req = self.comm.Ialltoall([inp, mt], [out, mt])
                if out.nbytes >= self.check_bytes:
                    node = self.fp_node
                    if node is not None:  # shared slots: post this rank's fingerprint
                        self.fp_tok = node.post(s, "all_to_all_single", out, None, -1, (out, inp))
                    else:
                        req = _fp.Checked(self, req, "all_to_all_single", s, out, None, -1,
                                          (out, inp))
                return self._fast_finish(req, "all_to_all_single", s, [output], (out, inp),
                                         async_op)
        elif (self.rank_ >= 0 and not self.slow
              and not (_no_splits(input_split_sizes) and _no_splits(output_split_sizes))):
            # (both [] is torch's even split, as both None: MPI_Alltoall on the general path)
            mt = self._fast_pair(out, inp)
            if mt is not None and inp.shape[1:] == out.shape[1:]:
                sends = self._fast_splits(input_split_sizes, inp.shape[0])
                recvs = self._fast_splits(output_split_sizes, out.shape[0])
                if sends is not None and recvs is not None:
                    return self._fast_uneven(output, out, inp, mt, sends, recvs, async_op)
        return self._all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                       async_op)

    def _fast_splits(self, splits: Any, rows: int) -> Optional[list]:
        """Split sizes the fast path takes as they are (None or [] for an even split, or a
        list or tuple of n non-negative ints summing to ``rows``), else None: the general
        path then says what is wrong with them."""
        n = self.size_
        if splits is None or (type(splits) in (list, tuple) and not splits):
            return [rows // n] * n if rows % n == 0 else None
        if type(splits) not in (list, tuple) or len(splits) != n:
            return None
        total = 0
        for v in splits:
            if type(v) is not int or v < 0:
                return None
            total += v
        return list(splits) if total == rows else None

    def _fast_uneven(self, output: Any, out: Any, inp: Any, mt: Any, sends: list, recvs: list,
                     async_op: bool) -> Optional[Work]:
        """all_to_all_single with split sizes, on the fast path (see all_to_all_single)."""
        row = 1
        for d in inp.shape[1:]:
            row *= d
        sc, sd = _counts_displs([v * row for v in sends])
        rc, rd = _counts_displs([v * row for v in recvs])
        s = self._fast_count("all_to_all_single", out)
        req = self.comm.Ialltoallv([inp, (sc, sd), mt], [out, (rc, rd), mt])
        if self.check_bytes < OFF_BYTES:  # the split sizes, checked by any size
            node = self.fp_node
            if node is not None and node.board >= 0:
                self.fp_tok = node.post_splits(s, "all_to_all_single", sc, rc,
                                               "output_split_sizes", row, inp.dtype, (out, inp))
            else:
                req = _fp.Splits(self, req, "all_to_all_single", s, sc, rc, "output_split_sizes",
                                 row, inp.dtype, (out, inp))
        return self._fast_finish(req, "all_to_all_single", s, [output], (out, inp), async_op)

    @_guarded("all_to_all_single")
    def _all_to_all_single(self, output: Any, input: Any, output_split_sizes: Any,
                           input_split_sizes: Any, async_op: bool) -> Optional[Work]:
        where = self._begin("all_to_all_single")

        def prepare() -> Any:
            out = B.unwrap(output, "output", where)
            inp = B.unwrap(input, "input", where)
            mt = B.check_dtype(inp, "input", where)
            B.check_same_dtype(inp, out, "input", "output", where)
            B.check_writable(out, "output", where)
            if inp.shape[1:] != out.shape[1:]:
                raise ValueError(f"{where}: input shape {tuple(inp.shape)} and output shape "
                                 f"{tuple(out.shape)} differ beyond dimension 0")
            if even and inp.size != out.size:
                # MPI_Alltoall would send rows/n of the input to each rank and leave the rest of
                # a larger output unwritten (or fail on a smaller one): torch refuses it too
                raise ValueError(
                    f"{where}: without split sizes, output and input must have the same number "
                    f"of elements (each rank gets an equal share of every input); got output "
                    f"{tuple(out.shape)} and input {tuple(inp.shape)}. Pass "
                    "output_split_sizes and input_split_sizes for uneven exchanges")
            ins = self._splits(input_split_sizes, inp, "input_split_sizes", where)
            outs = self._splits(output_split_sizes, out, "output_split_sizes", where)
            row = int(np.prod(inp.shape[1:])) if inp.ndim > 1 else 1
            return out, inp, mt, [s * row for s in ins], [s * row for s in outs], row

        even = _no_splits(input_split_sizes) and _no_splits(output_split_sizes)

        def sig() -> dict:
            out, inp, _, sc, rc, _ = prepare()
            return self._sig("all_to_all_single", inp, send=sc, recv=rc,
                             splits="none" if even else "given")

        out, inp, mt, scounts, rcounts, row = self._maybe_debug(where, sig, prepare)
        rbuf, write_back = B.stage_out(out)
        sbuf = B.unalias(B.stage_in(inp), rbuf)
        comm = self.comm
        if even:
            # no split sizes (the usual case): MPI_Alltoall, which MPIs implement with
            # algorithms (Bruck, pairwise) the v-variant cannot use; mpi4py divides each buffer
            # by the number of ranks. As with torch's MPI backend, every rank must then pass no
            # split sizes: the choice is made locally, and debug mode checks it agrees
            sspec, rspec = [sbuf, mt], [rbuf, mt]
            nonblocking = comm.Ialltoall
        else:
            sspec = [sbuf, _counts_displs(scounts), mt]
            rspec = [rbuf, _counts_displs(rcounts), mt]
            nonblocking = comm.Ialltoallv
        return self._run(where, lambda: nonblocking(sspec, rspec),
                         write_back, async_op, [output], keep=(sspec, rspec),
                         check=(out, None, -1) if even else None,
                         splits=None if even else (scounts, rcounts, "output_split_sizes",
                                                   row, inp.dtype))

    @_guarded("barrier")
    def barrier(self, async_op: bool = False) -> Optional[Work]:
        where = self._begin("barrier")
        self._count("barrier")
        if self.debug:
            self._agree(where, self._sig("barrier"), None)
        comm = self.comm
        return self._run(where, comm.Ibarrier, None, async_op)

    # ------------------------------------------------------------------ point-to-point
    def _tag(self, tag: Any, where: str) -> int:
        if isinstance(tag, bool) or not hasattr(tag, "__index__"):
            raise TypeError(f"{where}: tag must be an int, got {tag!r}")
        tag = tag.__index__()
        if not 0 <= tag <= self.tag_ub:
            raise ValueError(f"{where}: tag={tag} is out of range; MPI tags run from 0 to "
                             f"{self.tag_ub}")
        return tag

    def _peer(self, peer: Optional[int], group_peer: Optional[int], what: str, where: str,
              allow_any: bool = False) -> int:
        r = self.resolve_peer(peer, group_peer, what, where, allow_none=allow_any)
        if r is None:
            return _ANY_SOURCE
        if r == self.rank_:
            raise ValueError(
                f"{where}: invalid {what} rank {self.ranks[r]}: {what} rank should not be the "
                "same as the rank of the current process (point-to-point operations need two "
                "different ranks; copy the tensor locally instead)")
        return r

    def _p2p_fast(self, arr: Any, peer: Any, tag: Any, group_peer: Any) -> Any:
        """MPI.BYTE when a p2p call needs no checks beyond these, else None.

        True for a contiguous NumPy array of a supported dtype, int peer and tag in range, on a
        group whose ranks are the world's (so the peer needs no translation).

        Messages move as bytes, whatever the dtype: a receive typed with the buffer's element
        type makes MPICH abort the whole job (an assertion in its unpacking) when the message's
        byte count is not a whole number of those elements (float32 x 3 sent, float64
        received); as bytes, the receive completes and the count check below explains it.
        """
        if (type(arr) is np.ndarray and type(peer) is int and type(tag) is int
                and group_peer is None and self.identity and not self.slow
                and 0 <= peer < self.size_ and peer != self.rank_ and 0 <= tag <= self.tag_ub
                and arr.flags.c_contiguous and arr.dtype in _MOVE):
            return _BYTE
        return None

    def send(self, tensor: Any, dst: Optional[int], tag: int = 0,
             group_dst: Optional[int] = None, async_op: bool = False) -> Optional[Work]:
        arr = tensor._data if type(tensor) is Tensor else tensor
        mt = self._p2p_fast(arr, dst, tag, group_dst)
        if mt is not None:
            s = self.p2p_seq = self.p2p_seq + 1
            req = self.comm.Isend([arr, mt], dst, tag)
            if async_op:
                return Work(req, None, [tensor], keep=arr, describe=self._describe_p2p("isend"),
                            group=self, info=("isend", s, "p2p", dst, tag))
            if not req.Test():
                _wait(self, req, "send", s, "p2p", None, None, dst, tag)
            return None
        return self._send(tensor, dst, tag, group_dst, async_op)

    def _describe_p2p(self, opname: str) -> Callable[[], str]:
        seq = self.p2p_seq
        return lambda: f"rank {self.global_rank}: {opname} (p2p #{seq} on {self.name})"

    def _send(self, tensor: Any, dst: Optional[int], tag: int, group_dst: Optional[int],
              async_op: bool) -> Optional[Work]:
        op = "isend" if async_op else "send"
        where = self._begin_p2p(op)
        peer = self._peer(dst, group_dst, "dst", where)
        tag = self._tag(tag, where)
        arr = B.unwrap(tensor, "tensor", where)
        B.check_dtype(arr, "tensor", where)
        spec = [B.stage_in(arr), _BYTE]  # as bytes: see _p2p_fast
        s = self.p2p_seq = self.p2p_seq + 1
        header = hreq = None
        if self.debug:
            header = _header(arr, s)
            hreq = self.hdr.Isend([header, _I64], peer, tag)
        try:
            req = self.comm.Isend(spec, peer, tag)
        except MPI.Exception as exc:
            raise self._mpi_error(where, exc) from exc
        info = (op, s, "p2p", peer, tag)
        if async_op:
            work = _SendWork(req, None, [tensor], describe=lambda: where, keep=(spec, header),
                             group=self, info=info)
            work._check = (hreq, peer, s, where) if hreq is not None else None
            return work
        try:
            if not req.Test():
                _wait(self, req, op, s, "p2p", None, None, peer, tag)
        except MPI.Exception as exc:
            raise self._mpi_error(where, exc) from exc
        if hreq is not None:
            self._await_verdict(hreq, peer, s, where, None)
        return None

    def _await_verdict(self, hreq: Any, peer: int, s: int, where: str,
                       timeout: Optional[float]) -> None:
        """Debug mode: wait until the receiver has checked this message's header."""
        _wait(self, hreq, "send (debug header)", s, "p2p", None, timeout, peer)
        _wait(self, _VerdictRequest(self, peer, s), "send (waiting for the receiver's check)",
              s, "p2p", None, timeout, peer)
        problem = self.verdicts.pop((peer, s))
        if problem is not None:
            raise MessageMismatchError(f"{where}: rank {self.ranks[peer]} received this message "
                                       f"and reported: {problem}")

    def recv(self, tensor: Any, src: Optional[int] = None, tag: int = 0,
             group_src: Optional[int] = None, async_op: bool = False) -> Any:
        if not async_op:
            arr = tensor._data if type(tensor) is Tensor else tensor
            mt = self._p2p_fast(arr, src, tag, group_src)
            if mt is not None and arr.flags.writeable:
                status = MPI.Status()
                s = self.p2p_seq = self.p2p_seq + 1
                try:
                    req = self.comm.Irecv([arr, mt], src, tag)
                    if not req.Test(status):
                        _wait(self, req, "recv", s, "p2p", status, None, src, tag, True)
                except MPI.Exception as exc:
                    where = f"rank {self.global_rank}: recv (p2p #{s} on {self.name})"
                    raise self._recv_error(where, status, arr.nbytes, B.describe(arr),
                                           exc) from exc
                if status.Get_count(MPI.BYTE) != arr.nbytes:
                    raise self._short(f"rank {self.global_rank}: recv (p2p #{s} on "
                                      f"{self.name})", status, arr.nbytes, B.describe(arr))
                return status.Get_source()
        return self._recv(tensor, src, tag, group_src, async_op)

    def _recv(self, tensor: Any, src: Optional[int], tag: int, group_src: Optional[int],
              async_op: bool) -> Any:
        op = "irecv" if async_op else "recv"
        where = self._begin_p2p(op)
        peer = self._peer(src, group_src, "src", where, allow_any=True)
        tag = self._tag(tag, where)
        arr = B.unwrap(tensor, "tensor", where)
        B.check_dtype(arr, "tensor", where)
        B.check_writable(arr, "tensor", where)
        s = self.p2p_seq = self.p2p_seq + 1
        buf, write_back = B.stage_out(arr)
        spec = [buf, _BYTE]  # as bytes: see _p2p_fast
        status = MPI.Status()
        comm = self.comm
        recv = _ReceiveCheck(self, where, op, s, tag, status, arr, buf.nbytes)
        check, translate = recv.check, recv.translate
        debug = self.debug
        try:
            req = comm.Irecv(spec, peer, tag)
        except MPI.Exception as exc:
            raise translate(exc) from exc
        info = (op, s, "p2p", None if peer == _ANY_SOURCE else peer, tag)
        if async_op:
            work = _RecvWork(req, write_back, [tensor], describe=lambda: where, keep=spec,
                             status=status, group=self, info=info)
            work._translate = translate
            work._ranks = self.ranks
            work._check = check if debug else None
            work._short = recv.short
            return work
        try:
            if not req.Test(status):
                _wait(self, req, op, s, "p2p", status, None, info[3], tag, True)
        except MPI.Exception as exc:
            raise translate(exc) from exc
        if debug:
            found = check(None)
            if found is not None:
                raise found
        short = recv.short()
        if short is not None:
            raise short
        if write_back is not None:
            write_back()
        return self.ranks[status.Get_source()]

    def _short(self, where: str, status: MPI.Status, nbytes: int,
               desc: str) -> MessageMismatchError:
        """A message smaller than the receive buffer: only its bytes were written."""
        got = status.Get_count(MPI.BYTE)
        return MessageMismatchError(
            f"{where}: the message from rank {self.ranks[status.Get_source()]} (tag "
            f"{status.Get_tag()}) has {got} bytes but the receive buffer is {desc} ({nbytes} "
            f"bytes): only the first {got} bytes were written. Send and receive tensors must "
            "have the same dtype and number of elements (as in torch)")

    def _recv_error(self, where: str, status: MPI.Status, nbytes: int, desc: str,
                    exc: BaseException) -> BaseException:
        if isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_TRUNCATE:
            return self._truncated(where, status, nbytes, desc, exc)
        return self._mpi_error(where, exc)

    def _truncated(self, where: str, status: MPI.Status, nbytes: int, desc: str,
                   exc: MPI.Exception) -> MessageTruncatedError:
        text = exc.Get_error_string()
        src = status.Get_source()
        numbers = [int(n) for n in re.findall(r"(\d+) bytes", text) +
                   re.findall(r"buffer size is (\d+)", text)]
        others = [n for n in numbers if n != nbytes]
        sender = f" from rank {self.ranks[src]}" if 0 <= src < self.size_ else ""
        msg_size = f" of {others[0]} bytes" if others else ""
        return MessageTruncatedError(
            f"{where}: the incoming message{sender} (tag {status.Get_tag()}){msg_size} is larger "
            f"than the receive buffer ({desc}, {nbytes} bytes); the message was truncated. "
            "Allocate the receive tensor with the sender's shape and dtype.")

    # ------------------------------------------------------------------ objects (pickle)
    # Pickled bytes over non-blocking buffer collectives, so that these too are bounded by the
    # group's timeout (mpi4py's lower-case methods block inside MPI). The caller counts the call.
    def _obj_wait(self, req: Any, op: str, status: Any = None) -> None:
        if not req.Test(status):
            _wait(self, req, op, self.seq, "coll", status)

    def bcast_obj(self, obj: Any, root: int, op: str = "broadcast_object_list") -> Any:
        n = np.zeros(1, np.int64)
        data = None
        if self.rank_ == root:
            data = _pickled(obj)
            n[0] = data.size
        self.sent += 1
        self._obj_wait(self.comm.Ibcast([n, _I64], root), op)
        if data is None:
            data = np.empty(int(n[0]), np.uint8)
        self._obj_wait(self.comm.Ibcast([data, _BYTE], root), op)
        return obj if self.rank_ == root else pickle.loads(data)

    def allgather_obj(self, obj: Any, op: str = "all_gather_object") -> list:
        data = _pickled(obj)
        n = np.array([data.size], np.int64)
        sizes = np.empty(self.size_, np.int64)
        self.sent += 1
        self._obj_wait(self.comm.Iallgather([n, _I64], [sizes, _I64]), op)
        counts, displs = _counts_displs(sizes.tolist())
        out = np.empty(sum(counts), np.uint8)
        self._obj_wait(self.comm.Iallgatherv([data, _BYTE], [out, (counts, displs), _BYTE]), op)
        return [pickle.loads(out[d:d + c]) for c, d in zip(counts, displs)]

    def gather_obj(self, obj: Any, root: int, op: str = "gather_object") -> Optional[list]:
        data = _pickled(obj)
        n = np.array([data.size], np.int64)
        is_root = self.rank_ == root
        sizes = np.empty(self.size_, np.int64) if is_root else None
        self.sent += 1
        self._obj_wait(self.comm.Igather([n, _I64], [sizes, _I64] if is_root else None, root),
                       op)
        if not is_root:
            self._obj_wait(self.comm.Igatherv([data, _BYTE], None, root), op)
            return None
        counts, displs = _counts_displs(sizes.tolist())
        out = np.empty(sum(counts), np.uint8)
        self._obj_wait(self.comm.Igatherv([data, _BYTE], [out, (counts, displs), _BYTE], root),
                       op)
        return [pickle.loads(out[d:d + c]) for c, d in zip(counts, displs)]

    def scatter_obj(self, objs: Optional[list], root: int,
                    op: str = "scatter_object_list") -> Any:
        is_root = self.rank_ == root
        n = np.zeros(1, np.int64)
        flat = sizes = None
        if is_root:
            parts = [pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL) for o in objs]
            sizes = np.array([len(p) for p in parts], np.int64)
            flat = np.frombuffer(bytearray(b"".join(parts)), np.uint8)
        self.sent += 1
        self._obj_wait(self.comm.Iscatter([sizes, _I64] if is_root else None, [n, _I64], root),
                       op)
        out = np.empty(int(n[0]), np.uint8)
        send = [flat, _counts_displs(sizes.tolist()), _BYTE] if is_root else None
        self._obj_wait(self.comm.Iscatterv(send, [out, _BYTE], root), op)
        return pickle.loads(out)

    def send_obj(self, obj: Any, peer: int, tag: int, op: str = "send_object") -> None:
        s = self.p2p_seq = self.p2p_seq + 1
        data = _pickled(obj)
        req = self.comm.Isend([data, _BYTE], peer, tag)
        if not req.Test():
            _wait(self, req, op, s, "p2p", None, None, peer, tag)

    def recv_obj(self, peer: int, tag: int, op: str = "recv_object") -> "tuple[Any, int]":
        s = self.p2p_seq = self.p2p_seq + 1
        status = MPI.Status()
        probe = _ProbeRequest(self.comm, peer, tag)
        _wait(self, probe, op, s, "p2p", status, None, None if peer == _ANY_SOURCE else peer, tag)
        buf = np.empty(status.Get_count(_BYTE), np.uint8)
        req = probe.message.Irecv([buf, _BYTE])
        if not req.Test():
            _wait(self, req, op, s, "p2p", None, None, status.Get_source(), tag)
        return pickle.loads(buf), self.ranks[status.Get_source()]

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
                if self.broken is None:
                    raise
            members = [self._global_to_group[r] for r in ranks]
            W.rendezvous(self, members, ("new_group", tuple(ranks)),
                         self.timeout if timeout is None else timeout, f"new_group({ranks})")
            sub = self.comm.Get_group().Incl(members)
            comm = self.comm.Create_group(sub)
            sub.Free()
        return MPIGroup(comm, ranks, self.global_rank, name, self.timeout, self.debug,
                        self.world_size)

    def free(self) -> None:
        if self.fp_pool is not None:
            self.fp_pool.free()
        if self.fp_node is not None:
            self.fp_node.close()
            self.fp_node = None
        for attr in ("comm", "diag", "hdr"):
            comm = getattr(self, attr, None)
            if comm is not None and comm != MPI.COMM_NULL:
                comm.Free()
            setattr(self, attr, None)
        self.notice_reqs = []
        self._heard = None
        word, self.fault_word = self.fault_word, None
        if word is not None:
            word.release()
            self.fault_mm.close()
            self.fault_mm = None
        _faults.forget(self)
        self.identity = False  # no fast path either: every call meets require_member
        self._mark_destroyed()


def _pickled(obj: Any) -> np.ndarray:
    return np.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)),
                         np.uint8)


def _header(arr: Any, seq: int) -> np.ndarray:
    """Debug mode: what a sender tells the receiver about a message (dtype, size, shape)."""
    h = np.zeros(_HDR_LEN, np.int64)
    h[0], h[1], h[2], h[3] = _HDR_MAGIC, seq, _DTYPE_CODE.get(arr.dtype, -1), arr.nbytes
    h[4] = arr.ndim if arr.ndim <= _MAX_DIMS else -1
    if 0 < arr.ndim <= _MAX_DIMS:
        h[5:5 + arr.ndim] = arr.shape
    return h


def _describe_header(h: np.ndarray) -> str:
    code, nbytes, ndim = int(h[2]), int(h[3]), int(h[4])
    dt = str(_DTYPES[code]) if 0 <= code < len(_DTYPES) else "?"
    shape = [int(x) for x in h[5:5 + ndim]] if ndim >= 0 else "[...]"
    return f"{dt}{shape} ({nbytes} bytes)"


class _ProbeRequest:
    """Looks like an MPI request: completes when a matching message has arrived."""

    __slots__ = ("comm", "source", "tag", "message")

    def __init__(self, comm: MPI.Comm, source: int, tag: int) -> None:
        self.comm, self.source, self.tag, self.message = comm, source, tag, None

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI request protocol
        m = self.comm.Improbe(self.source, self.tag, status)
        if m is None:
            return False
        self.message = m
        return True


class _VerdictRequest:
    """Debug mode: completes when the receiver's verdict on message ``seq`` has arrived."""

    __slots__ = ("group", "peer", "key")

    def __init__(self, group: MPIGroup, peer: int, seq: int) -> None:
        self.group, self.peer, self.key = group, peer, (peer, seq)

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI request protocol
        g = self.group
        if self.key in g.verdicts:
            return True
        st = MPI.Status()
        tag = W.VERDICT_TAG + g.tag_base
        while g.diag.Iprobe(self.peer, tag, st):
            seq, problem = g.diag.recv(None, self.peer, tag)
            g.verdicts[(self.peer, seq)] = problem
        return self.key in g.verdicts


class _SendWork(Work):
    """An isend handle; in debug mode ``wait()`` also waits for the receiver's check."""

    __slots__ = ("_check",)

    def _await(self, timeout: Optional[float]) -> None:
        super()._await(timeout)
        check, self._check = self._check, None
        if check is not None:
            hreq, peer, s, where = check
            try:
                self._group._await_verdict(hreq, peer, s, where, timeout)
            except MessageMismatchError as exc:
                self._done, self._exception = True, exc
                raise

    def is_completed(self) -> bool:
        if self._check is not None and not self._done:
            hreq, peer, s, _ = self._check
            if not (self._request.Test() and hreq.Test()
                    and _VerdictRequest(self._group, peer, s).Test()):
                return False
            self.wait()
            return True
        return super().is_completed()


class _ReceiveCheck:
    """What a receive needs to explain its failures: the debug-mode header check and the
    translation of MPI errors into this package's (one object per receive, used by the
    blocking path and by the work handle of ``irecv``)."""

    def __init__(self, g: "MPIGroup", where: str, op: str, seq: int, tag: int, status: Any,
                 arr: Any, nbytes: int) -> None:
        self.g, self.where, self.op, self.seq, self.tag = g, where, op, seq, tag
        self.status, self.arr, self.nbytes = status, arr, nbytes
        self.desc = B.describe(arr)
        self.debug = g.debug  # as when the receive was posted

    def check(self, exc: Optional[BaseException]) -> Optional[BaseException]:
        """Debug mode: compare the sender's header with this buffer; answer the sender."""
        g, tag = self.g, self.tag
        source = self.status.Get_source()
        hdr = np.zeros(_HDR_LEN, np.int64)
        hreq = g.hdr.Irecv([hdr, _I64], source, tag)
        _wait(g, hreq, f"{self.op} (debug header)", self.seq, "p2p", None, None, source, tag)
        problem = self._header_problem(hdr)
        g.notice_reqs.append(g.diag.isend((int(hdr[1]), problem), source,
                                          W.VERDICT_TAG + g.tag_base))
        if problem is None and exc is None:
            return None
        who = f"rank {g.ranks[source]} (tag {tag})"
        if isinstance(exc, MPI.Exception) and exc.Get_error_class() == MPI.ERR_TRUNCATE:
            return MessageTruncatedError(
                f"{self.where}: the incoming message from {who} is larger than the receive "
                f"buffer: the sender sent {_describe_header(hdr)}, this rank receives into "
                f"{self.desc} ({self.nbytes} bytes); the message was truncated. "
                "Allocate the receive tensor with the sender's shape and dtype.")
        if problem:
            return MessageMismatchError(
                f"{self.where}: the message from {who} does not match the receive buffer: "
                f"{problem}. Send and receive tensors must have the same dtype and number of "
                "elements.")
        return None

    def _header_problem(self, hdr: Any) -> Optional[str]:
        if hdr[0] != _HDR_MAGIC:
            return "its debug header is unreadable (is debug mode on for every rank?)"
        if int(hdr[2]) != _DTYPE_CODE.get(self.arr.dtype, -1) or int(hdr[3]) != self.nbytes:
            return (f"the sender sent {_describe_header(hdr)}, but the receive buffer is "
                    f"{self.desc} ({self.nbytes} bytes)")
        return None

    def short(self) -> Optional[BaseException]:
        """After completion: the error for a message smaller than the buffer, else None."""
        if self.status.Get_count(MPI.BYTE) == self.nbytes:
            return None
        return self.g._short(self.where, self.status, self.nbytes, self.desc)

    def translate(self, exc: BaseException) -> BaseException:
        """The error to raise for an MPI failure of this receive."""
        if self.debug and isinstance(exc, MPI.Exception):
            found = self.check(exc)
            if found is not None:
                return found
        return self.g._recv_error(self.where, self.status, self.nbytes, self.desc, exc)


class _RecvWork(Work):
    """An irecv handle: records the sender and turns MPI errors into readable ones."""

    __slots__ = ("_translate", "_ranks", "_check", "_short")

    def _complete(self) -> None:
        self._source = self._ranks[self._status.Get_source()]
        check, self._check = self._check, None
        found = check(None) if check is not None else None
        if found is None:
            found = self._short()
        if found is not None:
            self._done, self._exception, self._finish, self._keep = True, found, None, None
            raise found
        super()._complete()

    def wait(self, timeout: Optional[float] = None) -> bool:
        try:
            return super().wait(timeout)
        except MPI.Exception as exc:
            self._check = None
            self._done, self._exception = True, self._translate(exc)
            raise self._exception from exc

    def is_completed(self) -> bool:
        try:
            return super().is_completed()
        except MPI.Exception as exc:
            self._check = None
            self._done, self._exception = True, self._translate(exc)
            raise self._exception from exc


_ = _Completed  # re-exported for the NCCL group
