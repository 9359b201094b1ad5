"""Node-local collectives through shared memory: the MPI group's calls that take the engine.

On a group whose ranks all share one node, ``all_reduce`` (in place, or out of place: the
group's ``all_reduce_into``, whose input is only read), ``reduce_scatter`` (tensor and list
forms), ``all_gather`` (tensor and list forms), ``broadcast`` and ``reduce`` of NumPy arrays
can go through one shared segment (:mod:`shm_pipe`: a chunk pipeline in which every member
reduces its share of each chunk, in rank order) instead of MPI. MPICH's own node-local
collectives move every byte through small shared cells, piece by piece, once per peer; here
each byte of a member's buffer is copied into the segment at most once, the members reduce in
parallel, and the result is bitwise the same on every member (the fixed-order reduction
``x0 op x1 op ... op x(p-1)``). Where every member may read every other's memory (Linux
cross-memory attach, probed when the engine is made and agreed by all), the calls take the
direct path instead (:mod:`shm_direct`): the segment carries only addresses and step counters,
and each member reads its peers' buffers where they lie.

**When.** On groups that ``MPI_Comm_split_type(SHARED)`` finds whole on one node (asked when the
group is made). ``MPITENSOR_SHM_COLLECTIVES`` (read then too): ``off`` never; ``on`` whenever
the group can (for tests); ``auto`` (default) where it pays. A call qualifies by what every rank
of a correct program passes alike (its size, dtype, op; never contiguity or layout: a
non-contiguous buffer is staged), so every member takes the same path. The first call of at
least :data:`FLOOR` bytes (``auto``; where the group's board takes larger calls, the first past
those: ``shm_tiny.make``) makes the group's engine, collectively: rank 0 creates the segment,
without a name where Linux can (``memfd_create``: the members open it as
``/proc/<pid>/fd/<fd>``) or else in /dev/shm, the members learn where it is through one small
reduction on the group's private communicator, map it, and agree; rank 0 closes its descriptor
(or removes the name) as soon as every member mapped it (or gave up), so nothing is left behind
however the job ends, even where rank 0 dies before that. Where that fails (no memory, a full
``/dev/shm``) every member learns it in the same reduction and the group stays on MPI for good.
In ``auto`` the members then measure, together, the engine and MPI on an all-reduce, a
reduce-scatter and an all-gather at four sizes (:data:`_CAL_BYTES`), in pairs whose order
alternates, each timed call after an untimed one of its own kind and a barrier; each pair
counts with its slowest member's times, a size's ratio of engine to MPI is the median of its
pairs' (a size whose pairs disagree is measured once more), and a call takes the engine only
from the size where its kind's ratio, drawn between the sizes (past the largest, held), stays
at most 0.9 for every larger size (never below :data:`FLOOR`). Debug mode
(``MPITENSOR_DEBUG``) keeps every call on MPI, where its checks are.

**Checks and faults.** Every call through the engine posts its fingerprint in the group's
agreement slots (``fingerprint.NodeCheck``, whatever its size) and waits for its peers' before
any data moves, so a rank that passes another shape, dtype, op or root gets the same
``CollectiveMismatchError`` as on the MPI path. A rank whose size put it on MPI's path while
its peers took the engine (a mismatch across the threshold) posts no fingerprint they could
wait for: they find it in the watchdog's arrival notices, waiting in the same call without
having taken the engine, and raise the mismatch (``Engine.check_entered``). Every wait is the
watchdog's (timeout, fault notices, stall reports) and also notices a peer process that died
(``shm_pipe``).

**async_op=True** completes the call before returning (a completed ``Work``; an error of the
call itself, a mismatch say, is raised by its ``wait()``, as on the MPI path).

**Reductions** are NumPy's ufuncs: SUM/AVG ``add`` (AVG then divides by the group size),
PRODUCT ``multiply``, MIN/MAX ``minimum``/``maximum`` (a NaN wins, as in torch), the bitwise
ops on integers and bool; bool SUM/PRODUCT are logical or/and, as on the MPI path; float16 and
bfloat16 are reduced in float32 and rounded once, as on the MPI path.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
from mpi4py import MPI

from .... import dtypes as _dt
from ...._base import config as _config
from ...._base.config import OFF_BYTES
from ....errors import MpiTensorError
from ...health import faults as _faults
from ...health import watchdog as W
from ...health.state import MASK
from ...process_group import ReduceOp, Work
from . import buffers as B
from . import cma as _cma
from . import shm as _shm
from . import shm_direct as _direct
from . import shm_pipe as P
from .shm_pipe import Engine, Reducer, bounds

PASS = object()  # "not through shared memory": the caller takes the MPI path
# auto: calls smaller than this stay on MPI without asking the engine (MPI's latency wins
# there; measured, 2 ranks on 2 cores, the engine's all_reduce pays from 256 KiB, its
# reduce_scatter from 512 KiB-1 MiB); a group whose board (shm_tiny.py) takes larger calls
# asks it only past those (shm_tiny.make)
FLOOR = 256 << 10
_PREFIX = "mpitensor-coll-"
_TOKEN_AT = 7 * 8  # where rank 0 signs a new segment (a word of its control line no one uses)
_MARGIN = 0.9  # auto: the engine's modelled time must be this fraction of MPI's, or less
# the calibration's sizes: MPI's time per byte changes where its buffers outgrow the caches,
# so a line through two small sizes missed what large calls cost
_CAL_BYTES = (256 << 10, 1 << 20, 4 << 20, 16 << 20)
# ... and where the engine loses at the largest of them, once more at this size: at 16 MiB
# MPI's buffers may still sit in a cache (MPICH's all_reduce of 64 MiB took 3x the engine's
# where its 16 MiB one took 1.1-1.5x), so holding that ratio past it sent every larger call
# to MPI in some runs
_CAL_LARGE = 64 << 20
_KINDS = ("reduce", "scatter", "move")  # the thresholds' kinds of call
_CAL_PAIRS = 5  # the calibration's (engine, MPI) pairs per size and kind, to 1 MiB
_CAL_PAIRS_LARGE = 3  # and above (most of its time: a 16 MiB pair costs a 1 MiB one's 16)
_DOUBT = 1.2  # a point whose median ratio lies this close to _MARGIN is measured once more

_UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
           ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum,
           ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
           ReduceOp.BXOR: np.bitwise_xor}
_BOOL = {ReduceOp.SUM: np.maximum, ReduceOp.PRODUCT: np.minimum}
_reducers: dict = {}
_use_cma = True  # groups made from now on may take the direct path (tests: set_direct)
_anonymous = True  # rank 0 makes the segment without a name where it can (tests: False)
_direct_chunk = _direct.CHUNK  # their direct reductions' piece (tests: set_chunk)


def floor(g: Any) -> int:
    """The smallest call (bytes) that asks the engine, for a new group ``g`` (its attribute
    ``shm_min``): OFF_BYTES where it can never apply (switch off, one member, not a member, no
    shared agreement slots: another machine, no /dev/shm, not x86-64)."""
    setting = _config.shm_collectives()
    h = g.health
    g.shm_direct = _use_cma  # whether its engine, once made, probes for the direct path
    if setting == "off" or g.comm is None or g.size_ < 2 or h.fp_node is None:
        return OFF_BYTES
    # collective, but every member is making the group now: MPI's view of the node (the
    # segment would map across network namespaces too, which are nodes to MPI)
    local = g.comm.Split_type(MPI.COMM_TYPE_SHARED)
    whole = g.one_node = local.Get_size() == g.size_
    local.Free()
    if not whole:
        g.shm = False
        return OFF_BYTES
    return 1 if setting == "on" else FLOOR


def free(g: Any) -> None:
    """Unmap the group's segment (its name was removed when it was made)."""
    eng = getattr(g, "shm", None)
    g.shm = False
    g.shm_min = g.shm_ar_min = OFF_BYTES
    if isinstance(eng, Engine):
        eng.close()


