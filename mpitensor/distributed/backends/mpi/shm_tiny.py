"""Small collectives through shared memory: a board in a segment the group's members share
(issue 29, "never slower than raw MPI at any size").

MPICH's blocking ``Allgather``, ``Bcast`` and ``Reduce_scatter_block`` of a few bytes take
1.4-3 µs on two ranks here, and our calls on persistent requests (``persistent.py``) cost about
1 µs more: 0.64-0.89x raw below 4 KiB. On a group whose members share a machine, a call that
fits the board (:func:`cap`, :func:`limits`: 64 KiB to 1 MiB a member, by the group's size and
whether its ranks outnumber the cores) instead writes its data into this member's entry of a
shared board and reads the other members' (``_tiny.c``): about 0.3 µs once both ranks of a
pair are there, so the Python around it is most of the call.

**Where it applies.** The board takes the place of the group's persistent requests: every call
that would start one (``all_reduce``, ``all_gather_into_tensor``, ``all_gather`` into one
buffer, ``reduce_scatter_tensor``, ``broadcast``, on the fast and the general paths alike) and
whose MPI datatype and reduction the board computes (:data:`DTYPES`, :data:`OPS`) starts a board
call instead; the others keep their persistent request. ``reduce`` (to one root), which has no
persistent request, takes the board where it computes the call and the call fits
(:data:`ROOTED`, the same limit as ``all_reduce``'s), else MPI's ``Ireduce``: every member
posts its data and compares every member's words, and the root alone reads and reduces them.
MPICH's ``Reduce`` of a few bytes took 1.6-1.8 µs on 2 ranks here, ours on ``Ireduce`` 3.4;
4 ranks on 2 cores: raw 7.7-8.8 µs, ours on ``Ireduce`` 11-12, on the board 9.6-10 (with
:data:`YIELDS`: 17-19 without).
The choice depends only on what every member of a correct program passes alike, as the
persistent request's does. The board is made
with the group, where every member runs on one machine, ``MPITENSOR_SHM_COLLECTIVES`` is not
``off``, debug mode is off (its checks run before each call's data, on MPI), the CPU is x86-64
(the protocol relies on its store order) and the compiled module loaded; else the group has
none and nothing changes.

**Properties** (the engine's, ``shm_coll.py``):

* reductions run in rank order on every member: the same bits everywhere. Integers wrap as
  MPI's do; NaN wins ``MIN`` and ``MAX`` (NumPy's ``minimum``/``maximum``);
* every call is checked: each entry carries the call's number, operation, dtype, reduction,
  root and byte count, compared before any data is read; a member whose entry differs, or that
  went past the call without posting it (it took another path: a size on the other side of
  the board's limit), ends the call with CollectiveMismatchError on every member. A member waiting
  in MPI (or the engine) for a call that another member posted here finds that on its slow
  tick (``look``, from the watchdog) and raises the same;
* the wait is the group's bounded wait: its timeout, fault notices, and a look at whether each
  member not there yet still runs (PeerFailedError when its process is gone);
* async calls post at once and complete in call order (``Test``, or any later call's wait).

**Speed.** A post copies its data into the entry plainly, or, from ``_tiny.NT_MIN`` bytes on
(a broadcast's root from ``_tiny.NT_BCAST``), with non-temporal stores where calls timed when
the group is made found that faster (:func:`_copy_choice`: all-gathers of 4 KiB, broadcasts
of 16 KiB, on a spare board in the same segment). A blocking call of a kind, size,
root, dtype and op that took the fast path here before takes the group's lane
(:meth:`Board.lane`, ``_tiny.Lane``): the same checks, count and board call in C, where the
fast path's Python was about half of a call of a few bytes (2 ranks: 0.84-0.92 µs a call
through ``mpitensor.distributed`` on Tensors, against 1.0-1.7 before and raw mpi4py's 0.95-1.7).

A member overwrites an entry only once every member, itself included, has read what it held
(their "done" word): a call may wait for that, and while it does it reads its own earlier async
calls, so members waiting so always let each other on.
"""

from __future__ import annotations

import collections
import os
from typing import Any, Optional

import numpy as np
from mpi4py import MPI

from ...._base import config as _config
from ....errors import CollectiveMismatchError
from ....tensor import Tensor
from ...health import faults as _faults
from ...health import fingerprint as _fp
from ...health import watchdog as W
from ...health.state import MASK
from . import msg_choice as _mc
from . import persistent as _pers
from . import shm as _shm
from .shm_pipe import _alive

try:
    from . import _tiny  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: no board
    _tiny = None

