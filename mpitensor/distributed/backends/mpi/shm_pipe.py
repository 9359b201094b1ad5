"""The shared-memory engine of node-local collectives: one segment per group, a chunk pipeline.

The segment (made once per group by ``shm_coll``) holds a control line per member (the steps
it has finished: data in, share reduced, data out; its process id; the last call it took the
engine for), a row of addresses per member (the direct path's, ``shm_direct``) and, after
them, two *sets* of one slot per member, :data:`CHUNK` bytes each. A collective moves its
buffer through the slots chunk by chunk; chunk ``k`` uses set ``k & 1``, so while the members
reduce chunk ``k`` out of one set a member that is done may already copy chunk ``k + 1`` into
the other.
Every step is numbered for the life of the group (``Engine.step``): a member publishes the
number of the chunk it finished each phase for, and a member waits for its peers' numbers, so
one word per phase and member is all the synchronisation there is.

A chunk goes through up to three phases, each on every member at once:

* **fill**: a member copies what its peers need of its buffer into its own slot (for a
  reduction, every part of the chunk but the one it reduces itself: that part it reads where
  it lies);
* **work**: member ``r`` reduces part ``r`` of the chunk over every member's contribution, in
  rank order (``x0 op x1 op ... op x(p-1)``: the same operations on every member, so the
  result is bitwise the same everywhere and equals that fixed-order reduction), into the part
  of its own slot it left empty, and copies that into its own buffer;
* **drain**: a member copies the parts its peers produced (or, for gathers and broadcasts,
  their data) out of their slots into its buffer.

Before writing into a set a member waits until every member has drained the chunk that last
used it. x86-64 keeps stores in program order, so a step number published after the data is
never seen before the data (the segment is only made there, see ``shm.usable``).

Waits are the watchdog's (:func:`watchdog.wait`): the group's timeout, its fault notices (a
peer that raised, left or broke the group), stall reports; in addition a member that waits
looks now and then whether a peer's process is still alive (its id is in its control line),
so a peer killed mid-collective ends every wait with :class:`PeerFailedError` instead of the
timeout.
"""

from __future__ import annotations

import mmap
import os
import time
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from ....errors import CollectiveMismatchError
from ...health import faults as _faults
from ...health import watchdog as W

DEFAULT_CHUNK = 1 << 20
CHUNK = DEFAULT_CHUNK  # bytes per member and set (a test may make it smaller: shm_coll.set_chunk)
_LINE = 8  # int64 words per member's control line (a cache line)
IN, RED, OUT, PID, CALL = 0, 1, 2, 3, 4  # CALL: the last call (seq) it took the engine for
# the direct path's writes into peers' buffers (shm_direct._write, _tiny.put): the step of
# a write in progress (BUSY), of a direct call this member left early (CLOSED), of an
# all_reduce this member makes in place (PUTS: its peers may write its result into it)
BUSY, CLOSED, PUTS = 5, 6, 7
_ALIVE_EVERY_S = 9e-4  # a wait looks at its peers' processes this often: before each of the
# watchdog's ticks (1 ms), whose MPI calls may end the whole job once a peer process is gone
_perf = time.perf_counter


def control_bytes(size: int) -> int:
    """Bytes before the slots: one control line per member, then a row of ``size`` addresses
    per member (the direct reads', see ``shm_direct``), rounded to a page."""
    return -(-(size * (_LINE + size) * 8) // 4096) * 4096


def segment_bytes(size: int, chunk: int) -> int:
    return control_bytes(size) + 2 * size * chunk


def bounds(n: int, parts: int) -> List[int]:
    """Where ``n`` elements split into ``parts`` near-equal parts (the first ``n % parts`` one
    longer): ``parts + 1`` offsets, the same on every member."""
    q, r = divmod(n, parts)
    return [i * q + min(i, r) for i in range(parts + 1)]


def _nothing() -> None:
    return None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped by its parent, does
    not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:  # no /proc here: ask the kernel whether the id is taken
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:  # another user's process (EPERM): it exists
            pass
        return True
    return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] not in (b"Z", b"X")


