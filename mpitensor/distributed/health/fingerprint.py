"""Always-on agreement check for large collectives: a tiny reduction beside the data.

Horovod compares every collective's op, dtype and shape across ranks before it runs; torch does
so only in debug mode. Here a collective whose buffer holds at least ``group.check_bytes`` bytes
(``MPITENSOR_CHECK_BYTES``, 64 KiB by default) also starts, beside its data operation, a
non-blocking MAX reduction of its *fingerprint* ``f`` and of ``-f`` on the group's private
communicator (``GroupHealth.diag``): 8 int64 words out and back. Every field then has the same
maximum and minimum exactly when every rank passed the same value, so one reduction settles the
question and every rank learns the verdict at the same moment. The fields:

* the group's call number: two ranks in different calls never agree, even if both calls look
  alike, and a rank whose buffer fell below the threshold while a peer's did not is caught at
  that peer's next checked call;
* the operation, the dtype, the byte count and the shape (the last two only for operations whose
  buffer has one shape on every rank in a correct program), the reduction and the root.

The data operation is not held back: both run at once and the caller waits for both, so the
check costs the Python to post one small reduction (about 2 µs) on calls that take tens of
microseconds or more. Smaller calls go unchecked unless ``MPITENSOR_DEBUG`` is on (which checks
everything, more thoroughly and more slowly). A mismatch makes the group unusable on every rank:
the data operation was posted against a different call, so nothing on this group can be trusted.

**Groups on one machine** (the common case: every rank of a one-node job, and any group of
ranks sharing a node) do without the reduction: the 2 µs it costs was 13-25 % of a 64 KiB
all-reduce or broadcast here (the target is 3 %). Their members share a small memory segment
(:class:`NodeCheck`, made with the group) with a ring of :data:`RING` slots per rank. Right
after posting a checked call's data operation, a rank writes its fingerprint into its slot for
that call number (a few stores); when its data operation is done, it reads the same slot of
every other member and compares. A member that has not written that slot yet is waited for (as
every rank waited for the reduction), and one whose counter has already passed the call without
writing it made that call unchecked, with a smaller buffer: a mismatch too. A rank that waits
for its data (blocking or async) also looks at the slots now and then, so a mismatch that
leaves MPI waiting for ever (every rank claiming the root) ends in the same error instead of
the timeout. The rank that finds a mismatch tells the others, as for any error that breaks a
group. Groups that span machines (or where the segment cannot be made, or on CPUs other than
x86-64, whose stores may be seen out of order) keep the reduction.

The write and the read are compiled (``_slots.c``, built at install where a C compiler is
present): in Python they cost about 0.7 µs a call (6-10 % at 64 KiB), compiled 0.1-0.2 µs
(1-2 %). The compiled ``post`` reads the fingerprint straight from a NumPy array's dtype and
shape; its ``settle`` answers the plain cases (all agree, one not there yet) and hands every
other reading to the Python one (``_settle_py``), which reads again and words the error. Both
write the same words (``_dtype16``, ``_shape_hash``), so ranks running either agree.
``MPITENSOR_NATIVE=0`` takes the Python methods.

**Split sizes.** An all-to-all whose pieces have sizes of their own (``all_to_all`` lists,
``all_to_all_single`` with split sizes) is checked by any size: what rank i sends rank j must
be what rank j expects from rank i, in the same dtype, and MPI says nothing when it is not. A
group on one machine of up to :data:`BOARD_MAX` ranks shares a board beside its slots: each
rank writes the count it sends every member into its row (``post_splits``), then its slot, and
reads its column once its data is done. Other groups exchange the counts beside the data
(:class:`Splits`).
"""

from __future__ import annotations

import array
import mmap
import zlib
from typing import Any, Optional

import numpy as np
from mpi4py import MPI

from ..._base import config as _config
from ...errors import CollectiveMismatchError
from ..backends.mpi import shm as _shm
from ..process_group import ReduceOp
from . import faults as _faults
from .state import GroupHealth
from .watchdog import wait as _wait