#: the largest data one call puts on the board of a group of at most :data:`WIDE` members
#: (bytes; all_reduce's and broadcast's buffer, all_gather's output, reduce_scatter's input).
#: MPI's calls of 8-64 KiB took 1.2-3x the board's here (docs/benchmarks-collectives.md);
#: above it the non-blocking MPI call and the engine (``shm_coll.py``) take over. A call's
#: own buffers are made only where it needs them (``_Made``): made with every call, a rank of
#: a 4-rank job of 10,000 random calls held 11 MiB more at its end than at its first tenth
#: (tests/test_faults_comm.py allows 8)
CAP = 64 << 10
#: ... and on a larger group (whose segment would hold SLOTS x CAP bytes per member)
SMALL_CAP = 4096
WIDE = 8
#: ... and on a group of at most NARROW members, whose board has NARROW_SLOTS entries a member:
#: there the board took 0.34-0.87x MPI's time at 128-256 KiB (2 ranks, and 4 on 2 cores), and
#: a blocking call never waits for an entry while a member has three (a member posts call s+1
#: only once every member posted call s, after reading call s-1)
NARROW, NARROW_CAP, NARROW_SLOTS = 4, 256 << 10, 4
#: ... on a pair of ranks that do not outnumber the cores: at 512 KiB the board took 0.62-0.82x
#: raw MPI's time (all_reduce, all_gather, reduce_scatter, broadcast; 2 ranks on 2 cores),
#: where the group's other paths (MPI's calls, the messages of gather_p2p and scatter_p2p)
#: ran at 0.85-1.03x raw. Past it MPI moves a large message once, the board twice
PAIR_CAP = 512 << 10
#: ... except an all_reduce on such a pair, which the engine (``shm_coll.py``: each member
#: writes its reduced part into its peers' buffers) takes past this where its calibration
#: says so. 2 ranks on 2 cores (2026-12-01), the engine's time over the board's: 0.55x back to
#: back and 0.77x on fresh inputs at 512 KiB, 0.77x and 0.98x at 256 KiB, 1.25-1.5x at 128 KiB
PAIR_REDUCE_CAP = 256 << 10
#: ... and on a group of at most NARROW members whose ranks outnumber the cores, where a call
#: that waits in MPI takes turns with its peers for the cores and a board call does not:
#: 4 ranks on 2 cores, against raw MPI, all_gather into 1-2 MiB 1.4-2.6x (4 MiB: 0.94-2.8x),
#: broadcast and reduce_scatter of 512 KiB-1 MiB 1.2-2.7x (0.65x in some jobs: the machine's
#: state), all_reduce 1.0-1.3x, where the paths they replaced ran at 0.75-0.97x.
#: An all_gather's entry holds one member's input, so its output may be NARROW times larger.
#: At 2 MiB the board's all_reduce fell to 0.8x. A segment of 4 members holds 16 MiB, the
#: others at most 4 MiB (NARROW x NARROW_SLOTS x NARROW_CAP, WIDE x SLOTS x CAP); where
#: /dev/shm cannot hold it, the board is made with CAP-byte entries instead (:func:`make`).
#: The engine (``shm_coll.py``) is asked only past the board's largest call: the call that
#: makes the engine times it within that call's number, and a member still timing took a
#: faster member's post of the same call on the board for a mismatch
CROWDED_CAP = 1 << 20
#: the bytes of a call ``_copy_choice`` times
TIMED = 4096
#: ... and of a broadcast it times (two entries of it a member fit the spare board's room):
#: where streamed posts won 6.2 against 9.1 µs at 64 KiB (an EPYC), plain ones won here at
#: every size from 16 KiB (2 ranks, 2026-12-01: 64 KiB 6.8 against 9.9 µs, 512 KiB 38 against
#: 58, back to back or on fresh inputs), so the machine decides, at a size past TIMED
BCAST_TIMED = 16384
#: where ranks outnumber cores, the smallest broadcast the board takes: every member of a
#: board call waits for the others, and MPI's one-way tree was 1.2x faster to 4 KiB (4 ranks
#: on 2 cores), where the board was 2.2-2.5x faster from 16 KiB
BCAST_CROWDED = 8192
#: entries per member: calls posted ahead of the slowest member's reading
SLOTS = 8
#: spins of a first try (each a CPU pause, about 2 µs in all) before the bounded wait takes
#: over; none where ranks outnumber cores (the watchdog's rule: a spinning rank takes the core
#: its peer needs)
SPINS_FIRST = 64
#: spins of each later try (the bounded wait's own spin and backoff pace the tries)
SPINS = 0
#: where ranks outnumber cores (no spins), yields of the core within each try, in C, before
#: it goes back to the bounded wait: its Python between two yields was the time the ranks
#: with work waited for. 4 ranks on 2 cores, against raw MPI's blocking calls (2026-11-30):
#: all_gather of 16 B-4 KiB 10-12 µs a call (raw 11-12; 17-22 without), all_reduce 7-11 µs
#: (raw 19-23; 15-21 without); 4, 16, 64 or 256 yields made no difference there. At most
#: YIELDS timeslices of a busy peer (a few ms) pass before the wait's bookkeeping runs again
YIELDS = 4

