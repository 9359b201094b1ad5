"""all_gather into a list of separate arrays, as messages straight into them (issue 29).

MPI's ``Allgather`` writes one receive buffer. Where the caller's list is not one buffer's
consecutive pieces (``[torch.empty_like(t) for _ in range(n)]``, the usual way), our call
received into a flat buffer and copied every entry out of it: on 2 ranks here it took 1.7-2.9x
the time raw mpi4py takes to gather into one flat buffer, from 1 to 16 MiB in all. Each member
instead receives every peer's part with its own receive, straight into that peer's entry, and
sends its own to every peer: the same bytes as MPI's gather, none copied twice. Measured in the
same run (2026-11-30), raw ``Allgather``'s time into one flat buffer over ours: 0.88-1.54x at 2
ranks and 0.91-3.5x at 4 ranks (4 on 2 cores), from 256 KiB to 16 MiB in all, where the copying
call's was 0.34-0.96x.

**Which calls.** The choice is the same on every member of a correct program: a group of
:data:`MOST` members at most, all on one machine (across machines a host would send more bytes
over its link than MPI's ring does: each rank's part to every remote peer), a gather of more
bytes in all than the group's board takes (``SmallCalls.board_most``; without a board, its
``pers_max``: the persistent requests' calls below it) and at least :data:`LEAST`. Every member
then sends and receives the same messages, whatever its own list looks like: entries that lie
end to end in one buffer, arrays that are not contiguous or live on a GPU (received through a
staging buffer each) all take them.

``all_gather_into_tensor``, which copies nothing either way, takes the same messages only
where the group's board timed them faster than its own calls and MPI's gather
(``msg_choice.choose``, when the group is made: :func:`flat_takes`). Which wins is the
machine's: on one 2-core machine these messages took 1.10-1.19x the time of MPI's
``Iallgather`` from 1 to 4 MiB on inputs written just before each call (115-475 against 97-426
µs, 2 ranks, 2026-11-30), and the board 0.62-0.82x raw MPI's at 512 KiB; on another, whose MPI
moves a large message in one copy from the sender's memory, the messages took 0.51-0.85x the
board's time from 128 KiB to 512 KiB and 0.66-0.73x MPI's gather at 1 MiB (2026-12-01).

**Where they travel.** On the group's notice communicator (``GroupHealth.diag``), which user
messages never reach, with the tag ``tag_base`` (the group's incarnation, never that of a
notice: those are ``tag_base`` + 1 to 3, and the rendezvous' 4 is below every ``tag_base``).
Messages between two members arrive in the order they were sent, so consecutive (and async)
gathers match call for call. The agreement check, the bounded wait and async work are the
general path's (``Collectives._run``): a member that passes another size fails the check, or
MPI's receive of a longer message, which the check then explains.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
from mpi4py import MPI

from ...health import fingerprint as _fp
from . import all_reduce_into as _into
from . import buffers as B

#: the largest group whose list-form gathers take this path (each member posts one receive and
#: one send per peer at once; MPI's own ring suits larger groups)
MOST = 8
#: the fewest bytes in all (every member's part) a list-form gather needs to take it
LEAST = 64 << 10

_testall = MPI.Request.Testall
#: what ``fast`` answers for a call it leaves to the general path
PASS = object()


def takes(g: Any, nbytes: int) -> bool:
    """Whether an all_gather of ``nbytes`` in all, into a list, takes this path on group ``g``
    (the same answer on every member)."""
    p = g.size_
    return (2 <= p <= MOST and nbytes > g.board_most("all_gather") and nbytes >= LEAST
            and g.one_node is True)


def flat_takes(g: Any, nbytes: int) -> bool:
    """Whether an all_gather into one buffer of ``nbytes`` (``all_gather_into_tensor``, and
    MPI's gather of the group's other paths: ``SmallCalls._iallgather``) takes these messages
    on group ``g``: between the sizes its board timed them to win (``g.gather_msgs``, the same
    on every member; (0, 0) where they were not timed)."""
    lo, hi = g.gather_msgs
    return lo < nbytes <= hi


class Exchange:
    """One gather's receives and sends as one request: complete once every one of them is."""

    __slots__ = ("reqs",)

    def __init__(self, reqs: list) -> None:
        self.reqs = reqs

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI's request protocol
        return bool(_testall(self.reqs))