class _Steps:
    """A wait for every member in ``ranks`` to have published step ``t`` (or later) in word
    ``w``, as an MPI request (``Test``); it looks whether the members are alive now and then."""

    __slots__ = ("eng", "w", "t", "ranks", "look")
    moves_data = False  # its Test reads flags (and peers' /proc): watchdog's Backoff

    def __init__(self, eng: "Engine", w: int, t: int, ranks: Sequence[int]) -> None:
        self.eng, self.w, self.t, self.ranks = eng, w, t, ranks
        self.look = _perf() + _ALIVE_EVERY_S

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI's request protocol
        q, w, t = self.eng.q, self.w, self.t
        for r in self.ranks:
            if q[r * _LINE + w] < t:
                now = _perf()
                if now >= self.look:
                    self.look = now + _ALIVE_EVERY_S
                    for late in self.ranks:  # every member not there yet
                        if q[late * _LINE + w] < t:
                            self.eng.check_alive(late)
                return False
        return True

    def before_check(self) -> None:
        """Called by the watchdog before each round of its checks, whose MPI calls may end
        the whole job once a peer's process is gone: every member not there yet is looked at
        now, whatever the time since the last look."""
        q, w, t = self.eng.q, self.w, self.t
        self.look = _perf() + _ALIVE_EVERY_S
        for late in self.ranks:
            if q[late * _LINE + w] < t:
                self.eng.check_alive(late)
                self.eng.check_entered(late)


