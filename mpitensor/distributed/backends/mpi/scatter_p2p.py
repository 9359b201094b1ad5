"""reduce_scatter as messages, reduced here in rank order (issue 29).

Between the board's sizes (``board_most("reduce_scatter")``) and the engine's (shm_coll.py), a
reduce-scatter ran on MPICH's ``Ireduce_scatter_block``, which at these sizes copies its input
into scratch buffers before it exchanges and reduces them. Here each member instead sends every
peer that peer's part of its input, receives its own part of every peer's, and reduces the parts
itself, in rank order, with NumPy: the bytes a pairwise exchange moves, none copied first. Raw
mpi4py's time over ours, in the same run (2026-11-30, ``benchmarks/compare_collectives.py``):
1.18-1.78x on 2 ranks from 512 KiB to 8 MiB of input (MPI's path: 0.92x at 512 KiB). On 4 ranks
of 2 cores, against our call on MPI's path, interleaved: 0.88-1.05x against 0.84-1.00x at 512
KiB, 0.97-1.13x against 0.79-0.90x at 1-2 MiB.

**Which calls.** The choice is the same on every member of a correct program, whatever path
its own arguments take (the fast path, or the general one's staging and plan): a group of
:data:`MOST` members at most, all on one machine (across machines a host would send the
bytes of a whole input over its link for each of its ranks), an input of more bytes than
the group's board takes (``SmallCalls.board_most``: its ``pers_max`` where it has none), at
least :data:`LEAST` and at most :data:`BIGGEST`, and a
reduction NumPy does exactly as MPI's predefined op does (:func:`ufunc`: sums, products,
minima, maxima and the bitwise ops, on bool, integer, floating and complex buffers, float16
and bfloat16 being reduced in float32 as the plan says). Any other op, a user-defined one
among them, stays with MPI.

**The order.** A member's part is ``part_0 op part_1 op ... op part_p-1``, in that order, so
the result does not depend on which message arrived first.

**Where they travel.** As gather_p2p.py's: on the group's notice communicator, tagged with
``tag_base``; messages between two members keep their order, so consecutive and async calls of
either kind match call for call. The agreement check, bounded wait and async work are the
general path's. The parts are reduced in the request's ``Test`` once every message is done.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
from mpi4py import MPI

#: the largest group whose reduce-scatters take this path (each member posts one receive and
#: one send per peer at once)
MOST = 8
#: the fewest bytes of input a reduce-scatter needs to take it
LEAST = 64 << 10
#: the most: the peers' parts need a buffer of (p - 1) / p of the input, kept for the next
#: call, where MPI's pairwise exchange needs one part's; past this size the engine
#: (shm_coll.py) takes these calls where it is on, MPI's own call where it is not
BIGGEST = 16 << 20

_testall = MPI.Request.Testall
# MPI's predefined op -> the NumPy ufunc that computes it elementwise, exactly (an Op is not
# hashable: looked up by identity)
_UFUNCS = ((MPI.SUM, np.add), (MPI.PROD, np.multiply), (MPI.MIN, np.minimum),
           (MPI.MAX, np.maximum), (MPI.BAND, np.bitwise_and), (MPI.BOR, np.bitwise_or),
           (MPI.BXOR, np.bitwise_xor))
# scratch buffers kept per group: one per size, for the few sizes last used
_KEPT = 4


def ufunc(mop: Any, dtype: np.dtype) -> Any:
    """The ufunc that reduces ``dtype`` buffers as MPI's ``mop`` does, or None."""
    if dtype.kind not in "biufc":
        return None
    for op, f in _UFUNCS:
        if op is mop:
            return f
    return None


def takes(g: Any, nbytes: int, dtype: np.dtype, mop: Any) -> bool:
    """Whether a reduce-scatter of ``nbytes`` of input (``dtype`` buffers reduced with MPI op
    ``mop``, after the plan's conversion) takes this path on group ``g``."""
    p = g.size_
    return (2 <= p <= MOST and nbytes > g.board_most("reduce_scatter")
            and LEAST <= nbytes <= BIGGEST and g.one_node is True and ufunc(mop, dtype) is not None)


class Scatter:
    """One reduce-scatter's messages as one request; complete once every message is done and
    this member's part reduced."""

    __slots__ = ("reqs", "parts", "out", "f", "g", "scratch")

    def __init__(self, reqs: list, parts: list, out: Any, f: Any, g: Any,
                 scratch: Any) -> None:
        self.reqs, self.parts, self.out, self.f = reqs, parts, out, f
        self.g, self.scratch = g, scratch

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI's request protocol
        if self.parts is None:
            return True
        if not _testall(self.reqs):
            return False
        parts, out, f = self.parts, self.out, self.f
        f(parts[0], parts[1], out=out)
        for part in parts[2:]:
            f(out, part, out=out)
        self.parts = None
        _give_back(self.g, self.scratch)
        return True


def _scratch(g: Any, shape: tuple, dtype: np.dtype) -> Any:
    """A buffer for the peers' parts: the group's kept one of this size when free (a fresh
    one of a few hundred KiB would fault in every page on each call), else a new one."""
    kept: Optional[dict] = getattr(g, "_rs_scratch", None)
    key = (shape, dtype)
    buf = kept.pop(key, None) if kept else None
    return buf if buf is not None else np.empty(shape, dtype)


def _give_back(g: Any, buf: Any) -> None:
    kept: Optional[dict] = getattr(g, "_rs_scratch", None)
    if kept is None:
        kept = g._rs_scratch = {}
    kept.pop((buf.shape, buf.dtype), None)  # (the newest last: dicts keep insertion order)
    kept[(buf.shape, buf.dtype)] = buf
    while len(kept) > _KEPT:
        del kept[next(iter(kept))]


def start(g: Any, send: Any, out: Any, mt: Any, mop: Any) -> Scatter:
    """Post the messages of one reduce-scatter: ``send`` holds every member's part end to end,
    ``out`` (contiguous, ``send``'s dtype, not overlapping the peers' parts of ``send``)
    receives this member's reduced part."""
    p, me = g.size_, g.rank_
    h = g.health
    diag, tag = h.diag, h.tag_base
    chunks = send.reshape(p, -1)
    n = chunks.shape[1]
    scratch = _scratch(g, (p - 1, n), send.dtype)
    reqs = [diag.Irecv([scratch[j - (j > me)], mt], j, tag) for j in range(p) if j != me]
    # each member sends to the next members first, as gather_p2p.start does
    reqs += [diag.Isend([chunks[(me + d) % p], mt], (me + d) % p, tag) for d in range(1, p)]
    parts = [chunks[me] if j == me else scratch[j - (j > me)] for j in range(p)]
    return Scatter(reqs, parts, out.reshape(-1), ufunc(mop, send.dtype), g, scratch)