def targets(outs: list) -> "tuple[list, Optional[Callable[[], None]]]":
    """A buffer MPI can write for each entry (the entry itself where it can) and the step that
    copies the staged ones back (None where none is staged)."""
    bufs, backs = [], []
    for o in outs:
        buf, back = B.stage_out(o)
        bufs.append(buf)
        if back is not None:
            backs.append(back)
    if not backs:
        return bufs, None

    def copy_back() -> None:
        for back in backs:
            back()

    return bufs, copy_back


def _unaliased(send: Any, bufs: list, me: int) -> Any:
    """``send``, or a copy of it where a peer's part would be written over it while it is
    sent (``send`` may be this member's own entry itself: that one is written with ``send``)."""
    for j, buf in enumerate(bufs):
        rel = _into.relation(buf, send)
        if rel == _into.PARTIAL or (rel == _into.SAME and j != me):
            return send.copy()
    return send


def start(g: Any, arr: Any, bufs: list, mt: Any) -> Exchange:
    """Post the messages of one gather (``bufs``: a contiguous buffer per member, of
    ``arr``'s size) and write this member's own part; the request that completes them."""
    p, me = g.size_, g.rank_
    h = g.health
    diag, tag = h.diag, h.tag_base
    send = _unaliased(B.stage_in(arr), bufs, me)
    reqs = [diag.Irecv([bufs[j], mt], j, tag) for j in range(p) if j != me]
    # each member sends to the next members first: every member's first receive is matched
    # at once, and no member is every peer's first target
    reqs += [diag.Isend([send, mt], (me + d) % p, tag) for d in range(1, p)]
    own = bufs[me]
    if own is not send:
        own[...] = send.reshape(own.shape)
    return Exchange(reqs)


def start_flat(g: Any, send: Any, out: Any, mt: Any) -> Exchange:
    """Post the messages of one gather into ``out`` (contiguous: every member's part end to
    end, ``send``'s dtype) and write this member's own part; the request that completes them.
    The same messages as :func:`start`'s."""
    p, me = g.size_, g.rank_
    h = g.health
    diag, tag = h.diag, h.tag_base
    flat = out.reshape(-1)
    n = flat.size // p
    send = send.reshape(-1)
    if _into.relation(flat, send) != _into.APART:  # (callers pass it apart: kept safe)
        send = send.copy()
    reqs = [diag.Irecv([flat[j * n:(j + 1) * n], mt], j, tag) for j in range(p) if j != me]
    reqs += [diag.Isend([send, mt], (me + d) % p, tag) for d in range(1, p)]
    flat[me * n:(me + 1) * n] = send
    return Exchange(reqs)


def fast(g: Any, tensor_list: Any, tensor: Any, arr: np.ndarray, async_op: bool) -> Any:
    """A list-form all_gather this path takes, without the general path's checks and staging
    (about 15 µs of a 512 KiB call on 2 ranks) where they are known to pass: a contiguous
    NumPy input of a dtype MPI moves as is, entries that are contiguous writable NumPy
    arrays (or Tensors holding them) of its dtype and shape, a member, debug off. Its messages
    are the general path's. :data:`PASS` otherwise."""
    if g.rank_ < 0 or g.slow or not arr.flags.c_contiguous:
        return PASS
    mt = B.MOVE_TYPES.get(arr.dtype)
    outs = None if mt is None else g._fast_entries(tensor_list, arr)
    if outs is None:
        return PASS
    s = g._fast_count("all_gather", arr)
    chk = (None if arr.nbytes < g.health.check_bytes
           else g._fp_first(s, "all_gather", arr, None, -1, (outs, arr)))
    req = start(g, arr, outs, mt)
    if chk is not None:
        req = _fp.Checked(g.health, req, *chk)
    return g._fast_finish(req, "all_gather", s, list(tensor_list), (outs, arr), async_op)