#: the kinds of call (``_tiny.c``'s); ROOTED is a reduce to one member
GATHER, BCAST, REDUCE, REDUCE_PART, ROOTED = 0, 1, 2, 3, 4
_KIND_NAMES = {GATHER: "all_gather", BCAST: "broadcast", REDUCE: "all_reduce",
               REDUCE_PART: "reduce_scatter", ROOTED: "reduce"}
# ... and as a lane's calls count them in the group's history (by kind, in order)
_LANE_NAMES = ("all_gather_into_tensor", "broadcast", "all_reduce", "reduce_scatter_tensor",
               "reduce")

#: MPI datatypes the board reduces, by name: its dtype code
DTYPES = {"FLOAT": 0, "DOUBLE": 1, "INT8_T": 2, "SIGNED_CHAR": 2, "INT16_T": 3, "SHORT": 3,
          "INT32_T": 4, "INT": 4, "INT64_T": 5, "LONG": 5, "LONG_LONG": 5, "UINT8_T": 6,
          "UNSIGNED_CHAR": 6, "UINT16_T": 7, "UNSIGNED_SHORT": 7, "UINT32_T": 8, "UNSIGNED": 8,
          "UINT64_T": 9, "UNSIGNED_LONG": 9, "UNSIGNED_LONG_LONG": 9}
_SIZES = (4, 8, 1, 2, 4, 8, 1, 2, 4, 8)
_FLOATS = (0, 1)
#: MPI reductions the board computes: its op code (the bitwise ones on integers only)
OPS = {"SUM": 0, "PROD": 1, "MIN": 2, "MAX": 3, "BAND": 4, "BOR": 5, "BXOR": 6}
# the codes' names in error messages (ReduceOp's names)
_DTYPE_NAMES = ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                "uint32", "uint64")
_OP_NAMES = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")

_types: dict = {}  # MPI datatype handle -> dtype code
_ops: dict = {}    # MPI op handle -> op code


def _tables() -> None:
    for name, code in DTYPES.items():
        t = getattr(MPI, name, None)
        if t is not None and t != MPI.DATATYPE_NULL and t.Get_size() == _SIZES[code]:
            _types.setdefault(t.handle, code)
    for name, code in OPS.items():
        _ops[getattr(MPI, name).handle] = code


def codes(mt: Any, mop: Any) -> Optional[tuple]:
    """``(dtype code, op code)`` where the board reduces ``mop`` over ``mt``, else None."""
    if not _types:
        _tables()
    dt, op = _types.get(mt.handle), _ops.get(mop.handle)
    if dt is None or op is None or (op >= 4 and dt in _FLOATS):
        return None
    return dt, op


def _word(kind: int, dt: int = 15, op: int = 15, root: int = -1) -> int:
    """The operation word an entry carries: what every member must agree on but the size."""
    return ((root + 1) << 16) | (kind << 8) | (dt << 4) | op


def _unword(w: int) -> tuple:
    return (w >> 8) & 0xFF, (w >> 4) & 0xF, w & 0xF, (w >> 16) - 1


#: a board's ``nt_min`` where its posts never stream (every post is smaller)
NEVER = 1 << 40
#: the calls timed with each copy (``_copy_choice``): rounds of ROUNDS calls, by turns
ROUNDS, REPS = 64, 5


def cap(size: int, crowded: bool = False) -> int:
    """The bytes of one board entry of a group of ``size`` members (whose ranks outnumber the
    node's cores where ``crowded``): the most one member posts in one call."""
    if size <= NARROW:
        return CROWDED_CAP if crowded else PAIR_CAP if size == 2 else NARROW_CAP
    return CAP if size <= WIDE else SMALL_CAP


def limits(size: int, entry: int, crowded: bool) -> dict:
    """By kind of call, the largest one (bytes as the fast paths count them: all_reduce's and
    broadcast's buffer, all_gather's output, reduce_scatter's input) that the board of a group
    of ``size`` members with ``entry``-byte entries takes. Every kind posts at most ``entry``
    bytes a member; an all_gather of a crowded group (:data:`CROWDED_CAP`) takes every output
    whose parts fit."""
    most = dict.fromkeys((GATHER, BCAST, REDUCE, REDUCE_PART, ROOTED), entry)
    if crowded and size <= NARROW:
        most[GATHER] = entry * size
    elif size == 2:
        most[REDUCE] = min(entry, PAIR_REDUCE_CAP)
    return most


