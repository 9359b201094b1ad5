"""Which gathers and reduce-scatters a small group's board leaves to messages: timed as the
group is made (issue 29).

The board (``shm_tiny.py``) moves a call's bytes twice: each member copies what it posts into
its entry, and each copies what it reads out of its peers' entries. The messages of
``gather_p2p.py`` and ``scatter_p2p.py`` leave the moving to MPI, and an MPI that moves a large
message in one copy, read straight from the sender's memory (cross-memory attach: MPICH over
UCX does), moves those bytes once. Which wins is the machine's. On one 2-core machine
(2026-11-30) the board took 0.62-0.82x raw MPI's time at 512 KiB where the messages took
0.85-1.03x; on another (2026-12-01, 2 ranks, back to back, µs) the messages won from 128 KiB:

| call | board | messages | raw MPI's collective |
|---|---|---|---|
| all_gather into 256 KiB | 24.0 | 15.5 | 19.4 |
| all_gather into 512 KiB | 42.0 | 29.9 | 37.5 |
| reduce_scatter of 512 KiB | 48.6 | 28.0 | 39.9 |

and an all_gather into 1 MiB took 57-65 µs as messages against 86-89 as MPI's ``Iallgather``.
So the group times them (:func:`choose`), where its ranks have cores of their own and its
board's entries hold :data:`PROBES`' calls: at each probe size, all-gathers and float32
reduce-scatters on a board over the new segment (``_tiny.Board.time_calls``, before the
group's own board is laid on it) against the same calls as messages (with the bounded wait
every call has), and an all-gather into :data:`BEYOND` as messages against MPI's
``Iallgather``, in pairs whose order alternates; the slowest member's medians decide, the same
on every member. A kind leaves to messages the sizes from the smallest probe from which they
win at every probe (by :data:`MARGIN`); its board keeps the sizes below. Groups of the same
ranks ask the first one's answer (:data:`_known`) instead of timing again.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np
from mpi4py import MPI

from ...health import watchdog as W
from . import gather_p2p as _gp2p
from . import scatter_p2p as _sp2p

try:
    from . import _tiny  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: no board, nothing to time
    _tiny = None

#: the sizes (bytes: an all_gather's output, a reduce_scatter's input) timed both ways, the
#: smallest first; those past the board's entries are left out. Not 128 KiB: there the
#: messages won back to back (12.7 against 14.5 µs, all_gather, 2 ranks, 2026-12-01) and lost
#: on inputs written before each call (16.7 against 14.5), as a program's are; from 256 KiB
#: they won both ways. The board keeps at least half the smallest
PROBES = (256 << 10, 512 << 10)
#: ... and the all-gather timed as messages against MPI's own gather (past the board)
BEYOND = 1 << 20
#: messages take a size where their time is at most this fraction of the other path's
MARGIN = 0.9
ROUNDS, REPS = 4, 5  # calls a timing, timings a side
LIMIT_S = 0.5  # a board timing that takes longer (a member that is not there) ends
#: forced answers for tests: None (timed), "board" or "messages" (every probe's winner)
force: Optional[str] = None
#: (global ranks of a group, its probes) -> its answer (:func:`choose`)
_known: dict = {}
#: global ranks of a group -> the seconds its timing found, the slowest member's (for
#: reports): ``(t[kind][probe][board, messages], (MPI's gather, messages) at BEYOND)``, each
#: for :data:`ROUNDS` calls
times: dict = {}


def applies(g: Any, entry: int, crowded: bool) -> bool:
    """Whether a new group with a board of ``entry``-byte entries times the choice (the same
    on every member)."""
    return (not crowded and 2 <= g.size_ <= min(_gp2p.MOST, _sp2p.MOST)
            and entry >= PROBES[0] and g.one_node is True)


def choose(g: Any, mm: Any, entry: int, gather: int, part: int,
           board: tuple) -> "tuple[int, int, tuple]":
    """Collective: ``(the board's largest all_gather, its largest reduce_scatter, the
    all-gather sizes that take messages: (lo, hi))`` for new group ``g``, whose segment ``mm``
    (zeros, not yet the board's: left zeroed) has entries of ``entry`` bytes; ``gather`` and
    ``part`` are the board's limits before the choice; ``board``: shm_tiny's kinds of
    all-gather and reduce-scatter and the bytes its board spans (zeroed after the timing)."""
    probes = probe_sizes(g.size_, entry)
    n = len(probes)
    known = np.array(_known.get((g.ranks, n), (-1.0,) * 3), dtype=np.float64)
    g.comm.Allreduce(MPI.IN_PLACE, known, op=MPI.MIN)  # -1: a member has none
    if force is not None:
        wins = np.array([0, 0, 1] if force == "messages" else [n, n, 0], np.float64)
    elif known.min() >= 0:
        wins = known
    else:
        wins = _time(g, mm, probes, board)
        if wins is None:  # (a timing cut short: nothing changes, nothing is kept)
            return gather, part, (0, 0)
        _known[(g.ranks, n)] = tuple(float(w) for w in wins)
    g_lim = _limit(int(wins[0]), probes, gather)
    p_lim = _limit(int(wins[1]), probes, part)
    hi = max(gather, BEYOND) if wins[2] else gather
    return g_lim, p_lim, ((g_lim, hi) if g_lim < hi else (0, 0))


def probe_sizes(size: int, entry: int) -> list:
    """The probe sizes a group of ``size`` members whose board has ``entry``-byte entries
    times: :data:`PROBES` that fit an entry, in whole float32 elements a member."""
    return [s - s % (4 * size) for s in PROBES if s <= entry]


def _limit(first: int, probes: list, most: int) -> int:
    """The board's largest call of a kind whose messages win from probe ``first`` on
    (``len(probes)``: at none of them): half that probe, else ``most`` as it was (never
    more)."""
    return most if first >= len(probes) else min(most, probes[first] // 2)


def _time(g: Any, mm: Any, probes: list, board: tuple) -> Optional[np.ndarray]:
    """Collective: for all_gather and reduce_scatter, the index of the smallest probe from
    which messages win at every larger one (``len(probes)``: none); then 1.0 where an
    all-gather into :data:`BEYOND` as messages wins against MPI's gather, else 0.0. None on
    every member where a board timing did not end (a member not there within LIMIT_S)."""
    gather, part, spans = board
    n = len(probes)
    t = np.zeros((2, n, 2))  # kind, probe, (board, messages): the medians
    c = _tiny.Board(mm, g.rank_, g.size_, 2, -(-max(probes) // 64) * 64)  # (lines a post)
    seq = [1]
    try:
        for i, s in enumerate(probes):
            for k, (kind, post) in enumerate(((gather, s // g.size_), (part, s))):
                msgs = _gather(g, s) if kind == gather else _scatter(g, s)
                t[k, i] = _pair(g, _on_board(c, seq, kind, post), msgs)
    finally:
        c.release()
        g.comm.Barrier()  # (every member is done with it before it is zeroed)
        if g.rank_ == 0:
            np.frombuffer(mm, np.uint8)[:spans] = 0
    beyond = _pair(g, _gather(g, BEYOND, mpi=True), _gather(g, BEYOND))
    flat = np.r_[t.reshape(-1), beyond]
    g.comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.MAX)  # the slowest member's
    g.comm.Barrier()  # (the segment zeroed before anyone lays the board on it)
    if not np.isfinite(flat).all():
        return None
    t = flat[:-2].reshape(2, n, 2)
    times[g.ranks] = (t, flat[-2:])
    wins = t[:, :, 1] <= MARGIN * t[:, :, 0]  # kind, probe
    return np.array([first_win(wins[0]), first_win(wins[1]),
                     float(flat[-1] <= MARGIN * flat[-2])])


def first_win(wins: Any) -> int:
    """The index of the first of ``wins`` (by probe, the smallest first) from which every one
    is true; ``len(wins)`` where the last is false."""
    lost = np.flatnonzero(~np.asarray(wins, bool))
    return int(lost[-1]) + 1 if lost.size else 0


def _pair(g: Any, a: Any, b: Any) -> np.ndarray:
    """Medians of :data:`REPS` timings of each of ``a`` and ``b`` (each ``ROUNDS`` calls, after
    an untimed call and a barrier), the order alternating."""
    t: list = [[], []]
    for r in range(REPS):
        for side in ((0, 1) if r % 2 == 0 else (1, 0)):
            fn = (a, b)[side]
            fn(1)
            g.comm.Barrier()
            t[side].append(fn(ROUNDS))
    return np.array([np.median(t[0]), np.median(t[1])])


def _on_board(c: Any, seq: list, kind: int, post: int) -> Any:
    """``calls`` board calls of ``kind`` (each member posting ``post`` bytes), timed; ``inf``
    once a timing did not end (the board's calls are then out of step: none runs again)."""
    def run(calls: int) -> float:
        if seq[0] < 0:
            return float("inf")
        took = c.time_calls(seq[0], calls, post, 1 << 40, LIMIT_S, kind)
        seq[0] = seq[0] + calls if took >= 0 else -1
        return float("inf") if took < 0 else took
    return run


def _timed(g: Any, start: Any, nbytes: int) -> Any:
    h, label = g.health, "a new group's timing of its calls"

    def run(calls: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            req = start()
            if not req.Test():
                W.wait(h, req, label, g.seq, nbytes=nbytes)
        return time.perf_counter() - t0
    return run


def _gather(g: Any, nbytes: int, mpi: bool = False) -> Any:
    inp = np.ones(nbytes // 4 // g.size_, np.float32)
    out = np.zeros(inp.size * g.size_, np.float32)
    if mpi:
        return _timed(g, lambda: g.comm.Iallgather([inp, MPI.FLOAT], [out, MPI.FLOAT]), nbytes)
    return _timed(g, lambda: _gp2p.start_flat(g, inp, out, MPI.FLOAT), nbytes)


def _scatter(g: Any, nbytes: int) -> Any:
    out = np.zeros(nbytes // 4 // g.size_, np.float32)
    send = np.zeros(out.size * g.size_, np.float32)
    return _timed(g, lambda: _sp2p.start(g, send, out, MPI.FLOAT, MPI.SUM), nbytes)