# Operations whose buffer has the same shape on every rank of a correct program: byte count and
# shape are part of their fingerprint (and decide whether the call is checked). all_to_all and
# all_to_all_single with split sizes move different amounts per rank: never checked here.
SHAPED = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
          "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all_single")
# the all-to-alls whose pieces have sizes of their own, checked by their split sizes (Splits,
# NodeCheck.post_splits) rather than by a shape
UNEVEN = ("all_to_all", "all_to_all_single with split sizes")
_OPS = {name: i + 1 for i, name in enumerate(SHAPED + UNEVEN)}
_REDUCE = {op: i + 1 for i, op in enumerate(ReduceOp.members.values())}
_FIELDS = ("call number", "operation", "dtype", "byte count", "shape", "reduction", "root")
_N = len(_FIELDS)
_2N = 2 * _N
_I64 = MPI.INT64_T
_MAX = MPI.MAX
_dtype_codes: dict = {}


def _dtype_code(dtype: Any) -> int:
    # dtype.num differs between equal dtypes (int64 is 'l' or 'q'): use the portable string
    code = _dtype_codes.get(dtype)
    if code is None:
        code = _dtype_codes[dtype] = zlib.crc32(np.dtype(dtype).str.encode())
    return code


def _shape_code(shape: tuple) -> int:
    # hash() of a tuple of ints is the same in every process (no string hashing involved)
    return hash(shape) & 0x3FFFFFFFFFFFFFFF


_orphans: list = []  # (request, buffers) of data operations posted against a mismatched call
# (op, dtype, shape, reduce, root) -> the bytes of [f, -f] with call number 0: copying 112 bytes
# into a memoryview and comparing two of them cost 0.2-0.5 µs, NumPy slicing and == several µs
_templates: dict = {}
POOL = 16  # persistent reductions per group: checked calls in flight before one must finish


def _template(key: tuple, nbytes: int) -> np.ndarray:
    op, dtype, shape, reduce, root = key
    t = np.zeros(_2N, np.int64)
    t[1:_N] = (_OPS.get(op, 0), _dtype_code(dtype), nbytes, _shape_code(shape),
               _REDUCE.get(reduce, 0) if reduce is not None else 0, root)
    np.negative(t[:_N], out=t[_N:])
    if len(_templates) >= 4096:  # programs with ever-new shapes: keep the cache bounded
        _templates.clear()
    b = _templates[key] = t.tobytes()
    return b


def _buffer() -> tuple:
    """An int64 buffer for [f, -f] and the result, and byte views of the two halves."""
    buf = np.zeros(2 * _2N, np.int64)
    raw = memoryview(buf).cast("B")
    half = _2N * 8
    return buf, raw[:half], raw[half:]


class Pool:
    """A group's persistent MAX reductions (MPI-4 ``Allreduce_init``, made once, collectively,
    with the group): starting one costs about half of posting a new ``Iallreduce``. The
    ``i``-th checked call uses slot ``i % POOL`` on every rank, so the slots match up; an MPI
    without persistent collectives gets ``Iallreduce`` every time instead."""

    __slots__ = ("reqs", "bufs", "owners", "next")

    def __init__(self, diag: Any) -> None:
        self.bufs = [_buffer() for _ in range(POOL)]
        self.owners: list = [None] * POOL  # the Checked using each slot, until it verified
        self.next = 0
        try:
            self.reqs: Optional[list] = [
                diag.Allreduce_init([b[:_2N], _I64], [b[_2N:], _I64], _MAX)
                for b, _, _ in self.bufs]
        except (NotImplementedError, MPI.Exception):
            self.reqs = None

    def free(self) -> None:
        for r, owner in zip(self.reqs or (), self.owners):
            if owner is None:  # an active one (an async call never waited for) is left to MPI
                r.Free()
        self.reqs = None