class Engine:
    """One group's segment and its pipeline (see the module docstring)."""

    def __init__(self, g: Any, mm: mmap.mmap, chunk: int) -> None:
        self.g, self.h, self.mm, self.chunk = g, g.health, mm, chunk
        self.p, self.me = g.size_, g.rank_
        self.q = memoryview(mm).cast("q")
        self.everyone = tuple(range(self.p))
        base = control_bytes(self.p)
        raw = np.frombuffer(mm, np.uint8)
        self.slots = [[raw[base + (s * self.p + r) * chunk:base + (s * self.p + r + 1) * chunk]
                       for r in range(self.p)] for s in (0, 1)]
        self.step = 0
        self.op, self.seq = "collective", 0  # the call in progress, for the waits' reports
        self.q[self.me * _LINE + PID] = os.getpid()
        self.thresholds: dict = {}  # kind -> bytes from which the engine pays (shm_coll)
        self.calibration: Any = None  # its measured engine / MPI ratios (shm_coll), if any
        self.calibration_large: dict = {}  # and at shm_coll._CAL_LARGE, per kind, if timed
        # a direct call's step once every member arrived (shm_coll: the agreement check)
        self.enter: Callable[[], None] = _nothing
        # the direct path (shm_direct): each member's row of addresses its peers read from,
        # whether every pair of members may read (and write) each other's memory (agreed at
        # setup), the peers' process ids, and one scratch piece per member for the
        # reductions' reads
        table = np.frombuffer(mm, np.int64, self.p * self.p, self.p * _LINE * 8)
        self.addr = table.reshape(self.p, self.p)
        self.cma = False
        self.puts = False  # and write into them (shm_direct._write)
        self.reader: Any = None
        self.pids: List[int] = []
        self.scratch: List[np.ndarray] = []

    def close(self) -> None:
        q, self.q = self.q, None
        self.slots = []
        self.addr = None
        if q is not None:
            q.release()
            self.mm.close()

    # ------------------------------------------------------------------ synchronisation
    def publish(self, w: int, t: int) -> None:
        self.q[self.me * _LINE + w] = t

    def wait(self, w: int, t: int, ranks: Sequence[int]) -> None:
        q = self.q
        for r in ranks:
            if q[r * _LINE + w] < t:
                W.wait(self.h, _Steps(self, w, t, ranks), self.op, self.seq)
                return

    def arrive(self, row: Sequence[int]) -> int:
        """Begin a direct call: publish this member's ``row`` of addresses (the one its member
        ``k`` reads is ``row[k]``) and that it takes the engine for the call, wait until every
        member has, then run ``enter`` (the agreement check); the call's step number."""
        t = self.step = self.step + 1
        self.addr[self.me] = row
        self.publish(CALL, self.seq)
        self.sync(IN, t)
        self.enter()
        return t

    def sync(self, w: int, t: int) -> None:
        """Publish step ``t`` in word ``w`` and wait for every member to have."""
        self.publish(w, t)
        self.wait(w, t, self.everyone)

    def check_entered(self, r: int) -> None:
        """Raise CollectiveMismatchError (and break the group) if member ``r``, which has not
        taken the engine for this call, waits in it on MPI's path (the watchdog's arrival
        notices say so): its size lies on the other side of the engine's threshold."""
        h, s = self.h, self.seq
        seen = h.notices.get(r)
        if seen is None or not seen[1] or seen[0][:2] != ("coll", s) \
                or self.q[r * _LINE + CALL] >= s:
            return
        reason = (f"ranks disagree on the size of this call: rank {h.ranks[r]} took MPI's "
                  f"path for it ({seen[0][2]}), this rank the shared-memory engine's (the "
                  "engine takes a call from a size on: their sizes differ)")
        _faults.mark_broken(h, _faults.Story(h.global_rank, self.op, s, reason))
        raise CollectiveMismatchError(
            f"rank {h.global_rank}: {self.op} (#{s} on {h.name}): {reason}. Every rank must "
            "make the same collective calls in the same order with the same dtype, shape, op "
            f"and root, so every later call on {h.name} raises. Run with MPITENSOR_DEBUG=1 to "
            "see each rank's arguments.")

    def check_alive(self, r: int, gone: bool = False) -> None:
        """Raise PeerFailedError (and break the group) if member ``r``'s process is gone
        (``gone``: the caller knows it is, the kernel refused a read of its memory for it)."""
        pid = self.q[r * _LINE + PID]
        if not gone and (pid <= 0 or _alive(pid)):
            return
        h = self.h
        story = _faults.Story(h.ranks[r], self.op, self.seq,
                              f"its process (pid {pid}) ended while this rank waited for it "
                              "in a collective through shared memory")
        # every member waiting finds it so itself: no notice (MPI may end the job when a
        # message goes to a process that is gone)
        _faults.mark_broken(h, story, tell=False)
        raise _faults.error(h, story, self.op, self.seq, waiting=True)

    # ------------------------------------------------------------------ the pipeline
    def run(self, chunks: int, fill: Optional[Callable[[int, int], None]],
            work: Optional[Callable[[int, int], None]],
            drain: Optional[Callable[[int, int], None]],
            fillers: Sequence[int]) -> None:
        """Move ``chunks`` chunks through the slots: ``fill(k, set)``, ``work(k, set)`` and
        ``drain(k, set)`` are this member's part of each phase of chunk ``k`` (None: it has
        none); ``fillers`` are the members whose fill the others wait for."""
        if chunks <= 0:
            return
        everyone = self.everyone
        t0 = self.step
        self.step = t0 + chunks
        self.wait(OUT, t0 - 1, everyone)  # the set of chunk t0 + 1 was drained by everyone
        if fill is not None:
            fill(0, (t0 + 1) & 1)
        self.publish(IN, t0 + 1)
        for k in range(chunks):
            t = t0 + 1 + k
            st = t & 1
            if work is not None:
                self.wait(IN, t, fillers)
                work(k, st)
                self.publish(RED, t)
            if k + 1 < chunks:
                self.wait(OUT, t - 1, everyone)
                if fill is not None:
                    fill(k + 1, st ^ 1)
                self.publish(IN, t + 1)
            if drain is not None:
                if work is not None:
                    self.wait(RED, t, everyone)
                else:
                    self.wait(IN, t, fillers)
                drain(k, st)
            self.publish(OUT, t)

    def typed(self, st: int, r: int, dtype: np.dtype, start: int, stop: int) -> np.ndarray:
        """Member ``r``'s slot of set ``st`` as ``dtype`` elements ``[start, stop)``."""
        i = dtype.itemsize
        return self.slots[st][r][start * i:stop * i].view(dtype)


class Reducer:
    """Reduces equal-length pieces in rank order with one op (see ``shm_coll.kernel``):
    ``into(out, sources)`` writes ``s0 op s1 op ... op s(p-1)`` into ``out``."""

    __slots__ = ("ufunc", "wide", "divide", "view")

    def __init__(self, ufunc: Any, wide: Optional[np.dtype], divide: int,
                 view: Optional[np.dtype]) -> None:
        self.ufunc, self.wide, self.divide, self.view = ufunc, wide, divide, view

    def into(self, out: np.ndarray, sources: List[np.ndarray]) -> None:
        if self.view is not None:
            out = out.view(self.view)
            sources = [s.view(self.view) for s in sources]
        f = self.ufunc
        if self.wide is None:
            f(sources[0], sources[1], out=out)
            for s in sources[2:]:
                f(out, s, out=out)
            if self.divide:
                np.divide(out, self.divide, out=out)
            return
        acc = sources[0].astype(self.wide)
        tmp = np.empty_like(acc)
        for s in sources[1:]:
            np.copyto(tmp, s, casting="unsafe")
            f(acc, tmp, out=acc)
        if self.divide:
            np.divide(acc, self.divide, out=acc)
        np.copyto(out, acc, casting="unsafe")