def set_chunk(nbytes: int) -> int:
    """Tests: the slot size of engines made from now on (a multiple of 64), also the piece
    the direct path reduces at a time; the old one."""
    global _direct_chunk
    old, P.CHUNK = P.CHUNK, max(64, nbytes // 64 * 64)
    _direct_chunk = _direct.CHUNK if P.CHUNK == P.DEFAULT_CHUNK else P.CHUNK
    return old


def set_direct(use: bool) -> bool:
    """Tests: whether the engines of groups made from now on may take the direct path
    (cross-memory reads, where every member can); the old setting."""
    global _use_cma
    old, _use_cma = _use_cma, bool(use)
    return old


def _reducer(op: Any, dtype: np.dtype, p: int) -> "tuple[Any, Optional[Reducer]]":
    """``(ReduceOp, Reducer)`` for ``op`` on ``dtype``, or ``(None, None)`` where the MPI path
    must answer (an op it refuses, which it words)."""
    try:
        rop = B.coerce_op(op, "")
    except (ValueError, TypeError):
        return None, None
    key = (rop, dtype, p)
    red = _reducers.get(key)
    if red is None:
        plan = B._plan(dtype, rop) if dtype in B.MOVE_TYPES else "unsupported"
        if isinstance(plan, str):
            return None, None
        if _dt.kind_of(dtype) == "b":
            red = Reducer(_BOOL.get(rop, _UFUNCS[rop]), None, 0, np.dtype(np.uint8))
        else:
            red = Reducer(_UFUNCS[rop], plan.upcast, p if plan.average else 0, None)
        _reducers[key] = red
    return rop, red


def _flat(arr: np.ndarray, write: bool) -> "tuple[np.ndarray, Optional[Callable[[], None]]]":
    """``arr`` as one flat contiguous array, and the step that writes a staged copy back."""
    if arr.flags.c_contiguous:
        return arr.reshape(-1), None
    buf = np.ascontiguousarray(arr).reshape(-1)
    if not write:
        return buf, None

    def back() -> None:
        arr[...] = buf.reshape(arr.shape)

    return buf, back


# ---------------------------------------------------------------------------- a call's start
def _start(g: Any, op: str, kind: str, nbytes: int, fparr: Any, reduce: Any, root: int,
           keep: Any, counted: Any, async_op: bool) -> Any:
    """Begin call ``op`` through the engine: its engine, the call counted, its fingerprint
    posted; None where it takes the MPI path (on every member alike); for ``async_op``, a
    ``_Failed`` where making the engine raised (its ``wait()`` raises)."""
    eng = g.shm
    if g.rank_ < 0 or eng is False or (eng is not None and nbytes < eng.thresholds[kind]):
        return None  # (MPI's path, with nothing counted or posted here)
    if g.slow:
        if g.debug:
            return None
        g.check_usable(op)  # a broken group raises; an earlier failure is settled
    h = g.health
    s = g.seq + 1
    before = g.history[s & MASK]
    g._fast_count(op, counted)  # (a wait while the engine is made is this call's)
    h.fp_tok = h.fp_node.post(s, op, fparr, reduce, root, keep)  # peers' waits compare it
    if eng is None:
        try:
            eng = g.shm = _setup(g, s, op)
        except MpiTensorError as exc:
            if not async_op:
                raise
            return _Failed(exc, op, s)
        # calls below every kind's threshold no longer ask (a call that asks and takes MPI's
        # path cost about 2 µs more than one that does not: 4 % of a 512 KiB all_gather)
        g.shm_min = OFF_BYTES if eng is False else max(g.shm_min, min(eng.thresholds.values()))
        g.shm_ar_min = OFF_BYTES if eng is False else max(g.shm_ar_min, eng.thresholds["reduce"])
    if eng is False or nbytes < eng.thresholds[kind]:
        # MPI's path counts the call itself (and posts its fingerprint again where it checks
        # this size): nothing was sent for it here
        h.fp_tok = None
        g.seq, g.history[s & MASK] = s - 1, before
        return None
    g.sent += 1
    eng.op, eng.seq = op, s
    if not eng.cma:  # (a direct call says so when it arrives: Engine.arrive)
        eng.publish(P.CALL, s)  # this rank takes the engine for call s (see _Entered)
    return eng


def _execute(g: Any, eng: Engine, body: Callable[[], None], tensors: list,
             async_op: bool) -> Optional[Work]:
    """Wait for every member's fingerprint, then run ``body`` (the pipeline); anything that
    ends it early breaks the group (members may be anywhere in it). For ``async_op`` a
    completed Work, or one whose ``wait()`` raises the call's error, as MPI's would."""
    op, s = eng.op, eng.seq
    if type(eng) is _Failed:
        return _work(g, eng, tensors, op, s)
    try:
        if eng.cma:  # the call's arrival waits for every member, then settles (Engine.arrive)
            eng.enter = lambda: g._fp_settle(op, s)
        else:
            W.wait(g.health, _Entered(eng, s), op, s)
            g._fp_settle(op, s)
        body()
    except BaseException as exc:
        h = g.health
        if h.broken is None:
            text = str(exc).splitlines()[0][:200] if str(exc) else ""
            _faults.break_after(h, op, s, "coll", f"{type(exc).__name__}: {text} (raised in "
                                "a collective through shared memory)")
        if not async_op or not isinstance(exc, MpiTensorError):
            raise
        return _work(g, _Failed(exc, op, s), tensors, op, s)
    finally:
        eng.enter = P._nothing  # (the calibration's calls settle nothing)
    return _work(g, _COMPLETE, tensors, op, s) if async_op else None


def _work(g: Any, request: Any, tensors: list, op: str, s: int) -> Work:
    return Work(request, None, tensors, group=g,
                describe=lambda: f"rank {g.global_rank}: {op} (#{s} on {g.name})",
                info=(op, s, "coll", None, None))


class _Entered:
    """The wait for every member to take the segment's pipeline for call ``s``, as an MPI
    request (a direct call waits so in ``Engine.arrive``).

    A member that passed a size on the other side of the engine's threshold (a mismatched
    call) took the MPI path instead and posted no fingerprint this rank could wait for: it
    shows up waiting in call ``s`` in the watchdog's arrival notices without having entered
    the engine, and this rank raises CollectiveMismatchError (``Engine.check_entered``:
    breaking the group, which ends that member's MPI wait too) instead of waiting out the
    timeout. A member whose process is gone ends the wait with PeerFailedError
    (``Engine.check_alive``)."""

    __slots__ = ("eng", "s")
    moves_data = False  # its Test reads flags: the watchdog's Backoff

    def __init__(self, eng: Engine, s: int) -> None:
        self.eng, self.s = eng, s

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI's request protocol
        q, s, line = self.eng.q, self.s, P._LINE
        return all(q[r * line + P.CALL] >= s for r in self.eng.everyone)

    def before_check(self) -> None:
        # a member not there yet may be gone (killed after the last call): found here first,
        # before the watchdog's MPI calls, which may end the whole job on meeting it
        eng, s, line = self.eng, self.s, P._LINE
        for r in eng.everyone:
            if eng.q[r * line + P.CALL] < s:
                eng.check_alive(r)
            eng.check_entered(r)


class _Complete:
    """The request of a call the engine completed before returning."""

    @staticmethod
    def Test(status: Any = None) -> bool:  # noqa: N802 - MPI's request protocol
        return True


_COMPLETE = _Complete()


class _Failed:
    """The request of an async call that failed: testing it raises the call's error."""

    __slots__ = ("error", "op", "seq")

    def __init__(self, error: BaseException, op: str, seq: int) -> None:
        self.error, self.op, self.seq = error, op, seq

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI's request protocol
        raise self.error


# ---------------------------------------------------------------------------- the collectives
def all_reduce(g: Any, tensor: Any, arr: np.ndarray, op: Any, async_op: bool) -> Any:
    rop, red = _reducer(op, arr.dtype, g.size_)
    if red is None or not arr.flags.writeable or not arr.size:
        return PASS
    eng = _start(g, "all_reduce", "reduce", arr.nbytes, arr, rop, -1, arr, arr, async_op)
    if eng is None:
        return PASS
    buf, back = _flat(arr, True)
    return _execute(g, eng, lambda: _reduce_core(eng, buf, red, -1, back), [tensor], async_op)


def all_reduce_into(g: Any, output: Any, out: np.ndarray, inp: np.ndarray, op: Any,
                    async_op: bool) -> Any:
    """all_reduce of ``inp`` into ``out`` (the same shape and dtype, apart: the caller
    checked that they share no memory); ``inp`` is only read. The same call to the engine's
    members as an all_reduce in place (its fingerprint, its kind's threshold), with the
    result written where the input would have been copied from."""
    rop, red = _reducer(op, inp.dtype, g.size_)
    if (red is None or type(inp) is not np.ndarray or inp.dtype != out.dtype
            or inp.shape != out.shape or not out.flags.writeable or not out.size):
        return PASS
    eng = _start(g, "all_reduce", "reduce", inp.nbytes, inp, rop, -1, (out, inp), inp,
                 async_op)
    if eng is None:
        return PASS
    src = _flat(inp, False)[0]
    dest, back = _flat(out, True)
    return _execute(g, eng, lambda: _reduce_core(eng, src, red, -1, back, dest), [output],
                    async_op)


def reduce(g: Any, tensor: Any, arr: np.ndarray, dst: Any, op: Any, async_op: bool,
           group_dst: Any) -> Any:
    rop, red = _reducer(op, arr.dtype, g.size_)
    try:
        root = g.root_rank(dst, group_dst, "dst", "")
    except (ValueError, TypeError):
        return PASS
    if red is None or not arr.size or (root == g.rank_ and not arr.flags.writeable):
        return PASS
    eng = _start(g, "reduce", "reduce", arr.nbytes, arr, rop, g.ranks[root], arr, arr,
                 async_op)
    if eng is None:
        return PASS
    buf, back = _flat(arr, root == g.rank_)
    return _execute(g, eng, lambda: _reduce_core(eng, buf, red, root, back), [tensor],
                    async_op)


def _reduce_core(eng: Engine, buf: np.ndarray, red: Reducer, root: int,
                 back: Optional[Callable[[], None]], out: Optional[np.ndarray] = None) -> None:
    """all_reduce (``root`` -1) or reduce to ``root`` of the flat ``buf``; an all_reduce
    with ``out`` (flat, ``buf``'s length, apart from it) writes there and only reads ``buf``."""
    if eng.cma:
        if root < 0:
            _direct.all_reduce(eng, buf, red, out)
        else:
            _direct.reduce(eng, buf, red, root)
        if back is not None:
            back()
        return
    p, me, dt, n = eng.p, eng.me, buf.dtype, buf.size
    ce = eng.chunk // dt.itemsize
    keeps = root < 0 or root == me
    dest = buf if out is None else out

    def fill(k: int, st: int) -> None:
        x = buf[k * ce:min(n, k * ce + ce)]
        b = bounds(x.size, p)
        slot = eng.typed(st, me, dt, 0, x.size)
        slot[:b[me]] = x[:b[me]]
        slot[b[me + 1]:] = x[b[me + 1]:]

    def work(k: int, st: int) -> None:
        lo = k * ce
        b = bounds(min(n, lo + ce) - lo, p)
        a, z = b[me], b[me + 1]
        if a == z:
            return
        mine = eng.typed(st, me, dt, a, z)
        red.into(mine, [buf[lo + a:lo + z] if r == me else eng.typed(st, r, dt, a, z)
                        for r in range(p)])
        if keeps:
            dest[lo + a:lo + z] = mine

    def drain(k: int, st: int) -> None:
        lo = k * ce
        b = bounds(min(n, lo + ce) - lo, p)
        for r in range(p):
            if r != me:
                dest[lo + b[r]:lo + b[r + 1]] = eng.typed(st, r, dt, b[r], b[r + 1])

    eng.run(-(-n // ce), fill, work, drain if keeps else None, eng.everyone)
    if back is not None:
        back()


def reduce_scatter_tensor(g: Any, output: Any, out: np.ndarray, inp: np.ndarray, op: Any,
                          async_op: bool) -> Any:
    p = g.size_
    if (type(inp) is not np.ndarray or inp.dtype != out.dtype or inp.size != out.size * p
            or not out.flags.writeable or not out.size):
        return PASS
    rop, red = _reducer(op, out.dtype, p)
    if red is None:
        return PASS
    eng = _start(g, "reduce_scatter_tensor", "scatter", inp.nbytes, inp, rop, -1, (out, inp),
                 inp, async_op)
    if eng is None:
        return PASS
    segs = _pieces(_flat(inp, False)[0], p)
    return _execute(g, eng, lambda: _scatter_core(eng, out, segs, red), [output], async_op)


def reduce_scatter(g: Any, output: Any, out: Any, input_list: Any, op: Any,
                   async_op: bool) -> Any:
    p = g.size_
    ins = _same_list(input_list, out, p)
    if ins is None or not out.flags.writeable or not out.size:
        return PASS
    rop, red = _reducer(op, out.dtype, p)
    if red is None:
        return PASS
    eng = _start(g, "reduce_scatter", "scatter", out.nbytes * p, out, rop, -1, (out, ins), out,
                 async_op)
    if eng is None:
        return PASS
    segs = [_flat(x, False)[0] for x in ins]
    return _execute(g, eng, lambda: _scatter_core(eng, out, segs, red), [output], async_op)


def _pieces(flat: np.ndarray, p: int) -> List[np.ndarray]:
    """``flat`` cut into ``p`` equal consecutive pieces (views)."""
    m = flat.size // p
    return [flat[r * m:(r + 1) * m] for r in range(p)]


def _same_list(lst: Any, ref: np.ndarray, p: int) -> Optional[List[np.ndarray]]:
    """The NumPy arrays of a list of ``p`` tensors of ``ref``'s shape and dtype, else None
    (the MPI path says what is wrong)."""
    if not isinstance(lst, (list, tuple)) or len(lst) != p:
        return None
    arrs = [getattr(x, "_data", x) for x in lst]
    for a in arrs:
        if type(a) is not np.ndarray or a.dtype != ref.dtype or a.shape != ref.shape:
            return None
    return arrs


def _scatter_core(eng: Engine, out: np.ndarray, segs: List[np.ndarray], red: Reducer) -> None:
    """Reduce-scatter: member r's ``out`` is the reduction of every member's ``segs[r]``."""
    p, me, dt = eng.p, eng.me, out.dtype
    dest, back = _flat(out, True)
    if eng.cma:
        # peers read this member's pieces but its own while it writes dest
        if any(np.may_share_memory(dest, s) for r, s in enumerate(segs) if r != me):
            segs = [s.copy() for s in segs]
        _direct.reduce_scatter(eng, dest, segs, red)
        if back is not None:
            back()
        return
    if any(np.may_share_memory(dest, s) for s in segs):
        segs = [s.copy() for s in segs]  # the in-place idiom: out is one of the pieces
    m = dest.size
    ce = eng.chunk // (p * dt.itemsize)

    def fill(k: int, st: int) -> None:
        lo, hi = k * ce, min(m, k * ce + ce)
        for r in range(p):
            if r != me:
                eng.typed(st, me, dt, r * ce, r * ce + hi - lo)[...] = segs[r][lo:hi]

    def work(k: int, st: int) -> None:
        lo, hi = k * ce, min(m, k * ce + ce)
        L = hi - lo
        red.into(dest[lo:hi], [segs[me][lo:hi] if r == me else
                               eng.typed(st, r, dt, me * ce, me * ce + L) for r in range(p)])

    eng.run(-(-m // ce), fill, work, None, eng.everyone)
    if back is not None:
        back()


def all_gather_into_tensor(g: Any, output: Any, out: np.ndarray, inp: np.ndarray,
                           async_op: bool) -> Any:
    p = g.size_
    if (type(inp) is not np.ndarray or inp.dtype != out.dtype or out.size != inp.size * p
            or not out.flags.writeable or not inp.size or inp.dtype not in B.MOVE_TYPES):
        return PASS
    eng = _start(g, "all_gather_into_tensor", "move", out.nbytes, inp, None, -1, (out, inp),
                 inp, async_op)
    if eng is None:
        return PASS
    dest, back = _flat(out, True)
    outs = _pieces(dest, p)
    return _execute(g, eng, lambda: _gather_core(eng, inp, outs, back), [output], async_op)


def all_gather(g: Any, tensor_list: Any, tensor: Any, arr: np.ndarray, async_op: bool) -> Any:
    p = g.size_
    outs = _same_list(tensor_list, arr, p)
    if (outs is None or not arr.size or arr.dtype not in B.MOVE_TYPES
            or not all(o.flags.writeable for o in outs)):
        return PASS
    eng = _start(g, "all_gather", "move", arr.nbytes * p, arr, None, -1, (outs, arr), arr,
                 async_op)
    if eng is None:
        return PASS
    flats, backs = zip(*(_flat(o, True) for o in outs))
    back = _chain([b for b in backs if b is not None])
    return _execute(g, eng, lambda: _gather_core(eng, arr, list(flats), back),
                    list(tensor_list), async_op)


def _chain(steps: list) -> Optional[Callable[[], None]]:
    if not steps:
        return None

    def run() -> None:
        for step in steps:
            step()

    return run


def _gather_core(eng: Engine, inp: np.ndarray, outs: List[np.ndarray],
                 back: Optional[Callable[[], None]]) -> None:
    """All-gather: every member's ``outs[r]`` (flat) receives member r's ``inp``."""
    p, me = eng.p, eng.me
    src = _flat(inp, False)[0]
    if any(np.may_share_memory(src, o) for o in outs):
        if not (src.__array_interface__ == outs[me].__array_interface__):
            src = src.copy()  # overlaps another member's place: read before it is written
    src, outs = src.view(np.uint8), [o.view(np.uint8) for o in outs]
    if eng.cma:
        _direct.all_gather(eng, src, outs)
        if back is not None:
            back()
        return
    m, u8 = src.size, src.dtype
    ce = eng.chunk

    def fill(k: int, st: int) -> None:
        lo, hi = k * ce, min(m, k * ce + ce)
        eng.typed(st, me, u8, 0, hi - lo)[...] = src[lo:hi]
        if outs[me] is not src:
            outs[me][lo:hi] = src[lo:hi]

    def drain(k: int, st: int) -> None:
        lo, hi = k * ce, min(m, k * ce + ce)
        for r in range(p):
            if r != me:
                outs[r][lo:hi] = eng.typed(st, r, u8, 0, hi - lo)

    eng.run(-(-m // ce), fill, None, drain, eng.everyone)
    if back is not None:
        back()


def broadcast(g: Any, tensor: Any, arr: np.ndarray, src: Any, async_op: bool,
              group_src: Any) -> Any:
    try:
        root = g.resolve_peer(src, group_src, "src", "")
    except (ValueError, TypeError):
        return PASS
    mine = root == g.rank_
    if not arr.size or arr.dtype not in B.MOVE_TYPES or not (mine or arr.flags.writeable):
        return PASS
    eng = _start(g, "broadcast", "move", arr.nbytes, arr, None, g.ranks[root], arr, arr,
                 async_op)
    if eng is None:
        return PASS
    buf, back = _flat(arr, not mine)
    return _execute(g, eng, lambda: _bcast_core(eng, buf, root, back), [tensor], async_op)


def _bcast_core(eng: Engine, buf: np.ndarray, root: int,
                back: Optional[Callable[[], None]]) -> None:
    me = eng.me
    raw = buf.view(np.uint8)
    if eng.cma:
        _direct.broadcast(eng, raw, root)
        if back is not None:
            back()
        return
    m, u8, ce = raw.size, raw.dtype, eng.chunk

    def fill(k: int, st: int) -> None:
        lo, hi = k * ce, min(m, k * ce + ce)
        eng.typed(st, root, u8, 0, hi - lo)[...] = raw[lo:hi]

    def drain(k: int, st: int) -> None:
        lo, hi = k * ce, min(m, k * ce + ce)
        raw[lo:hi] = eng.typed(st, root, u8, 0, hi - lo)

    eng.run(-(-m // ce), fill if me == root else None, None, drain if me != root else None,
            (root,))
    if back is not None:
        back()


# ---------------------------------------------------------------------------- making the engine
def _exchange(h: Any, v: np.ndarray, mop: Any, s: int, op: str) -> None:
    """An in-place reduction of ``v`` over the group's private communicator, waited for as
    any collective (timeout, fault notices, the agreement slots' mismatch check)."""
    mt = MPI.INT64_T if v.dtype == np.int64 else MPI.DOUBLE
    req = h.diag.Iallreduce(MPI.IN_PLACE, [v, mt], mop)
    W.wait(h, req, op, s)


def _setup(g: Any, s: int, op: str) -> Any:
    """Collective: the group's Engine, or False on every member where it cannot have one."""
    h = g.health
    size = P.segment_bytes(g.size_, P.CHUNK)
    fd, path = _make_segment(size) if g.rank_ == 0 and _shm.usable() else (None, None)
    eng = None
    try:
        # the segment's name (4 words) or pid and fd; its kind; the token written in it
        v = np.zeros(6, np.int64)
        if fd is not None or path is not None:
            v[5] = _sign(fd, path)
        if fd is not None:
            v[:2], v[4] = (os.getpid(), fd), 2
        elif path is not None:
            v[:4], v[4] = np.frombuffer(os.path.basename(path)[-32:].encode(), np.int64), 1
        _exchange(h, v, MPI.MAX, s, op)
        _agreed_before_setup(h, s)
        if v[4]:
            where = (f"/proc/{v[0]}/fd/{v[1]}" if v[4] == 2 else os.path.join(
                _shm.DIR, _PREFIX + v[:4].tobytes().decode("ascii", "replace")))
            mm = _shm.attach(where, size)
            if mm is not None and int.from_bytes(mm[_TOKEN_AT:_TOKEN_AT + 8], "little") != v[5]:
                mm.close()  # another process's file (a pid namespace of its own): not ours
                mm = None
            eng = Engine(g, mm, P.CHUNK) if mm is not None else None
        mark = np.array([os.getpid()], np.int64)  # what the peers' probes read
        if eng is not None:
            _direct.probe_row(eng, mark)
        ok = np.array([int(eng is not None)], np.int64)
        _exchange(h, ok, MPI.MIN, s, op)
    finally:
        # every member has mapped it or given up: its name (or descriptor) goes
        if fd is not None:
            os.close(fd)
        elif path is not None:
            _shm.remove(path)
    if not ok[0]:
        if eng is not None:
            eng.close()
        return False
    eng.op, eng.seq = op, s
    if getattr(g, "shm_direct", True):
        # every member may read every peer's memory, or none uses the direct path
        can = np.array([int(_cma.available() and _direct.probe(eng)), 0], np.int64)
        can[1] = can[0] and _direct.probe_write(eng)
        _exchange(h, can, MPI.MIN, s, op)
        if can[0]:
            _direct.setup(eng, _direct_chunk)
            eng.puts = bool(can[1])
    if g.shm_min <= 1:  # "on": always
        eng.thresholds = {"reduce": 0, "scatter": 0, "move": 0}
    else:
        eng.thresholds = _calibrate(eng, g, s, op)
    return eng


def _agreed_before_setup(h: Any, s: int) -> None:
    """Raise call ``s``'s mismatch (on every member alike) before the engine is made.

    Each member posted its fingerprint of call ``s`` before its part of the exchange just
    completed, so every slot is final: a call that disagrees is refused here, by every member
    at the same point. Found later, inside the calibration's own calls, it would end them on
    the member that saw it first while a peer still reads that member's buffers (which it
    frees): the peer's read fails with a bare EFAULT instead of the mismatch."""
    tok = h.fp_tok
    if tok is not None and tok[0] == s:
        h.fp_node.settle(tok, h)  # raises CollectiveMismatchError where a member differs
    if h.tiny is not None:
        # every member makes call s alike: where none gets the engine, those that learn it
        # first may post call s on the small calls' board while a slower one still waits in
        # the last exchange, whose watchdog must not take their posts for a mismatch
        h.tiny.settled = s


def _make_segment(size: int) -> "tuple[Optional[int], Optional[str]]":
    """Rank 0: a new segment, ``(fd, None)`` without a name where Linux can make one, else
    ``(None, path)`` in /dev/shm, or ``(None, None)`` where neither can be made."""
    made = _shm.create_anonymous(size) if _anonymous else None
    if made is not None:
        return made[0], None
    return None, _shm.create(_PREFIX, size)


def _sign(fd: Optional[int], path: Optional[str]) -> int:
    """Rank 0: write a random token into the new segment (where no member uses it: word 7 of
    member 0's control line); the peers check it once they mapped the segment."""
    token = int.from_bytes(os.urandom(8), "little") >> 1
    own = fd if fd is not None else os.open(path, os.O_RDWR)
    try:
        os.pwrite(own, token.to_bytes(8, "little"), _TOKEN_AT)
    finally:
        if fd is None:
            os.close(own)
    return token


def best_time(fn: Callable[[], None], reps: int = 3) -> float:
    """The shortest of ``reps`` timed calls of ``fn`` (seconds); the cost models' probe."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _calibrate(eng: Engine, g: Any, s: int, op: str) -> dict:
    """The group's thresholds, measured: per kind ("reduce": all_reduce and reduce;
    "scatter": reduce_scatter; "move": all_gather and broadcast), the size from which the
    engine's time is at most _MARGIN of MPI's (OFF_BYTES: never), at least FLOOR.

    Every member times the same calls together, engine and MPI in pairs whose order
    alternates (load that comes and goes hits both sides of a pair alike); each pair counts
    with its slowest member's times, and a point's ratio is the median of its pairs' ratios.
    A point left in doubt (its median near _MARGIN, its pairs on both sides of it) whose side
    decides its kind's threshold is measured once more and decided by the median of all its
    pairs. Every member decides from
    the same reduced times, so the thresholds agree."""
    h = g.health
    label = f"{op} (shared-memory calibration)"
    sync = _barrier(h, label, s)
    pairs: list = [[[] for _ in _KINDS] for _ in _CAL_BYTES]  # size, kind -> [(e, m)]
    todo = [(i, k) for i in range(len(_CAL_BYTES)) for k in range(len(_KINDS))]
    cases: dict = {}  # size -> its calls, kept for a second round (no new first touch)
    for again in (False, True):  # a first round, then the points in doubt once more
        t = []
        for i, k in todo:
            if i not in cases:
                cases[i] = _cases(eng, g, s, label, _CAL_BYTES[i])
            reps = _CAL_PAIRS if _CAL_BYTES[i] <= 1 << 20 else _CAL_PAIRS_LARGE
            t.append(_pairs(cases[i][k], reps - int(again), sync))  # again: 1 fewer
        flat = np.concatenate(t)
        _exchange(h, flat, MPI.MAX, s, op)  # every pair: its slowest member's times
        at = 0
        for (i, k), got in zip(todo, t):
            pairs[i][k].extend(zip(flat[at:at + got.size:2], flat[at + 1:at + got.size:2]))
            at += got.size
        todo = [(i, k) for i, k in todo if _split(pairs[i][k]) and _decides(pairs, i, k)]
        cases = {i: cases[i] for i in {i for i, _ in todo}}
        if not todo:
            break
    ratio = np.array([[_ratio(pairs[i][k]) for k in range(len(_KINDS))]
                      for i in range(len(_CAL_BYTES))])
    eng.calibration = ratio  # engine / MPI per size and kind, for reports
    large = _large(eng, g, s, op, label, [k for k in range(len(_KINDS))
                                          if ratio[-1, k] > _MARGIN])
    eng.calibration_large = large
    sizes = _CAL_BYTES + (_CAL_LARGE,)
    return {kind: (_crossing(np.r_[ratio[:, k], large[k]], sizes) if k in large
                   else _crossing(ratio[:, k])) for k, kind in enumerate(_KINDS)}


def _large(eng: Engine, g: Any, s: int, op: str, label: str, kinds: List[int]) -> dict:
    """The engine / MPI ratio at :data:`_CAL_LARGE` of each kind in ``kinds`` (those that
    lost at the largest of :data:`_CAL_BYTES`; the same on every member), timed together."""
    if not kinds:
        return {}
    h = g.health
    case = _cases(eng, g, s, label, _CAL_LARGE)
    t = [_pairs(case[k], _CAL_PAIRS_LARGE, _barrier(h, label, s)) for k in kinds]
    flat = np.concatenate(t)
    _exchange(h, flat, MPI.MAX, s, op)
    got, at = {}, 0
    for k, one in zip(kinds, t):
        got[k] = _ratio(list(zip(flat[at:at + one.size:2], flat[at + 1:at + one.size:2])))
        at += one.size
    return got


def _ratio(pairs: list) -> float:
    """The median of the pairs' engine / MPI time ratios."""
    return float(np.median([e / max(m, 1e-9) for e, m in pairs]))


def _split(pairs: list) -> bool:
    """Whether the pairs leave the point in doubt: their median lies near _MARGIN (within
    :data:`_DOUBT`) and they disagree on which side of it the engine lies."""
    r = [e / max(m, 1e-9) for e, m in pairs]
    med = float(np.median(r))
    return min(r) <= _MARGIN < max(r) and _MARGIN / _DOUBT <= med <= _MARGIN * _DOUBT


def _decides(pairs: list, i: int, k: int) -> bool:
    """Whether kind ``k``'s threshold depends on which side of _MARGIN size ``i`` lies
    (else a second look at it would change nothing)."""
    ratio = np.array([_ratio(pairs[j][k]) for j in range(len(_CAL_BYTES))])
    ratio[i] = _MARGIN * 0.999
    win = _crossing(ratio)
    ratio[i] = _MARGIN * 1.001
    return _crossing(ratio) != win


def _pairs(fns: tuple, reps: int, sync: Callable[[], None]) -> np.ndarray:
    """``reps`` pairs of timed calls ``(engine, MPI)``, the order alternating, flat:
    ``[e0, m0, e1, m1, ...]``. Each timed call follows an untimed call of its own kind, then
    ``sync`` (a barrier): it starts from the state its own kind leaves, as every call of a
    program that repeats its calls does, with the members together.

    Timed straight after the other kind's call, the engine's all-reduce of 256 KiB took
    90 µs after MPI's and 36 after its own (2 ranks): MPI lets its members leave tens of
    microseconds apart, and its call leaves the buffers' lines where the engine's reads and
    writes do not find them. That ranked the engine behind MPI up to 2 MiB in the
    calibration, where calls made back to back, or after a barrier, found it 1.4x faster
    from 512 KiB."""
    t = np.zeros((reps, 2))
    for r in range(reps):
        for side in ((0, 1) if r % 2 == 0 else (1, 0)):
            fns[side]()
            sync()
            t[r, side] = best_time(fns[side], 1)
    return t.reshape(-1)


def _barrier(h: Any, label: str, s: int) -> Callable[[], None]:
    """A barrier of the group's private communicator, waited for as every call is."""
    return lambda: W.wait(h, h.diag.Ibarrier(), label, s)


def _cases(eng: Engine, g: Any, s: int, label: str, nbytes: int) -> tuple:
    """The calibration's calls at ``nbytes``, ``(engine, MPI)`` per kind of :data:`_KINDS`:
    an all-reduce of ``nbytes`` (float32, in place), a reduce-scatter of ``nbytes`` and an
    all-gather into ``nbytes`` (from an input of its own). "MPI" is what such a call does
    without the engine past the board's sizes, MPI's own collective below them."""
    h = g.health
    p, diag = eng.p, h.diag
    n = nbytes // 4 // p * p
    buf = np.ones(n, np.float32)
    out = np.zeros(n // p, np.float32)
    pieces = _pieces(buf, p)
    # the all-gather from an input of its own, as all_gather_into_tensor's callers have it
    # (in place, the engine skips its own piece's copy: it won at sizes where callers lost)
    own = np.ones(n // p, np.float32)
    red = _reducer(ReduceOp.SUM, buf.dtype, p)[1]

    def mpi(req: Callable[[], Any]) -> Callable[[], None]:
        return lambda: W.wait(h, req(), label, s)

    # past the board's sizes (whose calls are sequenced by the user's), the group's own
    # choice (persistent.py: messages where scatter_p2p.py and gather_p2p.py take the call)
    past = nbytes > g.pers_max
    rs = g._ireduce_scatter_block if past else diag.Ireduce_scatter_block
    ag = g._iallgather if past else diag.Iallgather

    return ((lambda: _reduce_core(eng, buf, red, -1, None),
             mpi(lambda: diag.Iallreduce(MPI.IN_PLACE, [buf, MPI.FLOAT], MPI.SUM))),
            (lambda: _scatter_core(eng, out, pieces, red),
             mpi(lambda: rs([buf, MPI.FLOAT], [out, MPI.FLOAT], MPI.SUM))),
            (lambda: _gather_core(eng, own, pieces, None),
             mpi(lambda: ag([own, MPI.FLOAT], [buf, MPI.FLOAT]))))


def _crossing(ratio: np.ndarray, at: Sequence[int] = _CAL_BYTES) -> int:
    """The size from which the engine's time stays at most _MARGIN of MPI's at every larger
    size, from its ratio to MPI's at the sizes ``at`` (straight between them in the logarithm
    of the size; past the last size, the last ratio: there both move memory that no cache
    holds, at a cost per byte that no longer changes); OFF_BYTES where the engine loses at
    the last size."""
    x = np.log2(np.asarray(at, float))
    ratio = np.asarray(ratio, float)
    if ratio[-1] > _MARGIN:
        return OFF_BYTES
    sizes = FLOOR * 2.0 ** (np.arange(4 * 8) / 4)  # four per octave, FLOOR to 128 x FLOOR
    sizes = sizes[sizes <= at[-1]]
    loses = np.flatnonzero(np.interp(np.log2(sizes), x, ratio) > _MARGIN)
    if not loses.size:
        return FLOOR
    last = loses[-1]
    return int(sizes[last + 1]) if last + 1 < sizes.size else int(at[-1])