class Checked:
    """Looks like an MPI request: completes when the data operation and its check have; the
    first test after the check's reduction arrives raises if the ranks disagree."""

    __slots__ = ("data", "req", "buf", "health", "op", "seq", "pool", "slot", "keep")
    buf: tuple  # (int64 array, bytes of what was sent, bytes of the result)

    def __init__(self, h: GroupHealth, data: Any, op: str, seq: int, arr: Any,
                 reduce: Optional[ReduceOp] = None, root: int = -1, keep: Any = None) -> None:
        key = (op, arr.dtype, arr.shape, reduce, root)
        t = _templates.get(key)
        if t is None:
            t = _template(key, arr.nbytes)
        self.data, self.health, self.op, self.seq = data, h, op, seq
        self.keep = arr if keep is None else keep
        pool = h.fp_pool
        if pool.reqs is None:
            self.buf = buf = _buffer()
            arr64 = buf[0]
            buf[1][:] = t
            arr64[0], arr64[_N] = seq, -seq
            self.pool = None
            self.req = h.diag.Iallreduce([arr64[:_2N], _I64], [arr64[_2N:], _I64], _MAX)
            return
        i = pool.next
        pool.next = (i + 1) % POOL
        prev = pool.owners[i]
        if prev is not None:  # an async call POOL checked calls ago was never waited for
            prev.finish_check()
        pool.owners[i] = self
        self.pool, self.slot = pool, i
        buf = self.buf = pool.bufs[i]
        buf[1][:] = t
        arr64 = buf[0]
        arr64[0], arr64[_N] = seq, -seq
        req = self.req = pool.reqs[i]
        req.Start()

    def finish_check(self) -> None:
        """Wait for this call's check (bounded by the group's timeout) and verify it."""
        if self.req is not None:
            _wait(self.health, self.req, f"{self.op} (agreement check)", self.seq)
            self._checked()

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI request protocol
        if self.req is not None:
            if not self.req.Test():
                return False
            self._checked()
        return self.data.Test(status)

    def _checked(self) -> None:
        self.req = None
        if self.pool is not None:
            self.pool.owners[self.slot] = None
        self._verify()

    def _verify(self) -> None:
        # everyone passed f exactly when max(f) = f and max(-f) = -f: the result is what we sent
        _, sent, got = self.buf
        if got == sent:
            return
        buf = self.buf[0]
        hi, lo = buf[_2N:_2N + _N], -buf[_2N + _N:]
        h = self.health
        # The data operation was matched against another call and may never complete (or may
        # write later): its buffers must outlive it, so they are kept for the life of the process
        _orphans.append((self.data, self.keep))
        differ = [i for i in range(_N) if hi[i] != lo[i]]
        names = ", ".join(_FIELDS[i] for i in differ)
        mine = self._mine()
        detail = []
        for i in differ:
            if i in (0, 3, 6):  # plain numbers: the range says what the others passed
                detail.append(f"{_FIELDS[i]} from {int(lo[i])} to {int(hi[i])} across the ranks")
        reason = (f"ranks disagree on the {names} of this call; this rank passed {mine}"
                  + (f" ({'; '.join(detail)})" if detail else ""))
        # every member took part in this reduction, so each reads the same verdict and raises
        # the same error itself: no notice needed (it could beat a peer's own verdict)
        _faults.mark_broken(h, _faults.Story(h.global_rank, self.op, self.seq, reason),
                            tell=False)
        raise CollectiveMismatchError(
            f"rank {h.global_rank}: {self.op} (#{self.seq} on {h.name}): {reason}. Every rank "
            "must make the same collective calls in the same order with the same dtype, shape, "
            "op and root; the data was already posted against a different call, so every later "
            f"call on {h.name} raises. Run with MPITENSOR_DEBUG=1 to see each rank's arguments.")

    def _mine(self) -> str:
        b = self.buf[0]
        names = {v: k for k, v in _OPS.items()}
        reds = {v: k.name for k, v in _REDUCE.items()}
        parts = [f"call #{int(b[0])}", names.get(int(b[1]), "another operation"),
                 f"{int(b[3])} bytes"]
        if b[5]:
            parts.append(f"op {reds.get(int(b[5]), '?')}")
        if b[6] >= 0:
            parts.append(f"root {int(b[6])}")
        return ", ".join(parts)


