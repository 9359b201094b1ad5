"""The MPI group's collectives: each torch.distributed collective on one non-blocking MPI call.

A mixin of :class:`~mpitensor.distributed.backends.mpi.group.MPIGroup`, kept apart because it
is the largest part of the group and reads on its own: every collective has a *fast path*
(a contiguous NumPy array of a dtype MPI moves as is, plain int ranks, debug off: no checks,
no staging) and a *general path* (``_name``, wrapped by :func:`_guarded`) that checks the
arguments before any traffic, stages CuPy and non-contiguous buffers, and runs through the
group's ``_run``. The group's plumbing (``begin``, ``_run``, ``_maybe_debug``, the agreement
check) lives in ``group.py``. Small calls of all_reduce, broadcast, all_gather (both forms) and
reduce_scatter_tensor, on either path, start a persistent request of the group's instead of
posting a non-blocking call (``persistent.py``: as cheap as MPI's blocking call).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import numpy as np
from mpi4py import MPI

from ...._base.config import OFF_BYTES
from ....backend import array_module
from ....tensor import Tensor
from ...health import fingerprint as _fp
from ...health import watchdog as W
from ...health.state import MASK as _MASK
from ...process_group import ReduceOp, Work
from . import all_reduce_into as _into
from . import buffers as B
from . import gather_p2p as _gp2p
from . import hierarchical as _hier
from . import hierarchical_gather as _hgather
from . import hierarchical_scatter as _hscatter
from . import persistent as _pers
from . import scatter_p2p as _sp2p
from . import shm_coll as _shmc
from .shm_tiny import BCAST as _BCAST
from .shm_tiny import GATHER as _GATHER
from .shm_tiny import REDUCE as _REDUCE
from .shm_tiny import REDUCE_PART as _PART
from .shm_tiny import ROOTED as _ROOTED

_IN_PLACE = MPI.IN_PLACE
_MOVE = B.MOVE_TYPES
_SUM = ReduceOp.SUM
_wait = W.wait
_bytes = _pers.as_bytes

# op -> {dtype: (MPI type, MPI op, persistent.kind of the two)} for reductions with no view,
# upcast or AVG step: the fast path of all_reduce (nested dicts: two identity-hash lookups,
# no tuple to build)
_FAST: dict = {op: {} for op in ReduceOp.members.values()}
for _dt in B.MOVE_TYPES:
    for _op in ReduceOp.members.values():
        _p = B._plan(_dt, _op)
        if not isinstance(_p, str) and _p.view is None and _p.upcast is None and not _p.average:
            _FAST[_op][_dt] = (_p.mpi_type, _p.mpi_op, _pers.kind(_p.mpi_type, _p.mpi_op))
del _dt, _op, _p


def _fast_op(op: Any, dtype: Any) -> Any:
    """``(MPI datatype, MPI op, kind)`` when ``op`` on ``dtype`` needs no plan (see _FAST),
    else None."""
    try:
        return _FAST[op].get(dtype)
    except (KeyError, TypeError):  # not a ReduceOp (a name, an int, unhashable): the general
        return None                # path coerces it or says why not


def _no_splits(splits: Any) -> bool:
    """``None`` or an empty list: split dimension 0 evenly (torch's convention)."""
    return splits is None or (isinstance(splits, (list, tuple)) and len(splits) == 0)


def _guarded(opname: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A collective's general path: a failure before any traffic is settled with the peers
    (``ProcessGroup.call_guarded``, ``_faults``). Fast paths never raise before posting."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(self: "Collectives", *args: Any, **kwargs: Any) -> Any:
            return self.call_guarded(opname, fn, self, *args, **kwargs)
        return run
    return wrap


def _end_to_end(outs: list) -> Any:
    """One flat writable NumPy array over ``outs`` (same dtype and size, as checked) where
    they lie end to end, in order, in one contiguous buffer; else None."""
    first = outs[0]
    if type(first) is not np.ndarray or not first.flags.c_contiguous or not first.size:
        return None
    root = first
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not (root.flags.c_contiguous and root.flags.writeable):
        return None
    start, step = first.__array_interface__["data"][0], first.nbytes
    for i, o in enumerate(outs):
        if (type(o) is not np.ndarray or not o.flags.c_contiguous
                or o.__array_interface__["data"][0] != start + i * step):
            return None
    off = start - root.__array_interface__["data"][0]
    if off < 0 or off + step * len(outs) > root.nbytes:
        return None
    return np.ndarray((first.size * len(outs),), first.dtype, buffer=root, offset=off)


class Collectives(_pers.SmallCalls):
    """The collectives of :class:`MPIGroup` (a mixin: ``self`` is the group)."""

    # node-local collectives through shared memory (shm_coll.py): calls of at least shm_min
    # bytes ask it (OFF_BYTES: never), all-reduces from shm_ar_min (lower where the board keeps
    # fewer: shm_tiny.PAIR_REDUCE_CAP); shm is its Engine once made (False: none, for good)
    shm_min: int = OFF_BYTES
    shm_ar_min: int = OFF_BYTES
    shm: Any = None

    # collectives across nodes (hierarchical.py): set when the group is made (initial): None
    # (one node, or the switch off: always flat) or PENDING, until the first qualifying call
    # makes the group's Hierarchy
    hier: Any = _hier.PENDING
    # whether every member runs on this node (MPI_Comm_split_type), where the group's making
    # asked: shm_coll.floor does, and hierarchical.initial reads it instead of asking again
    one_node: Optional[bool] = None

    def all_reduce(self, tensor: Any, op: Any = _SUM, async_op: bool = False) -> Optional[Work]:
        if (lane := self.lane) is not None and not async_op and (
                r := lane.all_reduce(self, tensor, op)) is not None:  # (_to_lane: in C)
            return None if r == 1 else self._lane_rest(r, "all_reduce", tensor)
        arr = tensor._data if type(tensor) is Tensor else tensor
        if type(arr) is not np.ndarray:
            return self._all_reduce(tensor, op, async_op)
        nb = arr.nbytes
        if nb >= self.shm_ar_min:
            done = _shmc.all_reduce(self, tensor, arr, op, async_op)
            if done is not _shmc.PASS:
                return done
        if not self.slow and self.rank_ >= 0:
            try:  # (_fast_op and _fast_count inline: at a few bytes every 0.1 µs counts)
                fast = _FAST[op].get(arr.dtype)
            except (KeyError, TypeError):
                fast = None
            if fast is not None:
                flags = arr.flags
                if flags.c_contiguous and flags.writeable:
                    if self.hier is not None and _hier.takes(self, arr):
                        self._fast_count("all_reduce", arr)
                        return _hier.all_reduce(self, tensor, arr, None, op, async_op)
                    s = self.seq = self.seq + 1
                    self.history[s & _MASK] = (s, "all_reduce", arr.dtype, arr.shape)
                    chk = (None if nb < self.health.check_bytes
                           else self._fp_first(s, "all_reduce", arr, op, -1, arr))
                    if 0 < nb <= self.pers_max:
                        key = nb << 32 | fast[2]
                        pers = self.pers or self._new_pers()
                        c = pers.ar.get(key) or pers.all_reduce(key, nb, fast[0], fast[1])
                        if c is not None:  # (None: not the board's, past CEILING: non-blocking)
                            f = c.fast  # the board (shm_tiny.py), from and into arr
                            if not async_op and chk is None:
                                self._to_lane(_REDUCE, nb, 0, arr.dtype, op, c)
                            if f is not None and not (async_op or c.active) and chk is None and (
                                    (r := f.run(s, arr, arr)) == 1
                                    or f.owner.rest(r, arr, arr, "all_reduce", s)):
                                if self.health.fp_tok is not None:  # (checked: settle it)
                                    self._fast_settle(self.health, "all_reduce", s)
                                return None
                            b = memoryview(arr).cast("B")
                            return self._persistent(c, b, b, "all_reduce", s, tensor, arr,
                                                    async_op, chk)
                    req = self.comm.Iallreduce(_IN_PLACE, [arr, fast[0]], fast[1])
                    if chk is not None:
                        req = _fp.Checked(self.health, req, *chk)
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
        h = self.health
        if async_op:
            return Work(self._fp_async(req, s), None, tensors, keep=keep, group=self,
                        describe=lambda: f"rank {self.global_rank}: {op} (#{s} on {self.name})",
                        info=(op, s, "coll", None, None))
        self._fast_wait(h, req, op, s, keep)
        return None

    def _fast_wait(self, h: Any, req: Any, op: str, s: int, keep: Any = None) -> None:
        """Wait (bounded) for blocking call ``s``'s request (``keep``: its buffers, whose size
        sets how long the wait polls before it sleeps), then settle its agreement check."""
        try:
            if not req.Test():
                _wait(h, req, op, s, nbytes=W.bytes_of(keep))
        except MPI.Exception as exc:
            raise self._fast_failed(exc, op, s) from exc
        if h.fp_tok is not None:
            self._fast_settle(h, op, s)

    def _fast_failed(self, exc: BaseException, op: str, s: int) -> BaseException:
        """MPI failed call ``s`` once posted: break the group; the error to raise."""
        self._fp_failed(exc, op, s)
        return self._mpi_error(f"rank {self.global_rank}: {op} (#{s} on {self.name})", exc)

    def _fast_settle(self, h: Any, op: str, s: int) -> None:
        tok = h.fp_tok
        if tok[0] == s and h.fp_node.settle(tok, h):
            h.fp_tok = None  # every member agreed (the common case, without a call)
        else:
            self._fp_settle(op, s)

    def _fast_root(self, root: Any, group_root: Any) -> bool:
        return (type(root) is int and group_root is None and self.identity and not self.slow
                and 0 <= root < self.size_)

    # -- all_reduce out of place (internal: torch's is in place only; all_reduce_into.py) --
    def all_reduce_into(self, output: Any, input: Any, op: Any = _SUM,
                        async_op: bool = False) -> Optional[Work]:
        """Reduce ``input`` with ``op`` over the members into ``output`` (same shape and
        dtype); ``input`` is only read. The same collective as :meth:`all_reduce` to the
        peers; ``output`` may be ``input`` itself (in place), no other overlap."""
        return _into.all_reduce_into(self, output, input, op, async_op, _fast_op)

    @_guarded("all_reduce")
    def _all_reduce(self, tensor: Any, op: Any, async_op: bool) -> Optional[Work]:
        where = self.begin("all_reduce")

        def prepare() -> Any:
            arr = B.unwrap(tensor, "tensor", where)
            B.check_dtype(arr, "tensor", where)
            B.check_writable(arr, "tensor", where)
            plan = B.reduce_plan(arr.dtype, B.coerce_op(op, where), where)
            return arr, plan

        arr, plan = self._maybe_debug(
            where, lambda: self._shaped_sig("all_reduce", tensor, "tensor", where, reduce=str(op)),
            prepare)
        if (self.hier is not None and (hop := _hier.reduction(plan, op, where)) is not None
                and _hier.takes(self, arr)):
            return _hier.all_reduce(self, tensor, *_hier.staged(arr), hop, async_op, plan.average)
        spec, finish = self._reduced_into(arr, plan)
        return self._run(where, lambda: self._iallreduce(spec, plan.mpi_op), finish, async_op,
                         [tensor], keep=spec, check=(arr, B.coerce_op(op, where), -1))

    def broadcast(self, tensor: Any, src: Optional[int] = None, async_op: bool = False,
                  group_src: Optional[int] = None) -> Optional[Work]:
        if (lane := self.lane) is not None and not async_op and group_src is None and (
                r := lane.broadcast(self, tensor, src)) is not None:  # (_to_lane: in C)
            return None if r == 1 else self._lane_rest(
                r, "broadcast", None if src == self.rank_ else tensor)
        arr = tensor._data if type(tensor) is Tensor else tensor
        if type(arr) is np.ndarray and arr.nbytes >= self.shm_min:
            done = _shmc.broadcast(self, tensor, arr, src, async_op, group_src)
            if done is not _shmc.PASS:
                return done
        if (type(arr) is np.ndarray and self.rank_ >= 0 and self._fast_root(src, group_src)
                and (f := arr.flags).c_contiguous and (f.writeable or src == self.rank_)):
            mt = _MOVE.get(arr.dtype)
            if mt is not None:
                s = self._fast_count("broadcast", arr)
                chk = (None if arr.nbytes < self.health.check_bytes
                       else self._fp_first(s, "broadcast", arr, None, src, arr))
                nb = arr.nbytes
                if 0 < nb <= self.pers_max:
                    key = nb << 32 | src
                    pers = self.pers or self._new_pers()
                    c = pers.bc.get(key) or pers.broadcast(key, nb, src)
                    if c is not None:  # (None: not the board's, past CEILING: non-blocking)
                        mine = src == self.rank_
                        f, i, o = c.fast, (arr if mine else None), (None if mine else arr)
                        if not async_op and chk is None:
                            self._to_lane(_BCAST, nb, src, arr.dtype, None, c)
                        if f is not None and not (async_op or c.active) and chk is None and (
                                (r := f.run(s, i, o)) == 1
                                or f.owner.rest(r, i, o, "broadcast", s)):
                            if self.health.fp_tok is not None:  # (checked: settle it)
                                self._fast_settle(self.health, "broadcast", s)
                            return None
                        b = _bytes(arr)
                        return self._persistent(c, b if mine else None, None if mine else b,
                                                "broadcast", s, tensor, arr, async_op, chk)
                req = self.comm.Ibcast([arr, mt], src)
                if chk is not None:
                    req = _fp.Checked(self.health, req, *chk)
                return self._fast_finish(req, "broadcast", s, [tensor], arr, async_op)
        return self._broadcast(tensor, src, async_op, group_src)

    @_guarded("broadcast")
    def _broadcast(self, tensor: Any, src: Optional[int], async_op: bool,
                   group_src: Optional[int]) -> Optional[Work]:
        where = self.begin("broadcast")
        root = self.resolve_peer(src, group_src, "src", where)

        def prepare() -> Any:
            arr = B.unwrap(tensor, "tensor", where)
            mt = B.check_dtype(arr, "tensor", where)
            if self.rank_ != root:
                B.check_writable(arr, "tensor", where)
            return arr, mt

        arr, mt = self._maybe_debug(
            where, lambda: self._shaped_sig("broadcast", tensor, "tensor", where,
                                            root=self.ranks[root]), prepare)
        if self.rank_ == root:
            buf, write_back = B.stage_in(arr), None
        else:
            buf, write_back = B.stage_out(arr)
        spec = [buf, mt]
        return self._run(where, lambda: self._ibcast(spec, root),
                         write_back, async_op, [tensor], keep=spec,
                         check=(arr, None, self.ranks[root]))

    def reduce(self, tensor: Any, dst: Optional[int] = None, op: Any = _SUM,
               async_op: bool = False, group_dst: Optional[int] = None) -> Optional[Work]:
        if (lane := self.lane) is not None and not async_op and group_dst is None and (
                r := lane.reduce(self, tensor, dst, op)) is not None:  # (_to_lane: in C)
            return None if r == 1 else self._lane_rest(
                r, "reduce", tensor if (dst or 0) == self.rank_ else None)
        arr = tensor._data if type(tensor) is Tensor else tensor
        if type(arr) is np.ndarray and arr.nbytes >= self.shm_min:
            done = _shmc.reduce(self, tensor, arr, dst, op, async_op, group_dst)
            if done is not _shmc.PASS:
                return done
        root = 0 if dst is None and group_dst is None else dst
        if (type(arr) is np.ndarray and self.rank_ >= 0 and self._fast_root(root, group_dst)
                and (f := arr.flags).c_contiguous and (f.writeable or root != self.rank_)):
            try:  # (_fast_op, _fast_count and _fp_first's size test inline, as all_reduce's)
                fast = _FAST[op].get(arr.dtype)
            except (KeyError, TypeError):
                fast = None
            if fast is not None:
                s = self.seq = self.seq + 1
                self.history[s & _MASK] = (s, "reduce", arr.dtype, arr.shape)
                nb = arr.nbytes
                chk = (None if nb < self.health.check_bytes
                       else self._fp_first(s, "reduce", arr, op, root, arr))
                if 0 < nb <= self.pers_max:
                    key = (nb, fast[2], root)
                    pers = self.pers or self._new_pers()
                    c = pers.rd.get(key) or pers.reduce(key, nb, fast[0], fast[1], root)
                    if c is not None:  # the board's (a reduce has no persistent request)
                        if not async_op and chk is None:
                            self._to_lane(_ROOTED, nb, root, arr.dtype, op, c)
                        return self._persistent(c, arr, arr if root == self.rank_ else None,
                                                "reduce", s, tensor, arr, async_op, chk)
                if root == self.rank_:
                    req = self.comm.Ireduce(_IN_PLACE, [arr, fast[0]], fast[1], root)
                else:
                    req = self.comm.Ireduce([arr, fast[0]], None, fast[1], root)
                if chk is not None:
                    req = _fp.Checked(self.health, req, *chk)
                return self._fast_finish(req, "reduce", s, [tensor], arr, async_op)
        return self._reduce(tensor, dst, op, async_op, group_dst)

    @_guarded("reduce")
    def _reduce(self, tensor: Any, dst: Optional[int], op: Any, async_op: bool,
                group_dst: Optional[int]) -> Optional[Work]:
        where, root, is_root = self._begin_rooted("reduce", dst, group_dst, "dst")

        def prepare() -> Any:
            arr = B.unwrap(tensor, "tensor", where)
            B.check_dtype(arr, "tensor", where)
            if is_root:
                B.check_writable(arr, "tensor", where)
            return arr, B.reduce_plan(arr.dtype, B.coerce_op(op, where), where)

        arr, plan = self._maybe_debug(
            where, lambda: self._shaped_sig("reduce", tensor, "tensor", where, reduce=str(op),
                                            root=self.ranks[root]), prepare)
        mop = plan.mpi_op
        check = (arr, B.coerce_op(op, where), self.ranks[root])
        if is_root:
            spec, finish = self._reduced_into(arr, plan)
            return self._run(where, lambda: self._ireduce(spec, mop, root), finish,
                             async_op, [tensor], keep=spec, check=check)
        spec = [B.apply_plan_in(B.stage_in(arr), plan), plan.mpi_type]
        return self._run(where, lambda: self._ireduce(spec, mop, root), None, async_op,
                         [tensor], keep=spec, check=check)

    def _reduced_into(self, arr: Any, plan: Any) -> "tuple[list, Any]":
        """The receive spec of a reduction into ``arr`` (staged, and widened as ``plan``
        says) and the step that finishes it: divide for AVG, narrow back, write back."""
        buf, write_back = B.stage_out(arr)
        rbuf, narrow = B.apply_plan_out(buf, plan)
        avg = B.divider(rbuf, self.size_) if plan.average else None
        return [rbuf, plan.mpi_type], B.chain(avg, narrow, write_back)

    def _scattered_into(self, out: Any, flat_in: Any, plan: Any) -> "tuple[list, list, Any]":
        """A reduce-scatter's send and receive specs (``flat_in``: every member's piece end
        to end, converted as ``plan`` says, apart from ``out``'s memory) and its finish."""
        sbuf = B.apply_plan_in(flat_in, plan)
        rspec, finish = self._reduced_into(out, plan)
        return [B.unalias(sbuf, rspec[0]), plan.mpi_type], rspec, finish

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

    def _shaped_sig(self, op: str, x: Any, name: str, where: str, **extra: Any) -> dict:
        """Debug mode: the signature of a call on one buffer ``x``, its shape included."""
        arr = B.unwrap(x, name, where)
        return self.signature(op, arr, shape=tuple(arr.shape), **extra)

    def _out_in(self, output: Any, input: Any, out_name: str, in_name: str,
                where: str) -> tuple:
        """The arrays of a collective from ``input`` into another ``output``: one dtype MPI
        moves, ``output`` writable. Returns ``(out, inp, MPI datatype)``."""
        out = B.unwrap(output, out_name, where)
        inp = B.unwrap(input, in_name, where)
        mt = B.check_dtype(inp, in_name, where)
        B.check_same_dtype(inp, out, in_name, out_name, where)
        B.check_writable(out, out_name, where)
        return out, inp, mt

    def _check_group_times(self, whole: Any, part: Any, whole_name: str, part_name: str,
                           where: str) -> None:
        """Raise ValueError unless ``whole`` has group size × ``part``'s elements (the
        gathered or scattered side of a collective)."""
        if whole.size != part.size * self.size_:
            raise ValueError(
                f"{where}: {whole_name} has {whole.size} elements but needs group size × "
                f"{part_name} size = {self.size_} × {part.size} = {part.size * self.size_} "
                f"({whole_name.split('_')[0]} shape {tuple(whole.shape)}, {part_name} shape "
                f"{tuple(part.shape)})")

    def _begin_rooted(self, op: str, global_root: Optional[int], group_root: Optional[int],
                      what: str) -> "tuple[str, int, bool]":
        """Begin collective ``op`` with a root: its error prefix, the root's group rank (0 when
        neither rank is given) and whether this rank is the root."""
        where = self.begin(op)
        root = self.root_rank(global_root, group_root, what, where)
        return where, root, self.rank_ == root

    def _root_list(self, lst: Any, what: str, role: str, where: str, ref: Any) -> list:
        """On the root of gather or scatter: ``lst``, one tensor per member with ``ref``'s
        shape and dtype (required there)."""
        if lst is None:
            raise ValueError(f"{where}: {what} is required on the {role} rank "
                             f"(a list of {self.size_} tensors)")
        return self._out_list(lst, what, where, ref, "tensor")

    def _root_sig(self, op: str, arr: Any, root: int, lst: Any, where: str,
                  gathers: bool) -> dict:
        """Debug mode: the signature of gather (``gathers``) or scatter: the root's list moves
        one piece per member, every member's ``arr`` one piece to or from the root."""
        one = [None] * self.size_
        one[root] = arr.size
        many = None if lst is None else [B.unwrap(x, "", where).size for x in lst]
        send, recv = (one, many) if gathers else (many, one)
        return self.signature(op, arr, root=self.ranks[root], send=send, recv=recv)

    def all_gather(self, tensor_list: Any, tensor: Any, async_op: bool = False) -> Optional[Work]:
        arr = tensor._data if type(tensor) is Tensor else tensor
        if type(arr) is np.ndarray and arr.nbytes * self.size_ >= self.shm_min:
            done = _shmc.all_gather(self, tensor_list, tensor, arr, async_op)
            if done is not _shmc.PASS:
                return done
        # (the board's limit: pers_max where there is none, never more where there is)
        if (type(arr) is np.ndarray and 0 < arr.nbytes * self.size_ <= self.board_most("all_gather")
                and self.rank_ >= 0 and not self.slow and arr.flags.c_contiguous
                and arr.dtype in _MOVE):
            dst = self._fast_list(tensor_list, arr)
            if dst is not None:  # a small call (persistent.py) the general path would take
                s = self._fast_count("all_gather", arr)
                nb = arr.nbytes
                chk = (None if nb < self.health.check_bytes
                       else self._fp_first(s, "all_gather", arr, None, -1, arr))
                pers = self.pers or self._new_pers()
                return self._persistent(pers.ag.get(nb) or pers.all_gather(nb), _bytes(arr),
                                        dst, "all_gather", s, list(tensor_list), arr,
                                        async_op, chk)
        if type(arr) is np.ndarray and _gp2p.takes(self, arr.nbytes * self.size_):
            done = _gp2p.fast(self, tensor_list, tensor, arr, async_op)
            if done is not _gp2p.PASS:
                return done
        return self._all_gather(tensor_list, tensor, async_op)

    @_guarded("all_gather")
    def _all_gather(self, tensor_list: Any, tensor: Any, async_op: bool) -> Optional[Work]:
        where = self.begin("all_gather")

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
            return self.signature("all_gather", arr, shape=tuple(arr.shape),
                             send=[arr.size] * self.size_, recv=outs)

        arr, mt, outs = self._maybe_debug(where, sig, prepare)
        if _gp2p.takes(self, arr.nbytes * self.size_):  # messages straight into the entries
            bufs, back = _gp2p.targets(outs)
            return self._run(where, lambda: _gp2p.start(self, arr, bufs, mt), back, async_op,
                             list(tensor_list), keep=(arr, bufs), check=(arr, None, -1))
        # MPI_Allgather (as raw mpi4py), received where it costs least: straight into the
        # entries where they lie end to end in one buffer (list(out.chunk(n))), else into a
        # flat buffer copied out; a blocking large call reuses the group's last one, whose
        # pages are already mapped (a fresh output-sized temporary per call cost its page
        # faults: issue 29). Only the local receive buffer differs: every rank makes the
        # same MPI call.
        rbuf, copy_out = self._gather_target(arr, outs, async_op)
        sbuf = [B.unalias(B.stage_in(arr), rbuf), mt]
        rspec = [rbuf, mt]
        return self._run(where, lambda: self._iallgather(sbuf, rspec), copy_out, async_op,
                         list(tensor_list), keep=(sbuf, rspec), check=(arr, None, -1))

    def _gather_target(self, arr: Any, outs: list, async_op: bool) -> tuple:
        """all_gather's receive buffer (MPI writes it whole) and the step that fills the
        entries from it (None when the buffer is the entries' own memory)."""
        whole = _end_to_end(outs)
        if whole is not None:
            return whole, None
        total = arr.size * self.size_
        xp = array_module(arr)
        if arr.nbytes < self.health.check_bytes or async_op or xp is not np:
            # zeros: never expose uninitialised memory, even if a peer sent too little (the
            # agreement check that rules that out covers the large calls only)
            flat = xp.zeros(total, dtype=arr.dtype)
        else:  # a large blocking call: the shapes are checked alike on every rank
            flat = self._gather_buf
            if flat is None or flat.dtype != arr.dtype or flat.size < total:
                flat = np.empty(total, arr.dtype)
            self._gather_buf = flat
            flat = flat[:total]
        counts, displs = B.counts_displs([arr.size] * self.size_)
        return self._staged_list_out(flat, outs, counts, displs)

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
        if (lane := self.lane) is not None and not async_op and (
                r := lane.all_gather(self, output, input)) is not None:  # (_to_lane: in C)
            return None if r == 1 else self._lane_rest(r, "all_gather_into_tensor", output)
        out = output._data if type(output) is Tensor else output
        inp = input._data if type(input) is Tensor else input
        if type(out) is np.ndarray and out.nbytes >= self.shm_min:
            done = _shmc.all_gather_into_tensor(self, output, out, inp, async_op)
            if done is not _shmc.PASS:
                return done
        if self.rank_ >= 0 and not self.slow:
            mt = B.move_pair(out, inp)
            if mt is not None and out.size == inp.size * self.size_:
                if self.hier is not None and _hgather.takes(self, out):
                    self._fast_count("all_gather_into_tensor", inp)
                    return _hgather.all_gather(self, output, out, None, inp, async_op)
                s = self._fast_count("all_gather_into_tensor", inp)
                chk = (None if inp.nbytes < self.health.check_bytes
                       else self._fp_first(s, "all_gather_into_tensor", inp, None, -1, (out, inp)))
                if 0 < out.nbytes <= self.pers_max:
                    pers, nb = self.pers or self._new_pers(), inp.nbytes
                    c = pers.ag.get(nb) or pers.all_gather(nb)
                    if c is not None:  # (None: not the board's, past CEILING: non-blocking)
                        f = c.fast
                        if not async_op and chk is None:
                            self._to_lane(_GATHER, nb, 0, inp.dtype, None, c)
                        if f is not None and not (async_op or c.active) and chk is None and (
                                (r := f.run(s, inp, out)) == 1
                                or f.owner.rest(r, inp, out, "all_gather_into_tensor", s)):
                            if self.health.fp_tok is not None:  # (checked: settle it)
                                self._fast_settle(self.health, "all_gather_into_tensor", s)
                            return None
                        return self._persistent(c, _bytes(inp), _bytes(out),
                                                "all_gather_into_tensor", s, output, (out, inp),
                                                async_op, chk)
                req = (_gp2p.start_flat(self, inp, out, mt) if _gp2p.flat_takes(self, out.nbytes)
                       else self.comm.Iallgather([inp, mt], [out, mt]))
                if chk is not None:
                    req = _fp.Checked(self.health, req, *chk)
                return self._fast_finish(req, "all_gather_into_tensor", s, [output],
                                         (out, inp), async_op)
        return self._all_gather_into_tensor(output, input, async_op)

    @_guarded("all_gather_into_tensor")
    def _all_gather_into_tensor(self, output: Any, input: Any,
                                async_op: bool) -> Optional[Work]:
        where = self.begin("all_gather_into_tensor")

        def prepare() -> Any:
            out, inp, mt = self._out_in(output, input, "output_tensor", "input_tensor", where)
            self._check_group_times(out, inp, "output_tensor", "input", where)
            return out, inp, mt

        out, inp, mt = self._maybe_debug(
            where, lambda: self._shaped_sig("all_gather_into_tensor", input, "input_tensor", where),
            prepare)
        if self.hier is not None and _hgather.takes(self, out):
            return _hgather.all_gather(self, output, *_hier.staged(out), _hgather.host_in(inp),
                                       async_op)
        rbuf, write_back = B.stage_out(out)
        sspec, rspec = [B.unalias(B.stage_in(inp), rbuf), mt], [rbuf, mt]
        return self._run(where, lambda: self._iallgather(sspec, rspec), write_back, async_op,
                         [output], keep=(sspec, rspec), check=(inp, None, -1))

    def _rooted(self, op: str, tensor: Any, lst: Any, global_root: Optional[int],
                group_root: Optional[int]) -> tuple:
        """Begin gather or scatter and check its arguments (in debug mode, agree on them):
        ``(where, root's group rank, is_root, array, MPI datatype, the root's list or None)``.
        gather writes its list (on the root), scatter its tensor (on every rank)."""
        gathers = op == "gather"
        what, role, name = (("gather_list", "destination", "dst") if gathers
                            else ("scatter_list", "source", "src"))
        where, root, is_root = self._begin_rooted(op, global_root, group_root, name)

        def prepare() -> Any:
            arr = B.unwrap(tensor, "tensor", where)
            mt = B.check_dtype(arr, "tensor", where)
            if not gathers:
                B.check_writable(arr, "tensor", where)
            arrs = self._root_list(lst, what, role, where, arr) if is_root else None
            if gathers and is_root:
                for i, o in enumerate(arrs):
                    B.check_writable(o, f"{what}[{i}]", where)
            return arr, mt, arrs

        def sig() -> dict:
            return self._root_sig(op, B.unwrap(tensor, "tensor", where), root,
                                  lst if is_root else None, where, gathers)

        return (where, root, is_root) + tuple(self._maybe_debug(where, sig, prepare))

    @_guarded("gather")
    def gather(self, tensor: Any, gather_list: Any = None, dst: Optional[int] = None,
               async_op: bool = False, group_dst: Optional[int] = None) -> Optional[Work]:
        where, root, is_root, arr, mt, outs = self._rooted("gather", tensor, gather_list, dst,
                                                           group_dst)
        sspec = [B.stage_in(arr), mt]
        comm = self.comm
        check = (arr, None, self.ranks[root])
        if not is_root:
            return self._run(where, lambda: comm.Igather(sspec, None, root), None, async_op, [],
                             keep=sspec, check=check)
        counts, displs = B.counts_displs([arr.size] * self.size_)
        flat = array_module(arr).zeros(sum(counts), dtype=arr.dtype)
        rbuf, copy_out = self._staged_list_out(flat, outs, counts, displs)
        rspec = [rbuf, mt]
        return self._run(where, lambda: comm.Igather(sspec, rspec, root), copy_out, async_op,
                         list(gather_list), keep=(sspec, rspec), check=check)

    @_guarded("scatter")
    def scatter(self, tensor: Any, scatter_list: Any = None, src: Optional[int] = None,
                async_op: bool = False, group_src: Optional[int] = None) -> Optional[Work]:
        where, root, is_root, arr, mt, ins = self._rooted("scatter", tensor, scatter_list, src,
                                                          group_src)
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

    def reduce_scatter(self, output: Any, input_list: Any, op: Any = _SUM,
                       async_op: bool = False) -> Optional[Work]:
        out = output._data if type(output) is Tensor else output
        if type(out) is np.ndarray and out.nbytes * self.size_ >= self.shm_min:
            done = _shmc.reduce_scatter(self, output, out, input_list, op, async_op)
            if done is not _shmc.PASS:
                return done
        return self._reduce_scatter(output, input_list, op, async_op)

    @_guarded("reduce_scatter")
    def _reduce_scatter(
            self, output: Any, input_list: Any, op: Any, async_op: bool) -> Optional[Work]:
        where = self.begin("reduce_scatter")

        def prepare() -> Any:
            out = B.unwrap(output, "output", where)
            B.check_dtype(out, "output", where)
            B.check_writable(out, "output", where)
            ins = self._out_list(input_list, "input_list", where, out, "output")
            return out, ins, B.reduce_plan(out.dtype, B.coerce_op(op, where), where)

        def sig() -> dict:
            out = B.unwrap(output, "output", where)
            return self.signature("reduce_scatter", out, reduce=str(op),
                             send=[B.unwrap(x, "", where).size for x in input_list],
                             recv=[out.size] * self.size_)

        out, ins, plan = self._maybe_debug(where, sig, prepare)
        counts = [a.size for a in ins]
        sspec, rspec, finish = self._scattered_into(out, self._packed_in(ins), plan)
        comm, mop = self.comm, plan.mpi_op
        # (every count is equal: the messages of scatter_p2p.py where it takes the call)
        post = ((lambda: _sp2p.start(self, sspec[0], rspec[0], sspec[1], mop))
                if _sp2p.takes(self, sspec[0].nbytes, sspec[0].dtype, mop)
                else (lambda: comm.Ireduce_scatter(sspec, rspec, counts, mop)))
        return self._run(where, post, finish, async_op, [output], keep=(sspec, rspec),
                         check=(out, B.coerce_op(op, where), -1))

    def reduce_scatter_tensor(self, output: Any, input: Any, op: Any = _SUM,
                              async_op: bool = False) -> Optional[Work]:
        if (lane := self.lane) is not None and not async_op and (
                r := lane.reduce_scatter(self, output, input, op)) is not None:  # (in C)
            return None if r == 1 else self._lane_rest(r, "reduce_scatter_tensor", output)
        out = output._data if type(output) is Tensor else output
        inp = input._data if type(input) is Tensor else input
        if type(out) is np.ndarray and inp.nbytes >= self.shm_min:
            done = _shmc.reduce_scatter_tensor(self, output, out, inp, op, async_op)
            if done is not _shmc.PASS:
                return done
        if self.rank_ >= 0 and not self.slow and B.move_pair(out, inp) is not None \
                and inp.size == out.size * self.size_:
            fast = _fast_op(op, inp.dtype)
            if fast is not None:
                if self.hier is not None and _hscatter.takes(self, inp):
                    self._fast_count("reduce_scatter_tensor", inp)
                    return _hscatter.reduce_scatter(self, output, out, None, inp, op, async_op)
                s = self._fast_count("reduce_scatter_tensor", inp)
                chk = (None if inp.nbytes < self.health.check_bytes
                       else self._fp_first(s, "reduce_scatter_tensor", inp, op, -1, (out, inp)))
                if 0 < inp.nbytes <= self.pers_max:
                    nb = out.nbytes
                    key = nb << 32 | fast[2]
                    pers = self.pers or self._new_pers()
                    c = pers.rs.get(key) or pers.reduce_scatter(key, nb, fast[0], fast[1])
                    if c is not None:  # (None: not the board's, past CEILING: non-blocking)
                        f = c.fast
                        if not async_op and chk is None:
                            self._to_lane(_PART, inp.nbytes, 0, inp.dtype, op, c)
                        if f is not None and not (async_op or c.active) and chk is None and (
                                (r := f.run(s, inp, out)) == 1
                                or f.owner.rest(r, inp, out, "reduce_scatter_tensor", s)):
                            if self.health.fp_tok is not None:  # (checked: settle it)
                                self._fast_settle(self.health, "reduce_scatter_tensor", s)
                            return None
                        return self._persistent(c, _bytes(inp), _bytes(out),
                                                "reduce_scatter_tensor", s, output, (out, inp),
                                                async_op, chk)
                # (messages reduced here in rank order: scatter_p2p.py, past the board only)
                req = (_sp2p.start(self, inp, out, fast[0], fast[1])
                       if _sp2p.takes(self, inp.nbytes, inp.dtype, fast[1]) else
                       self.comm.Ireduce_scatter_block([inp, fast[0]], [out, fast[0]], fast[1]))
                if chk is not None:
                    req = _fp.Checked(self.health, req, *chk)
                return self._fast_finish(req, "reduce_scatter_tensor", s, [output],
                                         (out, inp), async_op)
        return self._reduce_scatter_tensor(output, input, op, async_op)

    @_guarded("reduce_scatter_tensor")
    def _reduce_scatter_tensor(self, output: Any, input: Any, op: Any,
                               async_op: bool) -> Optional[Work]:
        where = self.begin("reduce_scatter_tensor")

        def prepare() -> Any:
            out, inp, _ = self._out_in(output, input, "output", "input", where)
            self._check_group_times(inp, out, "input", "output", where)
            return out, inp, B.reduce_plan(out.dtype, B.coerce_op(op, where), where)

        out, inp, plan = self._maybe_debug(
            where, lambda: self._shaped_sig("reduce_scatter_tensor", input, "input", where,
                                            reduce=str(op)), prepare)
        if (self.hier is not None and (hop := _hier.reduction(plan, op, where)) is not None
                and _hscatter.takes(self, inp)):
            return _hscatter.reduce_scatter(self, output, *_hier.staged(out),
                                            _hgather.host_in(inp), hop, async_op, plan.average)
        sspec, rspec, finish = self._scattered_into(out, B.stage_in(inp), plan)
        mop = plan.mpi_op
        return self._run(where, lambda: self._ireduce_scatter_block(sspec, rspec, mop), finish,
                         async_op, [output], keep=(sspec, rspec),
                         check=(inp, B.coerce_op(op, where), -1))

    @_guarded("all_to_all")
    def all_to_all(self, output_tensor_list: Any, input_tensor_list: Any,
                   async_op: bool = False) -> Optional[Work]:
        where = self.begin("all_to_all")

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
            return self.signature("all_to_all", ins[0], send=[a.size for a in ins], recv=outs)

        ins, outs, mt = self._maybe_debug(where, sig, prepare)
        scounts, sdispls = B.counts_displs([a.size for a in ins])
        rcounts, rdispls = B.counts_displs([o.size for o in outs])
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
            mt = B.move_pair(out, inp)
            if (mt is not None and inp.shape == out.shape
                    and inp.shape[0] % self.size_ == 0):
                s = self._fast_count("all_to_all_single", out)
                chk = self._fp_first(s, "all_to_all_single", out, None, -1, (out, inp))
                req = self.comm.Ialltoall([inp, mt], [out, mt])
                if chk is not None:
                    req = _fp.Checked(self.health, req, *chk)
                return self._fast_finish(req, "all_to_all_single", s, [output], (out, inp),
                                         async_op)
        elif (self.rank_ >= 0 and not self.slow
              and not (_no_splits(input_split_sizes) and _no_splits(output_split_sizes))):
            # (both [] is torch's even split, as both None: MPI_Alltoall on the general path)
            mt = B.move_pair(out, inp)
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
        h = self.health
        row = 1
        for d in inp.shape[1:]:
            row *= d
        sc, sd = B.counts_displs([v * row for v in sends])
        rc, rd = B.counts_displs([v * row for v in recvs])
        s = self._fast_count("all_to_all_single", out)
        req = self.comm.Ialltoallv([inp, (sc, sd), mt], [out, (rc, rd), mt])
        if h.check_bytes < OFF_BYTES:  # the split sizes, checked by any size
            node = h.fp_node
            if node is not None and node.board >= 0:
                h.fp_tok = node.post_splits(s, "all_to_all_single", sc, rc,
                                            "output_split_sizes", row, inp.dtype, (out, inp))
            else:
                req = _fp.Splits(h, req, "all_to_all_single", s, sc, rc, "output_split_sizes",
                                 row, inp.dtype, (out, inp))
        return self._fast_finish(req, "all_to_all_single", s, [output], (out, inp), async_op)

    @_guarded("all_to_all_single")
    def _all_to_all_single(self, output: Any, input: Any, output_split_sizes: Any,
                           input_split_sizes: Any, async_op: bool) -> Optional[Work]:
        where = self.begin("all_to_all_single")

        def prepare() -> Any:
            out, inp, mt = self._out_in(output, input, "output", "input", where)
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
            return self.signature("all_to_all_single", inp, send=sc, recv=rc,
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
            sspec = [sbuf, B.counts_displs(scounts), mt]
            rspec = [rbuf, B.counts_displs(rcounts), mt]
            nonblocking = comm.Ialltoallv
        return self._run(where, lambda: nonblocking(sspec, rspec),
                         write_back, async_op, [output], keep=(sspec, rspec),
                         check=(out, None, -1) if even else None,
                         splits=None if even else (scounts, rcounts, "output_split_sizes",
                                                   row, inp.dtype))

    @_guarded("barrier")
    def barrier(self, async_op: bool = False) -> Optional[Work]:
        where = self.begin("barrier")
        self.count_call("barrier")
        if self.debug:
            self.agree(where, self.signature("barrier"), None)
        comm = self.comm
        return self._run(where, comm.Ibarrier, None, async_op)

