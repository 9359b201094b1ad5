"""Always-on agreement check for large collectives: a tiny reduction beside the data.

Horovod compares every collective's op, dtype and shape across ranks before it runs; torch does
so only in debug mode. Here a collective whose buffer holds at least ``group.check_bytes`` bytes
(``MPITENSOR_CHECK_BYTES``, 64 KiB by default) also starts, beside its data operation, a
non-blocking MAX reduction of its *fingerprint* ``f`` and of ``-f`` on the group's private
communicator (``g.diag``): 8 int64 words out and back. Every field then has the same maximum and
minimum exactly when every rank passed the same value, so one reduction settles the question and
every rank learns the verdict at the same moment. The fields:

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
"""

from __future__ import annotations

import zlib
from typing import Any, Optional

import numpy as np
from mpi4py import MPI

from ..errors import CollectiveMismatchError
from . import _faults
from ._watchdog import wait as _wait
from .process_group import ReduceOp

# Operations whose buffer has the same shape on every rank of a correct program: byte count and
# shape are part of their fingerprint (and decide whether the call is checked). all_to_all and
# all_to_all_single with split sizes move different amounts per rank: never checked here.
SHAPED = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
          "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all_single")
_OPS = {name: i + 1 for i, name in enumerate(SHAPED)}
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

    __slots__ = ("data", "req", "buf", "group", "op", "seq", "pool", "slot", "keep")
    buf: tuple  # (int64 array, bytes of what was sent, bytes of the result)

    def __init__(self, g: Any, data: Any, op: str, seq: int, arr: Any,
                 reduce: Optional[ReduceOp] = None, root: int = -1, keep: Any = None) -> None:
        key = (op, arr.dtype, arr.shape, reduce, root)
        t = _templates.get(key)
        if t is None:
            t = _template(key, arr.nbytes)
        self.data, self.group, self.op, self.seq = data, g, op, seq
        self.keep = arr if keep is None else keep
        pool = g.fp_pool
        if pool.reqs is None:
            self.buf = buf = _buffer()
            arr64 = buf[0]
            buf[1][:] = t
            arr64[0], arr64[_N] = seq, -seq
            self.pool = None
            self.req = g.diag.Iallreduce([arr64[:_2N], _I64], [arr64[_2N:], _I64], _MAX)
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
            _wait(self.group, self.req, f"{self.op} (agreement check)", self.seq)
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
        g = self.group
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
        _faults.mark_broken(g, _faults.Story(g.global_rank, self.op, self.seq, reason),
                            tell=False)
        raise CollectiveMismatchError(
            f"rank {g.global_rank}: {self.op} (#{self.seq} on {g.name}): {reason}. Every rank "
            "must make the same collective calls in the same order with the same dtype, shape, "
            "op and root; the data was already posted against a different call, so every later "
            f"call on {g.name} raises. Run with MPITENSOR_DEBUG=1 to see each rank's arguments.")

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


def check(g: Any, data: Any, op: str, seq: int, keep: Any, arr: Any,
          reduce: Optional[ReduceOp] = None, root: int = -1) -> Any:
    """``data``, or a request that also checks agreement when ``arr`` is large enough."""
    if arr.nbytes < g.check_bytes or g.diag is None:
        return data
    return Checked(g, data, op, seq, arr, reduce, root, keep)
