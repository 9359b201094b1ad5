"""What a group knows of its own health, as one typed object that the group hands down.

Every process group owns one :class:`GroupHealth`. The group's calls write into it (the
history ring, the agreement check's token), and the health code reads and changes it: the
watchdog (``watchdog.py``: deadlines, arrival notices, stall reports), the fault notices
(``faults.py``: a peer failed, left, or broke the group) and the agreement check
(``fingerprint.py``). Those modules take a ``GroupHealth`` and never the group: nothing in
``health/`` calls back up into a group, and a reader of any of them sees, here, every field
they may touch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

HISTORY = 16  # collectives remembered per group (a power of two: indexed by seq & MASK)
MASK = HISTORY - 1


class Story:
    """Why a group is broken: the rank, the call and the error that started it.

    ``kind``: ``"coll"`` (``seq`` is the group's collective number) or ``"p2p"`` (``seq``
    counts that rank's point-to-point calls).
    """

    __slots__ = ("rank", "op", "seq", "reason", "kind")

    def __init__(self, rank: int, op: str, seq: int, reason: str, kind: str = "coll") -> None:
        self.rank, self.op, self.seq, self.reason, self.kind = rank, op, seq, reason, kind

    def as_tuple(self) -> tuple:
        return (self.rank, self.op, self.seq, self.reason, self.kind)

    def call(self, group_name: str) -> str:
        """The call that broke the group, as messages name it: ``all_reduce (#2 on WORLD)``."""
        if self.seq < 0:  # not known (its notice never came)
            return f"{self.op} on {group_name}"
        number = f"p2p #{self.seq}" if self.kind == "p2p" else f"#{self.seq}"
        return f"{self.op} ({number} on {group_name})"


@dataclass(eq=False)
class GroupHealth:
    """One group's health: who its members are, whether it still works, and what its waits,
    fault notices and agreement checks share.

    Identity (fixed when the group is made; ``rank`` becomes -1 when it is destroyed):
    ``name``, ``ranks`` (global ranks in group order), ``rank`` (this process's group rank,
    -1 for a non-member), ``global_rank``, ``timeout`` and ``stall_warn`` (seconds).

    Communicators (MPI groups; ``None`` elsewhere): ``comm`` carries the data (its
    unreceived messages hint at a wrong tag), ``diag`` the notices, debug verdicts and
    fingerprint reductions, ``hdr`` debug-mode p2p headers and split-size exchanges;
    ``tag_base`` is added to every notice tag (the group's incarnation).

    State: ``broken`` (a :class:`Story` once the group is unusable), ``slow`` (every call
    takes the general path, which checks the group first), ``heard`` (asked on every call's
    way in: has a member broken the group? a word of shared memory ``fault_word`` where the
    members share a machine, else a probe), ``faults`` (fault notices read and not yet
    consumed: ``(group rank, message)``), ``notices`` (group rank -> its latest arrival
    notice) and ``notice_reqs`` (the sends of notices still in flight), ``history`` (the
    last :data:`HISTORY` collectives: ``(seq, op, dtype, shape)``, written by the group).

    The agreement check (``fingerprint.py``): ``check_bytes`` (calls of this many bytes and
    more are checked), ``fp_node`` (shared slots on one machine), ``fp_pool`` (persistent
    reductions across machines), ``fp_tok`` (the blocking checked call in progress) and
    ``fp_async`` (call number -> token of an async checked call not yet settled); ``tiny``:
    the small calls' board where the members share a machine (``backends/mpi/shm_tiny.py``;
    the watchdog asks it whether a member made this rank's call there).
    """

    name: str
    ranks: tuple
    rank: int
    global_rank: int
    timeout: float
    stall_warn: float
    check_bytes: int
    comm: Any = None
    diag: Any = None
    hdr: Any = None
    tag_base: int = 0
    broken: Optional[Story] = None
    slow: bool = False
    heard: Optional[Callable[[], Any]] = None
    fault_mm: Any = None
    fault_word: Any = None
    faults: list = field(default_factory=list)
    notices: dict = field(default_factory=dict)
    notice_reqs: list = field(default_factory=list)
    history: list = field(default_factory=lambda: [None] * HISTORY)
    fp_node: Any = None
    fp_pool: Any = None
    fp_tok: Optional[tuple] = None
    fp_async: dict = field(default_factory=dict)
    tiny: Any = None

    @property
    def size(self) -> int:
        """Number of members."""
        return len(self.ranks)

    @property
    def last_seq(self) -> int:
        """The number of the last collective the group counted (0 before the first): every
        counted call is written to :attr:`history`."""
        return max((e[0] for e in self.history if e is not None), default=0)