def slots(size: int) -> int:
    """Entries a member of a group of ``size`` members has on its board."""
    return NARROW_SLOTS if size <= NARROW else SLOTS


def _board_bytes(size: int, entry: int, entries: int = SLOTS) -> int:
    return size * (128 + entries * (64 + entry))


def segment_bytes(size: int, entry: Optional[int] = None) -> int:
    """The board (entries of ``entry`` bytes, by default :func:`cap`'s), then a smaller one
    that ``_copy_choice`` times calls on (never used again). Made with ``posix_fallocate``."""
    return (_board_bytes(size, cap(size) if entry is None else entry, slots(size))
            + _board_bytes(size, TIMED))


# ---------------------------------------------------------------------------- the group's
def make(g: Any) -> Optional["Board"]:
    """Collective over the new group ``g`` (every member runs it, where ``g.one_node`` was
    asked): its board, or None on every member where it has none."""
    if (g.comm is None or g.size_ < 2 or not g.one_node or g.pers_max <= 0 or g.debug
            or _config.shm_collectives() == "off" or g.health.fp_node is None):
        return None
    # the node's load (the same on every member: watchdog.set_node_load, from every rank's
    # CPUs), asked of every member all the same: the segment's size depends on it
    crowded = bool(g.comm.allreduce(int(not W.may_spin()), op=MPI.MAX))
    mm = None
    for entry in sorted({cap(g.size_, crowded), min(cap(g.size_, crowded), CAP)}, reverse=True):
        mm = _shm.shared(g.comm, "mpitensor-tiny-", segment_bytes(g.size_, entry))
        if mm is not None:  # (None on every member: a smaller board where /dev/shm is short)
            break
    ok = bool(g.comm.allreduce(int(_tiny is not None and mm is not None), op=MPI.MIN))
    if not ok:
        if mm is not None:
            mm.close()
        return None
    leave = None  # (timed before the board is laid on the segment: its calls use it first)
    if _mc.applies(g, entry, crowded):
        most = limits(g.size_, entry, crowded)
        leave = _mc.choose(g, mm, entry, most[GATHER], most[REDUCE_PART], (
            GATHER, REDUCE_PART, _board_bytes(g.size_, entry, slots(g.size_))))
    b = Board(g, mm, entry, crowded)
    if leave is not None:
        b.leave(*leave)
    # where ranks outnumber cores, the reader often runs where the writer did, after it
    if W.may_spin():
        b.c.nt_min, b.c.nt_bcast = _copy_choice(g, mm, b)
    else:
        b.c.nt_min = NEVER
    g.pers_max = max(g.pers_max, max(b.most.values()))  # (the fast paths' gate: the board's
    # calls, then the persistent requests' CEILING for those it does not compute: Cache)
    if 1 < g.shm_min <= g.pers_max:  # ("on": every call asks the engine, none comes here)
        g.shm_min = g.pers_max + 1  # the engine past the board's largest call (CROWDED_CAP)
        # ... and an all_reduce past the board's largest all_reduce (PAIR_REDUCE_CAP)
        g.shm_ar_min = max(g.shm_ar_min, b.most[REDUCE] + 1)
    g.comm.Barrier()  # every member wrote its pid before any call looks for it
    return b


#: global ranks of a group -> the times its board's calls took (``Board.copy_times``): where
#: the same processes make another group, on the same cores, its board asks them instead of
#: timing again (2-4 ms a group)
_timed: dict = {}


def _copy_choice(g: Any, mm: Any, b: "Board") -> "tuple[int, int]":
    """Collective: the board's ``nt_min`` and ``nt_bcast`` (``_tiny.c``'s ``copy_in``), from
    all-gathers of :data:`TIMED` bytes and broadcasts of :data:`BCAST_TIMED` timed on the spare
    board with a plain copy and with non-temporal stores, by turns; the slowest member's median
    of each decides, the same on every member, streamed where it took at most 0.9x plain's
    time. Streamed posts cost about the same wherever the cores sit (0.7 µs a call of 4 KiB on
    two cores of an EPYC); a plain copy costs 0.5 µs where the cores are close and 1.9 µs where
    the lines cross the chip, so neither wins everywhere. A member not there within 0.5 s (or
    a mismatch) ends the timing, and the plain copy stays. Where every member timed a group of
    these same ranks before, their times (:data:`_timed`) decide without a new timing."""
    known = np.array(_timed.get(g.ranks, (-1.0,) * 4))
    g.comm.Allreduce(MPI.IN_PLACE, known, op=MPI.MIN)  # -1: a member has none
    agreed = known if known.min() > 0 else _time_copies(g, mm, b)
    b.copy_times = (float(agreed[0]), float(agreed[1]))
    b.bcast_times = (float(agreed[2]), float(agreed[3]))
    if np.isfinite(agreed).all():  # (a timing cut short is not kept: the next group times)
        _timed[g.ranks] = tuple(float(t) for t in agreed)
    return (_tiny.NT_MIN if agreed[1] < 0.9 * agreed[0] else NEVER,
            _tiny.NT_BCAST if agreed[3] < 0.9 * agreed[2] else NEVER)