# ------------------------------------------------------------------------------ one machine
RING = 64  # slots per rank: a member can be this many checked calls ahead of a reader
BOARD_MAX = 16  # groups up to this size also share a board of split sizes (RING * size² words)
_LINE = 8  # int64 words per slot (a cache line): call number, operation, byte count, shape
# (op, dtype, shape, reduce, root) -> (operation word, byte count, shape hash)
_words_cache: dict = {}
_M64 = (1 << 64) - 1


def _dtype16(dtype: Any) -> int:
    """A dtype's 16 bits in the slots: its kind, whether it is big-endian, its item size
    (``_slots.c`` computes the same from the array). Equal dtypes give equal bits, however they
    were spelled (int64 as 'l' or 'q')."""
    d = np.dtype(dtype)
    return (ord(d.kind) & 0x7F) | (d.byteorder == ">") << 7 | (d.itemsize & 0xFF) << 8


def _shape_hash(shape: tuple) -> int:
    """A shape's hash in the slots (``_slots.c`` computes the same): 64-bit FNV-style steps
    over the dimensions, cut to 62 bits."""
    shash = 0x9E3779B97F4A7C15 ^ len(shape)
    for d in shape:
        shash = ((shash ^ d) * 0x100000001B3) & _M64
    return shash & 0x3FFFFFFFFFFFFFFF


def _words(op: str, dtype: Any, shape: tuple, reduce: Any, root: int, nbytes: int) -> tuple:
    """The slot words of a call: operation, reduction, dtype and root packed in one (5, 5,
    16 and 32 bits), the byte count and the shape's hash."""
    a = (_OPS.get(op, 0) | (_REDUCE.get(reduce, 0) if reduce is not None else 0) << 5
         | _dtype16(dtype) << 10 | (root + 1) << 26)
    w = (a, nbytes, _shape_hash(shape))
    if len(_words_cache) >= 4096:
        _words_cache.clear()
    _words_cache[(op, dtype, shape, reduce, root)] = w
    return w


def _unpack(a: int) -> dict:
    return {"operation": a & 31, "reduction": (a >> 5) & 31, "dtype": (a >> 10) & 0xFFFF,
            "root": (a >> 26) - 1}


try:  # the compiled post and settle (_slots.c), where they were built
    from ._slots import Slots as _CSlots
except ImportError:
    _CSlots = None


