"""Persistent MPI-4 collectives for a group's small calls (issue 29).

Posting a non-blocking collective (``Iallreduce`` and its kin) and testing it cost about twice
what MPICH's blocking call does at a few bytes (3.8 against 2.1 µs, 2 ranks, MPICH 5.0.2), so
our blocking collectives, which run on the non-blocking calls to stay bounded, were slower than
raw mpi4py's. A persistent request (MPI-4 ``Allreduce_init``, ``Allgather_init``,
``Reduce_scatter_block_init``, ``Bcast_init``), made once and started per call, costs what the
blocking call does and is still a request: the group's bounded wait, its dead-peer checks and
async work are unchanged.

A persistent request is bound to its buffers, so each :class:`Call` owns buffers of its own:
the call's data is copied in and the result out (0.1-0.2 µs at these sizes). Calls whose
buffer holds at most :data:`CEILING` bytes take this path (the size where it stopped paying,
measured: docs/benchmarks-collectives.md).

**Every member must pick the same request.** MPI matches a persistent collective by the order
in which the members made their requests, and one member's persistent call never matches
another's non-blocking one. So the choice depends only on what every member of a correct
program passes alike (the operation, the byte count, the MPI datatype, the reduction, the
root), never on the local buffer (its address, layout, NumPy or CuPy, Tensor or array) nor on
``async_op``: every path of the group that reaches MPI with such a call comes here. At most
:data:`CAP` requests of each kind are kept per group; the oldest made is freed first, the same
on every member. A request still running for an earlier async call of the same key is waited
for (bounded, as any wait) before it starts again.

Requests are freed with their group, and those of groups alive at exit before MPI finalizes
(MPICH warns of each one left, and an active one is left alone: MPI forbids freeing it).
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any, Callable, Optional

import numpy as np
from mpi4py import MPI

from ....tensor import Tensor
from ...health import fingerprint as _fp
from ...health import watchdog as W
from ...process_group import Work
from . import gather_p2p as _gp2p
from . import scatter_p2p as _sp2p

#: the largest buffer (bytes: all_reduce's and broadcast's tensor, all_gather's output,
#: reduce_scatter's input) that runs on a persistent request
CEILING = 4096
#: persistent requests kept per group and kind of collective
CAP = 16

_IN_PLACE = MPI.IN_PLACE
_BYTE = MPI.BYTE
_wait = W.wait
_live: "weakref.WeakSet[Cache]" = weakref.WeakSet()
_hooked = False


def ceiling() -> int:
    """:data:`CEILING` where this MPI has persistent collectives (MPI-4), else -1 (none)."""
    ok = MPI.Get_version() >= (4, 0) and all(
        hasattr(MPI.Comm, f) for f in ("Allreduce_init", "Allgather_init", "Bcast_init",
                                       "Reduce_scatter_block_init"))
    return CEILING if ok else -1


_kinds: dict = {}


def kind(mt: Any, mop: Any = None) -> int:
    """A small number for an MPI datatype and reduction (or none), part of a request's key: its
    byte count shifted left by 32 bits, ored with this (numbered in this process only: a key
    names a request locally; which requests exist is what every member must agree on)."""
    pair = (mt.handle, None if mop is None else mop.handle)
    k = _kinds.get(pair)
    if k is None:
        k = _kinds[pair] = len(_kinds) + 1
    return k


def as_bytes(arr: np.ndarray) -> memoryview:
    """The bytes of a contiguous NumPy array (bfloat16, which has no buffer format, too)."""
    try:
        return memoryview(arr).cast("B")
    except ValueError:
        return memoryview(arr.reshape(-1).view(np.uint8))


def _host_bytes(x: Any) -> memoryview:
    return as_bytes(x if type(x) is np.ndarray else np.ascontiguousarray(x.get()))


def deliver(res: memoryview, dst: Any) -> None:
    """Copy a result's bytes into ``dst``: a byte view, a list of them (one per member's part),
    an array (NumPy, or CuPy through the host) or a function given the bytes."""
    if type(dst) is memoryview:
        dst[:] = res
    elif type(dst) is list:
        step = len(res) // len(dst)
        for i, d in enumerate(dst):
            d[:] = res[i * step:(i + 1) * step]
    elif type(dst) is np.ndarray:
        as_bytes(dst)[:] = res
    elif callable(dst):
        dst(res)
    else:  # a device array (CUDA-aware MPI staged it there)
        dst.set(np.frombuffer(res, dst.dtype).reshape(dst.shape))


class Call:
    """One persistent request and the buffers it is bound to: ``into`` takes this member's
    data, ``out`` holds the result once it completed."""

    __slots__ = ("req", "bufs", "into", "out", "active", "gen", "dst", "label", "fast")

    def __init__(self, req: Any, bufs: tuple, into: memoryview, out: memoryview) -> None:
        self.req, self.bufs, self.into, self.out = req, bufs, into, out
        self.active = False
        # a board call's spec (shm_tiny.py), which a blocking call runs straight from and
        # into the caller's buffers (``run``, then its ``owner.rest``), else None
        self.fast: Any = None
        self.gen = 0  # starts so far: a handle of an earlier start sees it is over
        self.dst: Any = None
        self.label = ("", 0)

    def post(self, h: Any, src: Any, dst: Any, op: str, seq: int) -> "Started":
        """Copy ``src`` in, start, and return the handle that delivers into ``dst``."""
        if self.active:
            self.settle(h)
        if src is not None:  # (None: a broadcast's receivers, whose data is not read)
            self.into[:] = src if type(src) is memoryview else _host_bytes(src)
        self.req.Start()
        self.active, self.dst, self.label = True, dst, (op, seq)
        self.gen += 1
        return Started(self, self.gen)

    def settle(self, h: Any) -> None:
        """Wait (bounded) for the earlier async call still running on this request."""
        op, seq = self.label
        W.wait(h, self, op, seq)

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI request protocol
        if not self.req.Test(status):
            return False
        self.active = False
        dst, self.dst = self.dst, None
        if dst is not None:
            deliver(self.out, dst)
        return True

    def free(self) -> bool:
        """Free the request unless a call still runs on it (MPI forbids that); say whether."""
        if self.active or self.req is None:
            return False
        self.req.Free()
        self.req = None
        return True


class Started:
    """The request of one start of a :class:`Call` (async work, or the general path)."""

    __slots__ = ("call", "gen")

    def __init__(self, call: Call, gen: int) -> None:
        self.call, self.gen = call, gen

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI request protocol
        c = self.call
        if c.gen != self.gen or not c.active:  # delivered already (a later start waited)
            return True
        return c.Test(status)


class Cache:
    """A group's persistent requests, by kind and key (see the module docstring)."""

    __slots__ = ("comm", "n", "rank", "ar", "ag", "rs", "bc", "rd", "left", "lane",
                 "__weakref__")

    def __init__(self, comm: Any) -> None:
        global _hooked
        self.comm, self.n, self.rank = comm, comm.Get_size(), comm.Get_rank()
        self.ar: dict = {}
        self.ag: dict = {}
        self.rs: dict = {}
        self.bc: dict = {}
        self.rd: dict = {}  # reduces to one root: the board's only (shm_tiny.Cache.reduce)
        self.left: list = []  # evicted while a call ran on them: freed once they are done
        self.lane: Any = None  # the group's lane (SmallCalls.lane): it holds only calls held here
        _live.add(self)
        if not _hooked:
            _hooked = True
            atexit.register(_at_exit)  # after mpi4py's hook (LIFO): runs while MPI is up

    def _add(self, kinds: dict, key: tuple, make: Callable[[], Call]) -> Call:
        if len(kinds) >= CAP:  # the oldest made goes first: the same choice on every member
            old = kinds.pop(next(iter(kinds)))
            if self.lane is not None:
                self.lane.empty()  # (what it held is here, or was: it fills again)
            if not old.free():
                self.left.append(old)
        c = kinds[key] = make()
        if self.left:
            self.left = [o for o in self.left if not o.free()]
        return c

    # Each kind's dict maps a key (below) to its Call. The callers look a key up themselves
    # (the common case costs one dict lookup) and call these on a miss.
    def all_reduce(self, key: int, nbytes: int, mt: Any, mop: Any) -> Call:
        """key: ``nbytes << 32 | kind(mt, mop)``."""
        def make() -> Call:
            buf = np.empty(nbytes, np.uint8)
            whole = memoryview(buf)
            req = self.comm.Allreduce_init(_IN_PLACE, [buf, nbytes // mt.extent, mt], mop)
            return Call(req, (buf,), whole, whole)
        return self._add(self.ar, key, make)

    def all_gather(self, nbytes: int) -> Call:
        """key: ``nbytes``, each member's part (the output holds ``n`` of them, in order)."""
        def make() -> Call:
            buf = np.empty(nbytes * self.n, np.uint8)
            whole = memoryview(buf)
            req = self.comm.Allgather_init(_IN_PLACE, [buf, _BYTE])
            mine = whole[self.rank * nbytes:(self.rank + 1) * nbytes]
            return Call(req, (buf,), mine, whole)
        return self._add(self.ag, nbytes, make)

    def reduce_scatter(self, key: int, nbytes: int, mt: Any, mop: Any) -> Call:
        """key: ``nbytes << 32 | kind(mt, mop)``, ``nbytes`` each member's part of the
        result (the input holds ``n`` of them)."""
        def make() -> Call:
            sbuf = np.empty(nbytes * self.n, np.uint8)
            rbuf = np.empty(nbytes, np.uint8)
            req = self.comm.Reduce_scatter_block_init([sbuf, mt], [rbuf, mt], mop)
            return Call(req, (sbuf, rbuf), memoryview(sbuf), memoryview(rbuf))
        return self._add(self.rs, key, make)

    def broadcast(self, key: int, nbytes: int, root: int) -> Call:
        """key: ``nbytes << 32 | root``."""
        def make() -> Call:
            buf = np.empty(nbytes, np.uint8)
            whole = memoryview(buf)
            return Call(self.comm.Bcast_init([buf, _BYTE], root), (buf,), whole, whole)
        return self._add(self.bc, key, make)

    def reduce(self, key: tuple, nbytes: int, mt: Any, mop: Any, root: int) -> Optional[Call]:
        """key: ``(nbytes, kind(mt, mop), root)``. None: a reduce to one root has no
        persistent request here (the caller's ``Ireduce``); a board computes it."""
        return None

    def free(self) -> None:
        """Free every request no call runs on (the group is being destroyed, or MPI ends)."""
        for kinds in (self.ar, self.ag, self.rs, self.bc, self.rd):
            for c in kinds.values():
                c.free()
            kinds.clear()
        self.left = [o for o in self.left if not o.free()]
        _live.discard(self)


def _at_exit() -> None:
    """Free the requests of groups still alive, before MPI finalizes."""
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    for cache in list(_live):
        cache.free()


class SmallCalls:
    """The group's side of it (a mixin of the MPI group's collectives: ``self`` is the group):
    its :class:`Cache`, made at the first small call, and the steps its calls share."""

    # calls of at most pers_max bytes run on persistent requests (-1: none, this MPI has no
    # persistent collectives; empty calls never do)
    pers_max: int = ceiling()
    pers: Any = None
    # the small calls' board in shared memory (shm_tiny.py), made with the group where it can
    tiny: Any = None
    # the blocking calls on the board that took the fast path, which the next call of that
    # kind, size, root, dtype and op takes in C (``_tiny.Lane``: shm_tiny.Board.lane), while
    # the group has a board; else None
    lane: Any = None
    # the sizes (bytes of output) of all-gathers into one buffer that take messages
    # (gather_p2p.flat_takes): past what the board takes, where it timed them to win
    gather_msgs: tuple = (0, 0)

    def board_most(self, name: str) -> int:
        """The largest ``name`` call ("all_gather", "reduce_scatter", ...; bytes as the fast
        paths count them) that the group's small calls take: its board's limit for that kind
        (``shm_tiny.limits``, at most ``pers_max``), else ``pers_max``. The paths for the sizes
        past it (gather_p2p.py, scatter_p2p.py) take calls from there."""
        t = self.tiny
        return self.pers_max if t is None else t.most_by_name[name]

    def _new_pers(self) -> Any:
        if self.tiny is not None:  # a board in shared memory takes what it computes
            self.pers = self.tiny.cache(self.comm)
            self.lane = self.pers.lane = self.tiny.lane()
        else:
            self.pers = Cache(self.comm)
        return self.pers

    def _to_lane(self, kind: int, nbytes: int, root: int, dtype: Any, op: Any, c: Call) -> None:
        """Put the board call ``c`` (one that ran, or would have, from a blocking fast path:
        its ``fast`` spec) on the group's lane, by kind (shm_tiny's), bytes, root, dtype and
        op. The lane holds only calls the cache holds (it starts over where the cache lets
        one go), at most ``_tiny.LANE_SLOTS`` / 2."""
        if self.lane is not None and c.fast is not None:
            self.lane.add(kind, nbytes, root, dtype, op, c)

    def _lane_rest(self, r: int, op: str, dst: Any) -> None:
        """What is left of a blocking call the lane posted and did not end (``r``: 0, not
        read yet; -1 - k, member k made it otherwise): the board's bounded wait reads it
        into ``dst`` (a tensor or array; None: this member reads nothing), or raises."""
        dst = None if dst is None else getattr(dst, "_data", dst)
        self.lane.last.owner.rest(r, None, dst, op, self.seq)

    def free_persistent(self) -> None:
        """Free the group's persistent requests (when the group is destroyed)."""
        lane, self.lane = self.lane, None
        if lane is not None:
            lane.close()  # (it holds the fault word's segment open)
        if self.pers is not None:
            self.pers.free()
            self.pers = None

    def _persistent(self, c: Any, src: Any, dst: Any, op: str, s: int, result: Any,
                    keep: Any, async_op: bool, chk: Any) -> Optional[Work]:
        """Run fast-path call ``s`` on the persistent request ``c``: the bytes ``src`` (or a
        contiguous NumPy array's) in, the result into ``dst`` (see ``persistent.deliver``);
        ``result``: the tensor (or list of them) an async work returns."""
        h = self.health
        f = c.fast  # a board call (shm_tiny.py): straight from src into dst where it can
        if f is not None and not (async_op or c.active or chk is not None) \
                and type(dst) is not list \
                and ((r := f.run(s, src, dst)) == 1 or f.owner.rest(r, src, dst, op, s)):
            if h.fp_tok is not None:  # an agreement check posted with the call: settle it
                self._fast_settle(h, op, s)
            return None
        if async_op or chk is not None or c.active:
            req = c.post(h, src, dst, op, s)
            if chk is not None:
                req = _fp.Checked(h, req, *chk)
            return self._fast_finish(req, op, s, result if type(result) is list else [result],
                                     keep, async_op)
        if src is not None:
            c.into[:] = src if type(src) is memoryview else as_bytes(src)
        req = c.req
        req.Start()
        c.active = True
        try:
            if not req.Test():
                _wait(h, req, op, s)
        except MPI.Exception as exc:
            raise self._fast_failed(exc, op, s) from exc
        c.active = False
        if h.fp_tok is not None:
            self._fast_settle(h, op, s)
        if type(dst) is memoryview:
            dst[:] = c.out
        elif dst is not None:
            deliver(c.out, dst)
        return None

    # The general paths' MPI calls: on the group's persistent request where the call is small
    # (the choice of every member alike, whichever path each took), else the non-blocking
    # call.
    def _iallreduce(self, spec: list, mop: Any, into: Optional[list] = None) -> Any:
        """``into``: the receive spec of an all_reduce out of place (all_reduce_into.py,
        the same collective to the peers), else in place."""
        buf, mt = spec
        nb = buf.nbytes
        c = None
        if 0 < nb <= self.pers_max:
            pers, key = self.pers or self._new_pers(), nb << 32 | kind(mt, mop)
            c = pers.ar.get(key) or pers.all_reduce(key, nb, mt, mop)
        if c is None:  # (also a call past CEILING that the group's board does not compute)
            if into is not None:
                return self.comm.Iallreduce(spec, into, mop)
            return self.comm.Iallreduce(_IN_PLACE, spec, mop)
        return c.post(self.health, buf, buf if into is None else into[0], "all_reduce",
                      self.seq)

    def _iallgather(self, sspec: list, rspec: list) -> Any:
        c = None
        if 0 < rspec[0].nbytes <= self.pers_max:
            pers, nb = self.pers or self._new_pers(), sspec[0].nbytes
            c = pers.ag.get(nb) or pers.all_gather(nb)
        if c is None:
            if _gp2p.flat_takes(self, rspec[0].nbytes):  # as the fast path's
                return _gp2p.start_flat(self, sspec[0], rspec[0], sspec[1])
            return self.comm.Iallgather(sspec, rspec)
        return c.post(self.health, sspec[0], rspec[0], self.opname, self.seq)

    def _ireduce_scatter_block(self, sspec: list, rspec: list, mop: Any) -> Any:
        (sbuf, mt), rbuf = sspec, rspec[0]
        c = None
        if 0 < sbuf.nbytes <= self.pers_max:
            pers, nb = self.pers or self._new_pers(), rbuf.nbytes
            key = nb << 32 | kind(mt, mop)
            c = pers.rs.get(key) or pers.reduce_scatter(key, nb, mt, mop)
        if c is None:
            if _sp2p.takes(self, sbuf.nbytes, sbuf.dtype, mop):  # as the fast path's
                return _sp2p.start(self, sbuf, rbuf, mt, mop)
            return self.comm.Ireduce_scatter_block(sspec, rspec, mop)
        return c.post(self.health, sbuf, rbuf, self.opname, self.seq)

    def _ireduce(self, spec: list, mop: Any, root: int) -> Any:
        """A reduce of ``spec`` to member ``root`` (in place there): on the group's board where
        it computes the call (the fast path's choice too), else MPI's ``Ireduce``."""
        buf, mt = spec
        nb = buf.nbytes
        c = None
        if 0 < nb <= self.pers_max:
            pers, key = self.pers or self._new_pers(), (nb, kind(mt, mop), root)
            c = pers.rd.get(key) or pers.reduce(key, nb, mt, mop, root)
        mine = self.rank_ == root
        if c is None:
            if mine:
                return self.comm.Ireduce(_IN_PLACE, spec, mop, root)
            return self.comm.Ireduce(spec, None, mop, root)
        return c.post(self.health, buf, buf if mine else None, "reduce", self.seq)

    def _ibcast(self, spec: list, root: int) -> Any:
        buf = spec[0]
        nb = buf.nbytes
        c = None
        if 0 < nb <= self.pers_max:
            pers, key = self.pers or self._new_pers(), nb << 32 | root
            c = pers.bc.get(key) or pers.broadcast(key, nb, root)
        if c is None:
            return self.comm.Ibcast(spec, root)
        mine = self.rank_ == root
        return c.post(self.health, buf if mine else None, None if mine else buf, self.opname,
                      self.seq)

    def _fast_list(self, lst: Any, arr: np.ndarray) -> Optional[list]:
        """The bytes of each entry of all_gather's ``lst`` (see :meth:`_fast_entries`)."""
        entries = self._fast_entries(lst, arr)
        return None if entries is None else [as_bytes(o) for o in entries]

    def _fast_entries(self, lst: Any, arr: np.ndarray) -> Optional[list]:
        """The entries of all_gather's ``lst`` where every one is a contiguous writable NumPy
        array (or a Tensor holding one) of ``arr``'s dtype and shape, one per member; else
        None (the general path says what is wrong)."""
        if type(lst) not in (list, tuple) or len(lst) != self.size_:
            return None
        dt, shape, entries = arr.dtype, arr.shape, []
        for x in lst:
            o = x._data if type(x) is Tensor else x
            if type(o) is not np.ndarray or o.dtype != dt or o.shape != shape:
                return None
            f = o.flags
            if not (f.c_contiguous and f.writeable):
                return None
            entries.append(o)
        return entries