def _time_copies(g: Any, mm: Any, b: "Board") -> np.ndarray:
    """Collective: seconds a call took with each copy, the slowest member's median (``inf``: a
    timing that did not end): all-gathers (plain, streamed), then broadcasts (plain, streamed),
    each on a board of its own over the spare room, zeroed between the two."""
    half = _board_bytes(g.size_, b.cap, slots(g.size_))
    times: list = [[], [], [], []]
    with memoryview(mm) as whole, whole[half:] as spare:
        for at, (kind, nbytes, entries) in ((0, (GATHER, TIMED, SLOTS)),
                                           (2, (BCAST, BCAST_TIMED, 2))):
            if at:  # (every member is done with the first board: the second starts at zero)
                g.comm.Barrier()
                if g.rank_ == 0:
                    np.frombuffer(spare, np.uint8)[:] = 0
                g.comm.Barrier()
            c = _tiny.Board(spare, g.rank_, g.size_, entries, nbytes)
            try:
                s = 1
                for rep in range(REPS):
                    for i in ((0, 1) if rep % 2 == 0 else (1, 0)):
                        t = c.time_calls(s, ROUNDS, nbytes, NEVER if i == 0 else 0, 0.5, kind)
                        s += ROUNDS
                        times[at + i].append(t if t >= 0 else float("inf"))
                    if float("inf") in times[at] + times[at + 1]:
                        break
            finally:
                c.release()
    agreed = np.array([np.median(t) / ROUNDS for t in times])
    g.comm.Allreduce(MPI.IN_PLACE, agreed, op=MPI.MAX)
    return agreed


def free(g: Any) -> None:
    b = getattr(g, "tiny", None)
    g.tiny = None
    if b is not None:
        b.close()