class _Common:
    """What the Python and the compiled slots share: making the segment, and every reading
    that is not plain agreement (read again and worded here)."""

    __slots__ = ()
    mm: mmap.mmap
    q: Any
    me: int
    mine: int
    peers: list
    rank: int
    size: int
    board: int

    def _fields(self, mm: mmap.mmap, rank: int, size: int) -> None:
        self.mm = mm
        self.q = memoryview(mm).cast("q")
        region = (RING + 1) * _LINE
        self.me = rank * region  # this rank's header word
        self.mine = self.me + _LINE  # and its first slot
        # (member, its header word, its first slot) of every other member
        self.peers = [(r, r * region, r * region + _LINE) for r in range(size) if r != rank]
        self.rank, self.size = rank, size
        # the split sizes board (see post_splits): after the slots, or none (-1)
        self.board = size * region if size <= BOARD_MAX else -1

    @staticmethod
    def segment_bytes(size: int) -> int:
        board = size * RING * size if size <= BOARD_MAX else 0
        return 8 * (size * (RING + 1) * _LINE + board)

    def _settle_splits(self, tok: tuple, h: GroupHealth, look: bool) -> bool:
        """:meth:`_settle_py` for a token of :meth:`post_splits`: the slots as for any call,
        and each member's count for this rank on the board."""
        s, a = tok[0], tok[1]
        send, expect, what, unit = tok[6]
        q, n, me = self.q, self.size, self.rank
        c = s & (RING - 1)
        off = c << 3
        bad = [] if send[me] == expect[me] else [(me, send[me])]
        posted = True
        for r, head, base in self.peers:
            i = base + off
            t = q[i]
            if t != s and t != -1 and t < s and q[head] > s:
                # past call s: posted it between the two loads (read again: final), or not
                t = q[i]
                if t < s and t != -1:
                    self._unchecked(tok, h, r)
            if t == s:
                if q[i + 1] != a or q[i + 2] or q[i + 3]:
                    self._differs(tok, h, r, i)
                    continue  # (being rewritten: it went on)
                got = q[self.board + (r * RING + c) * n + me]
                if q[i] == s and got != expect[r]:  # (else rewritten meanwhile: it went on)
                    bad.append((r, got))
            elif t > s:
                continue  # it went on: more than RING calls ahead, its word is taken for it
            elif not look:
                return False  # not posted yet (or being written)
            else:
                posted = False
        if bad:
            bad.sort()
            _mismatch(h, tok, _split_reason(h, bad, expect, what, unit), _SPLIT_ADVICE)
        return posted

    @classmethod
    def create(cls, comm: Any) -> Optional["NodeCheck"]:
        """Collective over ``comm``: the group's slots, or None on every member where they
        cannot be shared (another machine, no /dev/shm, not x86-64)."""
        size, rank = comm.Get_size(), comm.Get_rank()
        mm = _shm.shared(comm, "mpitensor-check-", cls.segment_bytes(size))
        return None if mm is None else cls(mm, rank, size)

    def close(self) -> None:
        q, self.q = self.q, None
        if q is not None:
            q.release()
            self.mm.close()

    def _words_of(self, op: str, arr: Any, reduce: Any, root: int) -> tuple:
        w = _words_cache.get((op, arr.dtype, arr.shape, reduce, root))
        if w is None:
            w = _words(op, arr.dtype, arr.shape, reduce, root, arr.nbytes)
        return w

    def peek(self, tok: tuple, h: GroupHealth) -> None:
        """:meth:`settle` while this rank waits for its data (see ``look``)."""
        self.settle(tok, h, True)

    def _settle_py(self, tok: tuple, h: GroupHealth, look: bool = False) -> bool:
        """:meth:`settle`, every case: after this rank's data operation completed, True when
        every other member posted the same fingerprint for the call, False while one has not
        posted yet; raises CollectiveMismatchError (and breaks the group) when one differs.

        ``look``: while this rank still waits for its data, raise for any member that already
        shows a different fingerprint (a mismatch MPI might never complete), passing over the
        ones that have not posted instead of stopping at the first."""
        if len(tok) > 6:
            return self._settle_splits(tok, h, look)
        s, a, nbytes, shash = tok[0], tok[1], tok[2], tok[3]
        q = self.q
        off = (s & (RING - 1)) << 3
        posted = True
        for r, head, base in self.peers:
            i = base + off
            t = q[i]
            if t == s:
                if q[i + 1] == a and q[i + 2] == nbytes and q[i + 3] == shash:
                    continue
                self._differs(tok, h, r, i)
            elif t > s:
                continue  # it already compared its call s with this rank's, and went on
            elif t != -1 and q[head] > s:
                self._passed(tok, h, r, i)  # raises unless it posted call s after all
            elif not look:
                return False  # not posted yet (or being written)
            else:
                posted = False
        return posted

    def _differs(self, tok: tuple, h: GroupHealth, r: int, i: int) -> None:
        q = self.q
        t, a, nbytes, shash, t2 = q[i], q[i + 1], q[i + 2], q[i + 3], q[i]
        if t != tok[0] or t2 != t:
            return  # being rewritten for a later call: it has moved on, so it agreed
        mine, theirs = _unpack(tok[1]), _unpack(a)
        names = {v: k for k, v in _OPS.items()}
        reds = {v: k.name for k, v in _REDUCE.items()}
        differ, said = [], []
        if mine["operation"] != theirs["operation"]:
            differ.append("operation")
            said.append(names.get(theirs["operation"], "another operation"))
        if mine["dtype"] != theirs["dtype"]:
            differ.append("dtype")
            said.append(_dtype_name(theirs["dtype"]))
        # an all-to-all with split sizes has no byte count or shape of its own (0 in its slot)
        sized = names.get(mine["operation"]) not in UNEVEN and \
            names.get(theirs["operation"]) not in UNEVEN
        if nbytes != tok[2] and sized:
            differ.append("byte count")
            said.append(f"{nbytes} bytes")
        elif names.get(theirs["operation"]) in UNEVEN and mine["operation"] != \
                theirs["operation"]:
            said.append("split sizes of its own")
        if shash != tok[3] and sized:
            differ.append("shape")
        if mine["reduction"] != theirs["reduction"]:
            differ.append("reduction")
            said.append(f"op {reds.get(theirs['reduction'], '?')}")
        if mine["root"] != theirs["root"]:
            differ.append("root")
            said.append(f"root {theirs['root']}")
        extra = ""
        if nbytes != tok[2] and sized:
            lo, hi = sorted((nbytes, tok[2]))
            extra = f" (byte count from {lo} to {hi} across the ranks)"
        what = ", ".join(differ[:-1]) + " and " + differ[-1] if len(differ) > 1 else differ[0]
        _mismatch(h, tok, f"ranks disagree on the {what} of this call; this rank "
                          f"passed {_described(tok)}, rank {h.ranks[r]} passed "
                          f"{', '.join(said) or 'other arguments'}{extra}")

    def _passed(self, tok: tuple, h: GroupHealth, r: int, i: int) -> None:
        """Member ``r``'s header is past call ``s`` but its slot ``i`` did not hold ``s``.

        The slot was read before the header, so the member may have posted ``s`` (and gone
        on to its next call) between the two reads. It writes a slot before its header, so
        the slot read again now is final for call ``s``: ``s`` itself is compared as usual,
        a later call (or one being written) means it went on after posting, and only an
        earlier one means it made call ``s`` without a fingerprint."""
        q, s = self.q, tok[0]
        t = q[i]
        if t == s:
            if q[i + 1] != tok[1] or q[i + 2] != tok[2] or q[i + 3] != tok[3]:
                self._differs(tok, h, r, i)
        elif t < s and t != -1:
            self._unchecked(tok, h, r)

    def _unchecked(self, tok: tuple, h: GroupHealth, r: int) -> None:
        small = (f"call #{tok[0]} with fewer than {h.check_bytes} bytes (unchecked), or "
                 if h.check_bytes > 0 else "")
        _mismatch(h, tok, f"ranks disagree on the call number or the byte count of this call: "
                          f"this rank passed {_described(tok)}, but rank {h.ranks[r]} made "
                          f"{small}one call more or fewer before it")