class Board:
    """A group's board: the compiled board, the calls posted and not yet read, and what the
    bounded waits need (the group's health, its members' processes)."""

    def __init__(self, g: Any, mm: Any, entry: int, crowded: bool = False) -> None:
        self.g, self.mm, self.h = g, mm, g.health
        self.cap = entry  # the bytes of an entry
        # by kind, the largest call the board takes (``limits``); by operation name, for the
        # paths past it (gather_p2p, scatter_p2p: ``SmallCalls.board_most``)
        self.most = limits(g.size_, entry, crowded)
        self.most_by_name = {name: self.most[k] for k, name in _KIND_NAMES.items()}
        self.c = _tiny.Board(mm, g.rank_, g.size_, slots(g.size_), self.cap)
        self.c.set_pid(os.getpid())
        self.pending: collections.deque = collections.deque()
        # seconds a call of TIMED bytes took on the spare board (plain copy, streamed), the
        # slowest member's: what chose ``c.nt_min`` (None: not timed, ranks outnumber cores)
        self.copy_times: Optional[tuple] = None
        self.bcast_times: Optional[tuple] = None  # (the same, broadcasts of BCAST_TIMED bytes)
        self.posting = 0  # the call whose entry this member waits to write (_Room)
        # a call every member agreed on while making the engine (shm_coll._setup): where
        # the engine could not be made, the peers that left first may post it here
        self.settled = 0
        # whether broadcasts of every size come here, else those of BCAST_CROWDED bytes and
        # more only: where ranks outnumber cores (set with the cache)
        self.bcast = True
        self.h.tiny = self

    def leave(self, gather: int, part: int, msgs: tuple) -> None:
        """Take all-gathers of at most ``gather`` bytes and reduce-scatters of at most ``part``,
        leaving larger ones to messages (``msg_choice``: all-gathers into one buffer of
        ``msgs`` = (lo, hi] bytes, ``gather_p2p.flat_takes``; the others past these limits,
        as before)."""
        self.most[GATHER], self.most[REDUCE_PART] = gather, part
        self.most_by_name = {name: self.most[k] for k, name in _KIND_NAMES.items()}
        self.g.gather_msgs = msgs

    def cache(self, comm: Any) -> "Cache":
        """The group's persistent requests, with this board's calls where it computes them
        (made at the group's first small call, once the node's load is known)."""
        spin = W.may_spin()  # the node's load, the same on every member
        self.c.spins = SPINS_FIRST if spin else 0
        self.c.yields = 0 if spin else YIELDS
        self.bcast = spin
        return Cache(comm, self)

    def lane(self) -> Any:
        """The group's lane on this board (``_tiny.Lane``: blocking calls seen here before,
        taken in C, ``persistent.SmallCalls._to_lane``), or None where the group's fault
        notices come by message (no shared word the lane could look at) or it spans nodes.
        Calls with a root take it where the group's ranks are the world's (their ``src`` and
        ``dst`` are then ranks of the group)."""
        g, h = self.g, self.h
        if h.fault_word is None or g.hier is not None:
            return None
        return self.c.lane(h, h.history, Tensor, np.ndarray, h.fault_word, _LANE_NAMES,
                           bool(g.identity))

    @property
    def bcast_min(self) -> int:
        """The smallest broadcast that comes to the board."""
        return 0 if self.bcast else BCAST_CROWDED

    def close(self) -> None:
        if self.h.tiny is self:
            self.h.tiny = None
        c, self.c = self.c, None
        if c is not None:
            c.release()
            self.mm.close()

    # ------------------------------------------------------------------ waits
    def drain(self, upto: Any = None, spins: int = SPINS) -> bool:
        """Read the posted calls in order, up to ``upto`` (None: all); True once it is read
        (or all are). Raises where a member made one of them otherwise."""
        p = self.pending
        while p:
            head = p[0]
            r = self.c.take(head.s, head.word, head.nbytes, head.dst, head.kind, head.root,
                            head.dt, head.op, spins)
            if r == 1:
                p.popleft()
                self.c.pending = len(p)
                head.taken = True
                if head is upto:
                    return True
            elif r == 0:
                return False
            else:
                self._mismatch(head, -1 - r)
        return True

    def look(self, s: int, op: str) -> None:
        """The watchdog's slow tick, while this member waits in call ``s`` on another path:
        a member that posted call ``s`` here made it otherwise (a mismatch)."""
        c = self.c
        if c is None or s == self.posting or s == self.settled or self.g.debug:
            return  # (debug mode: its check, which waits before the data, says it better)
        r = c.peek(s)
        if r >= 0:
            most = self.most.get(_unword(c.words(r, s)[1])[0], self.cap)
            self._raise(op, s, f"ranks disagree on the call number or the byte count of this "
                        f"call: rank {self.h.ranks[r]} made call #{s} as a small one (at most "
                        f"{most} bytes, through shared memory) where this rank passed a "
                        "larger one (or a dtype or reduction only MPI takes), or made one call "
                        "more or fewer before it")

    def check_alive(self, call: "Call") -> None:
        """PeerFailedError (the group broken) where a member not there yet is gone."""
        c, s = self.c, call.s
        for r in range(self.g.size_):
            if r == self.g.rank_ or c.words(r, s)[0] == s:
                continue
            pid = c.pid(r)
            if pid > 0 and not _alive(pid):
                h = self.h
                story = _faults.Story(h.ranks[r], call.name, s,
                                      f"its process (pid {pid}) ended while this rank waited "
                                      "for it in a small collective through shared memory")
                _faults.mark_broken(h, story, tell=False)
                raise _faults.error(h, story, call.name, s, waiting=True)

    def _mismatch(self, call: "Call", r: int) -> None:
        t, word, nbytes, posted, _ = self.c.words(r, call.s)
        who = f"rank {self.h.ranks[r]}"
        if t != call.s:
            reason = (f"ranks disagree on the call number or the byte count of this call: {who} "
                      f"went past call #{call.s} without making it as a small one (at most "
                      f"{self.most[call.kind]} bytes, through shared memory): it passed more "
                      "bytes, or a dtype or reduction only MPI takes, or made one call more or "
                      "fewer before it")
        else:
            mine, theirs = _unword(call.word), _unword(word)
            what = [name for name, a, b in zip(("operation", "dtype", "reduction", "root"),
                                               mine, theirs) if a != b]
            if nbytes != call.nbytes:
                what.append("byte count")
            reason = (f"ranks disagree on the {' and '.join(what) or 'arguments'} of this call: "
                      f"this rank passed {self._described(call.s, call.word, call.nbytes)}, "
                      f"{who} {self._described(call.s, word, nbytes)}")
        self._raise(call.name, call.s, reason)

    def _described(self, s: int, word: int, nbytes: int) -> str:
        """A board call's words as the agreement check names a call (``fingerprint``)."""
        kind, dt, op, root = _unword(word)
        parts = [f"call #{s}", _KIND_NAMES.get(kind, "another operation"), f"{nbytes} bytes"]
        if dt < len(_DTYPE_NAMES):
            parts.append(_DTYPE_NAMES[dt])
        if op < len(_OP_NAMES):
            parts.append(f"op {_OP_NAMES[op]}")
        if 0 <= root < len(self.h.ranks):
            parts.append(f"root {self.h.ranks[root]}")
        return ", ".join(parts)

    def _raise(self, op: str, s: int, reason: str) -> None:
        h = self.h
        self.pending.clear()
        if self.c is not None:
            self.c.pending = 0
        _faults.mark_broken(h, _faults.Story(h.global_rank, op, s, reason))
        raise CollectiveMismatchError(_fp._mismatch_text(h, op, s, reason))


class Call:
    """A small call of one kind and size on the board, as a persistent request
    (``persistent.Call``'s ``req``): ``Start`` posts it, ``Test`` reads it."""

    __slots__ = ("board", "word", "nbytes", "out", "dst", "src", "kind", "root", "dt", "op", "s",
                 "taken", "name", "spec")

    def __init__(self, board: Board, kind: int, nbytes: int, codes: tuple = (15, 15),
                 root: int = -1) -> None:
        self.board, self.kind, self.nbytes = board, kind, nbytes
        # what Start posts and where take puts the result: the buffers of its ``_Made``, once
        # made (a blocking call's ``rest`` puts it into the caller's buffer instead)
        self.src = self.out = self.dst = None
        self.dt, self.op = codes
        self.root = max(root, 0)
        self.word = _word(kind, self.dt, self.op, root)
        self.s, self.taken, self.name = 0, True, _KIND_NAMES[kind]
        # the compiled post-and-take of a blocking call (its ``owner`` is this call)
        self.spec = board.c.spec(self, self.word, nbytes, kind, self.root, self.dt, self.op)

    def Start(self) -> None:  # noqa: N802 - MPI's request protocol
        b = self.board
        g = b.g
        s = g.seq
        e = g.history[s & MASK]  # (call number, operation, dtype, shape), as counted
        self.s, self.taken = s, False
        if e is not None and e[0] == s:
            self.name = e[1]
        if not b.c.post(self.s, self.word, self.nbytes, self.src):
            b.posting = self.s
            try:
                W.wait(b.h, _Room(self), self.name, self.s)
            finally:
                b.posting = 0
        b.pending.append(self)
        b.c.pending = len(b.pending)

    def rest(self, r: int, src: Any, dst: Any, op: str, s: int) -> bool:
        """What is left of blocking call ``s`` after its spec's ``run(s, src, dst)``
        answered ``r`` (not 1: done): False where nothing was done (the persistent request's
        way takes it: a call of this member still to read, or an entry a member still reads);
        else the call is posted, and this waits for it (bounded) or raises; True."""
        b = self.board
        if r < -b.g.size_:
            return False
        self.s, self.name, self.taken = s, op, False
        self.dst = dst
        b.pending.append(self)
        b.c.pending = len(b.pending)
        try:
            if r < 0:
                b._mismatch(self, -1 - r)
            W.wait(b.h, self, op, s)
        finally:
            self.dst = self.out
        return True

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI's request protocol
        if self.taken:
            return True
        b = self.board
        p = b.pending
        if not p or (p[0] is not self and self not in p):  # dropped: the group broke
            b.g.check_usable(self.name)  # (raises the group's story)
            raise RuntimeError(f"{self.name} (#{self.s}): no longer on the board")
        return b.drain(self, b.c.spins if p[0] is self else SPINS)

    def before_check(self) -> None:
        self.board.check_alive(self)

    def Free(self) -> None:  # noqa: N802 - MPI's request protocol
        return None


class _Room:
    """The wait for the members still reading what this member's entry holds, as an MPI
    request; meanwhile this member reads its own earlier calls (which they may wait for)."""

    __slots__ = ("call",)

    def __init__(self, call: Call) -> None:
        self.call = call

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI's request protocol
        c = self.call
        b = c.board
        b.drain()
        return bool(b.c.post(c.s, c.word, c.nbytes, c.src))

    def before_check(self) -> None:
        self.call.board.check_alive(self.call)