class _PyNodeCheck(_Common):
    """The slots in Python (where ``_slots.c`` was not built, or ``MPITENSOR_NATIVE`` is off).

    Each member owns a region of the segment: a header word (the number of the last call it
    posted a fingerprint for), then :data:`RING` slots, each in a cache line of its own (a
    line that two ranks write in turn costs a transfer between cores every call). A writer
    marks the slot (-1) before filling it and writes the call number last, so a reader that
    sees the call number sees the words of that call; x86-64 keeps stores in order.
    """

    __slots__ = ("mm", "q", "me", "mine", "peers", "rank", "size", "board")

    def __init__(self, mm: mmap.mmap, rank: int, size: int) -> None:
        self._fields(mm, rank, size)

    def _write(self, s: int, a: int, nbytes: int, shash: int) -> None:
        """Fill this rank's slot for call ``s``: marked, the words, the call number, then the
        header (the order readers rely on)."""
        q = self.q
        i = self.mine + ((s & (RING - 1)) << 3)
        q[i] = -1
        q[i + 1], q[i + 2], q[i + 3] = a, nbytes, shash
        q[i] = s
        q[self.me] = s

    def post(self, s: int, op: str, arr: Any, reduce: Any, root: int, keep: Any) -> tuple:
        """Write this rank's fingerprint of call ``s``; return the token to settle it with."""
        a, nbytes, shash = self._words_of(op, arr, reduce, root)
        self._write(s, a, nbytes, shash)
        return (s, a, nbytes, shash, op, keep)

    def post_splits(self, s: int, op: str, send: list, expect: list, what: str, unit: int,
                    dtype: Any, keep: Any) -> tuple:
        """Post call ``s``, an all-to-all whose pieces have sizes of their own: this rank's
        row of the board (the count it sends each member), then its slot (the operation and
        dtype, no byte count or shape: those differ between ranks in a correct program).
        Its settle compares every member's count for this rank with ``expect``."""
        n = self.size
        row = self.board + (self.rank * RING + (s & (RING - 1))) * n
        self.q[row:row + n] = array.array("q", send)
        a = _OPS[UNEVEN[0] if op == "all_to_all" else UNEVEN[1]] | _dtype16(dtype) << 10
        self._write(s, a, 0, 0)
        return (s, a, 0, 0, op, keep, (send, expect, what, unit))

    settle = _Common._settle_py