class Cache(_pers.Cache):
    """The group's persistent requests (``persistent.Cache``), where the board's calls take
    the place of those the board computes; keys, buffers and eviction are the same. The
    group's ``pers_max`` is the board's cap: a call the board does not compute gets a
    persistent request up to ``persistent.CEILING`` bytes and None past it (the caller's
    non-blocking call: a persistent request of that size would cost two copies)."""

    __slots__ = ("board",)

    def __init__(self, comm: Any, board: Board) -> None:
        super().__init__(comm)
        self.board = board

    def all_reduce(self, key: int, nbytes: int, mt: Any, mop: Any) -> Optional[_pers.Call]:
        cc = codes(mt, mop)
        if cc is None or nbytes > self.board.most[REDUCE]:
            return super().all_reduce(key, nbytes, mt, mop) if nbytes <= _pers.CEILING else None

        def bufs() -> tuple:
            whole = memoryview(np.empty(nbytes, np.uint8))
            return whole, whole, whole, whole
        return self._add(self.ar, key, lambda: _Made(Call(self.board, REDUCE, nbytes, cc), bufs))

    def all_gather(self, nbytes: int) -> Optional[_pers.Call]:
        if nbytes * self.n > self.board.most[GATHER]:
            return super().all_gather(nbytes) if nbytes * self.n <= _pers.CEILING else None

        def bufs() -> tuple:
            whole = memoryview(np.empty(nbytes * self.n, np.uint8))
            mine = whole[self.rank * nbytes:(self.rank + 1) * nbytes]
            return mine, whole, mine, whole
        return self._add(self.ag, nbytes, lambda: _Made(Call(self.board, GATHER, nbytes), bufs))

    def reduce_scatter(self, key: int, nbytes: int, mt: Any,
                       mop: Any) -> Optional[_pers.Call]:
        cc = codes(mt, mop)
        if cc is None or nbytes * self.n > self.board.most[REDUCE_PART]:
            if nbytes * self.n > _pers.CEILING:
                return None
            return super().reduce_scatter(key, nbytes, mt, mop)

        def bufs() -> tuple:
            into = memoryview(np.empty(nbytes * self.n, np.uint8))
            out = memoryview(np.empty(nbytes, np.uint8))
            return into, out, into, out
        return self._add(self.rs, key, lambda: _Made(
            Call(self.board, REDUCE_PART, nbytes * self.n, cc), bufs))

    def reduce(self, key: tuple, nbytes: int, mt: Any, mop: Any,
               root: int) -> Optional[_pers.Call]:
        cc = codes(mt, mop)
        if cc is None or nbytes > self.board.most[ROOTED]:
            return None
        mine = self.rank == root

        def bufs() -> tuple:  # (the others' take reads nothing: no destination)
            whole = memoryview(np.empty(nbytes, np.uint8))
            return whole, whole, whole, whole if mine else None
        return self._add(self.rd, key, lambda: _Made(
            Call(self.board, ROOTED, nbytes, cc, root), bufs))

    def broadcast(self, key: int, nbytes: int, root: int) -> Optional[_pers.Call]:
        if nbytes < self.board.bcast_min or nbytes > self.board.most[BCAST]:
            return super().broadcast(key, nbytes, root) if nbytes <= _pers.CEILING else None
        mine = self.rank == root

        def bufs() -> tuple:
            whole = memoryview(np.empty(nbytes, np.uint8))
            return whole, whole, whole if mine else None, None if mine else whole
        return self._add(self.bc, key, lambda: _Made(
            Call(self.board, BCAST, nbytes, root=root), bufs))


class _Made(_pers.Call):
    """The persistent request's stand-in for a board call: the board call as its request, and
    the call's spec as the ``fast`` way of blocking calls, which run straight from and into
    the caller's buffers. Its own buffers (what ``into`` takes, what ``out`` holds) are made
    by the first call that needs them: an async call, or a blocking one that finds its entry
    or its request busy. Made with every call of every size, they held a 4-rank job of
    random calls of up to 64 KiB 11-14 MiB above its first tenth (tests/test_faults_comm.py)."""

    __slots__ = ("call", "make", "_into", "_out")

    def __init__(self, call: Call, make: Any) -> None:  # (not the base's: nothing made yet)
        self.call, self.make = call, make
        self.bufs = self._into = self._out = None
        self.active, self.gen, self.dst, self.label = False, 0, None, ("", 0)
        self.fast = call.spec

    def _made(self) -> None:
        into, out, src, dst = self.make()
        self._into, self._out = into, out
        self.bufs = (into, out)
        c = self.call
        c.src, c.out, c.dst = src, dst, dst

    @property
    def req(self) -> Call:  # type: ignore[override]
        if self.bufs is None:
            self._made()
        return self.call

    @property
    def into(self) -> memoryview:  # type: ignore[override]
        if self.bufs is None:
            self._made()
        return self._into

    @property
    def out(self) -> memoryview:  # type: ignore[override]
        if self.bufs is None:
            self._made()
        return self._out

    def free(self) -> bool:
        """Nothing of MPI's to free (a board call stays valid while its board lives: the
        broadcasts' lane may hold it); False while a call runs on it."""
        return not self.active