if _CSlots is not None:
    class _CNodeCheck(_Common, _CSlots):
        """The slots with the compiled ``post`` and ``settle`` (``_slots.c``), same layout."""

        __slots__ = ("mm", "q", "me", "mine", "peers", "rank", "size", "board")

        def __init__(self, mm: mmap.mmap, rank: int, size: int) -> None:
            self._fields(mm, rank, size)
            _CSlots.__init__(self, mm, rank, size, RING, _LINE, self.board, _OPS, _REDUCE)

        def close(self) -> None:
            self.release()
            _Common.close(self)

# the groups' slots: compiled, unless MPITENSOR_NATIVE is off (or they were not built)
NodeCheck: type = _CNodeCheck if _CSlots is not None and _config.NATIVE else _PyNodeCheck


def _dtype_name(code: int) -> str:
    for t in np.sctypeDict.values():
        try:
            if _dtype16(t) == code:
                return str(np.dtype(t))
        except TypeError:
            continue
    return "another dtype"


def _described(tok: tuple) -> str:
    w = _unpack(tok[1])
    reds = {v: k.name for k, v in _REDUCE.items()}
    names = {v: k for k, v in _OPS.items()}
    parts = [f"call #{tok[0]}", names.get(w["operation"], tok[4]),
             "split sizes of its own" if len(tok) > 6 else f"{tok[2]} bytes"]
    if w["reduction"]:
        parts.append(f"op {reds.get(w['reduction'], '?')}")
    if w["root"] >= 0:
        parts.append(f"root {w['root']}")
    return ", ".join(parts)


def _mismatch(h: GroupHealth, tok: tuple, reason: str, advice: str = "") -> None:
    """Break ``h`` (telling the others: they may not have seen it) and raise."""
    _orphans.append(tok[5])  # the data operation may still write into these buffers
    h.fp_tok = None
    h.fp_async.pop(tok[0], None)
    _faults.mark_broken(h, _faults.Story(h.global_rank, tok[4], tok[0], reason))
    raise CollectiveMismatchError(_mismatch_text(h, tok[4], tok[0], reason, advice))


def _mismatch_text(h: GroupHealth, op: str, seq: int, reason: str, advice: str = "") -> str:
    if not advice:
        advice = ("Every rank must make the same collective calls in the same order with the "
                  "same dtype, shape, op and root; the data was already posted against a "
                  "different call")
    return (f"rank {h.global_rank}: {op} (#{seq} on {h.name}): {reason}. {advice}, so every "
            f"later call on {h.name} raises. Run with MPITENSOR_DEBUG=1 to see each rank's "
            "arguments.")


class NodeChecked:
    """An async checked call on a group with :class:`NodeCheck` slots, as an MPI request:
    complete once the data operation is and every member's fingerprint agrees."""

    __slots__ = ("data", "health", "tok", "done", "polls")

    def __init__(self, h: GroupHealth, data: Any, tok: tuple) -> None:
        self.data, self.health, self.tok, self.done, self.polls = data, h, tok, False, 0

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI request protocol
        if self.done:
            return True
        h = self.health
        if not self.data.Test(status):
            self.polls += 1
            if not self.polls & 63:  # a look at the slots now and then (a group of many
                h.fp_node.peek(self.tok, h)  # members costs a read per member)
            return False
        self.done = h.fp_node.settle(self.tok, h)
        if self.done:
            h.fp_async.pop(self.tok[0], None)
        return self.done


class Settling:
    """The wait for slow members' fingerprints after the data is done (blocking calls)."""

    __slots__ = ("health", "tok")

    def __init__(self, h: GroupHealth, tok: tuple) -> None:
        self.health, self.tok = h, tok

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI request protocol
        return self.health.fp_node.settle(self.tok, self.health)


def _split_reason(h: GroupHealth, bad: list, expect: list, what: str, unit: int) -> str:
    """What a rank says of the peers ``bad`` (``(group rank, count it sends this rank)``) whose
    pieces differ from what this rank expects of them."""
    def amount(n: int) -> str:
        if unit <= 1:
            return f"{n} elements"
        return f"{n // unit} row{'s' if n // unit != 1 else ''} ({n} elements)"

    said = "; ".join(f"rank {h.ranks[r]} sends {amount(n)} to this rank, which expects "
                     f"{amount(expect[r])} from it ({what}[{r}])" for r, n in bad[:4])
    return f"ranks disagree on the split sizes of this call: {said}"


_SPLIT_ADVICE = ("What rank i sends rank j (its input split j) must be what rank j expects from "
                 "rank i (its output split i), in the same dtype; the data was already posted")


class Splits:
    """An all-to-all whose ranks exchange pieces of their own sizes (``all_to_all`` lists,
    ``all_to_all_single`` with split sizes), as an MPI request, on a group without a board of
    split sizes (across machines, or of more than :data:`BOARD_MAX` ranks; see
    ``NodeCheck.post_splits`` for the others): complete once the data is and every
    peer's count for this rank, exchanged beside the data, is the count this rank expects from
    it, in the same dtype.

    A count that differs is what MPI leaves unsaid: a piece smaller than expected fills only
    the front of its place in the output (the rest keeps what was there), with no error. Each
    rank sends every peer the count it sends it and its dtype's code, in one ``Ialltoall`` of
    int64 pairs on the group's header communicator (which carries no other collective),
    started with the data; the rank that sees a count or dtype it does not expect raises
    ``CollectiveMismatchError`` naming the peer and both counts, and breaks the group, which
    ends the peers' waits as well.
    """

    __slots__ = ("data", "req", "health", "op", "seq", "sent", "seen", "expect", "what",
                 "unit", "code", "keep", "done")

    def __init__(self, h: GroupHealth, data: Any, op: str, seq: int, send: list, expect: list,
                 what: str, unit: int, dtype: Any, keep: Any) -> None:
        self.data, self.health, self.op, self.seq = data, h, op, seq
        self.code = code = _dtype16(dtype)
        pairs = array.array("q", bytes(16 * len(send)))
        pairs[0::2] = array.array("q", send)
        pairs[1::2] = array.array("q", [code]) * len(send)
        self.sent = pairs
        self.seen = array.array("q", bytes(16 * len(expect)))
        self.expect, self.what, self.unit, self.keep = expect, what, unit, keep
        self.done = False
        self.req = h.hdr.Ialltoall([self.sent, _I64], [self.seen, _I64])  # a pair per rank

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI request protocol
        if self.done:
            return True
        if self.req is not None:
            if not self.req.Test():
                return False
            self.req = None
            self._verify()
        if not self.data.Test(status):
            return False
        self.done = True
        return True

    def _verify(self) -> None:
        counts, codes, expect = self.seen[0::2].tolist(), self.seen[1::2].tolist(), self.expect
        if counts == expect and codes.count(self.code) == len(codes):
            return
        h = self.health
        _orphans.append((self.data, self.keep))  # the data may still be moving
        other = [r for r in range(len(codes)) if codes[r] != self.code]
        if other:
            reason = (f"ranks disagree on the dtype of this call: this rank passed "
                      f"{_dtype_name(self.code)}, rank {h.ranks[other[0]]} passed "
                      f"{_dtype_name(codes[other[0]])}")
        else:
            bad = [(r, counts[r]) for r in range(len(expect)) if counts[r] != expect[r]]
            reason = _split_reason(h, bad, expect, self.what, self.unit)
        _faults.mark_broken(h, _faults.Story(h.global_rank, self.op, self.seq, reason))
        raise CollectiveMismatchError(_mismatch_text(h, self.op, self.seq, reason,
                                                     _SPLIT_ADVICE))
