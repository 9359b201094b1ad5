"""DDP's gradient all-reduce through shared memory, where ranks outnumber their node's cores.

``mpiexec -n 4`` on a 2-core laptop is how people try a program. There, MPI's all-reduce is
costly in a way its latency does not show: MPI moves data only inside the calls of the ranks
taking part, so a waiting rank must keep calling (polling), and every poll takes the core from
a rank that is still computing its gradients, while a rank that sleeps instead holds up the
others once they arrive. Measured on LeNet, 4 ranks on 2 cores: each rank spent 0.5 ms of
every 10 ms step polling, and the step ran at 89 % of its speed without any gradient sync.

Here a rank's part of the reduction is done the moment it arrives: it copies its bucket into
its own slot of a segment every rank on the node maps, then marks the slot with the call's
number. A waiting rank only reads the other ranks' marks, so it can sleep between looks
without holding anyone up; once every mark is there, each rank sums the slots itself, in rank
order, so every replica gets bitwise the same result. Each bucket has two slots per rank,
used by turns: a rank fills a bucket's slot of step s + 2 only after every rank has filled the
one of step s + 1, which each does only after it has read step s. Measured: +11 % samples/s
for 4 LeNet ranks on 2 cores (25.3k against 22.7k through MPI; 28.1k without any sync).

When it is used: by ``DistributedDataParallel`` for its gradient buckets, when every rank of
its group runs on this node, the group has more ranks than the node has cores (the union of
the ranks' CPU affinities), the buckets are float32/float64 NumPy arrays of at most
:data:`MAX_BYTES` (8 MiB) in all, and the machine is x86-64 (whose stores become visible in
program order: a mark is never seen before the data it follows). Every rank agrees before any rank
uses it. ``MPITENSOR_NODE_REDUCE``: ``auto`` (default: as above), ``on`` (also without
oversubscription, on one node: for tests), ``off`` (always MPI).

The segment is a file in ``/dev/shm`` that rank 0 of the node creates, with every page reserved
(where ``/dev/shm`` is too small, MPI is used instead), and removes as soon as every rank has
mapped it: nothing is left behind, whatever way the job ends. Waits go through
:func:`_watchdog.wait`, so the group's timeout, fault notices (a peer that raised or left)
and stall reports work as for any collective.
"""

from __future__ import annotations

import mmap
import os
from typing import Any, List, Optional, Sequence

import numpy as np

from ...._base import config as _config
from . import shm as _shm

ENV = _config.ENV_NODE_REDUCE
# the buckets' bytes, per rank (the segment holds two copies of each, per rank). Every rank
# reads every rank's slots, W x the data per step, against about 2 x for MPI's large-message
# all-reduce: past a few MiB the copies cost more than the polling saved
MAX_BYTES = 8 << 20
_ALIGN = 64
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_PREFIX = "mpitensor-ddp-"


# this node, as init_process_group found it: ranks of the world here, and the CPUs they may
# use together (the union of their affinities)
node_ranks = 1
node_cpus = os.cpu_count() or 1


def note_node(ranks: int, cpus: int) -> None:
    """Record the node's load (called by ``init_process_group``)."""
    global node_ranks, node_cpus
    node_ranks, node_cpus = ranks, cpus


def setting() -> str:
    """``MPITENSOR_NODE_REDUCE`` as ``"auto"``, ``"on"`` or ``"off"`` (ValueError otherwise)."""
    return _config.node_reduce()


def _round(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class NodeReduce:
    """Shared slots for a fixed set of buckets on the ranks of one node (see the module)."""

    def __init__(self, g: Any, mm: mmap.mmap, buffers: Sequence[np.ndarray]) -> None:
        self.group = g
        self.mm = mm
        self.rank, self.size = g.rank_, g.size_
        n = len(buffers)
        offsets, off = [], 0
        for b in buffers:
            offsets.append(off)
            off += _round(b.nbytes)
        flag_bytes = _round(n * 2 * 8)
        per_rank = flag_bytes + 2 * off
        self.flags: List[np.ndarray] = []
        self.slots: List[List[List[np.ndarray]]] = []  # [rank][parity][bucket]
        for r in range(self.size):
            base = r * per_rank
            self.flags.append(np.ndarray((n, 2), np.int64, buffer=mm, offset=base))
            self.slots.append([[np.ndarray(b.shape, b.dtype, buffer=mm,
                                           offset=base + flag_bytes + p * off + o)
                                for b, o in zip(buffers, offsets)] for p in (0, 1)])
        self.count = [0] * n

    @staticmethod
    def segment_bytes(buffers: Sequence[np.ndarray], size: int) -> int:
        data = sum(_round(b.nbytes) for b in buffers)
        return size * (_round(len(buffers) * 2 * 8) + 2 * data)

    @classmethod
    def create(cls, g: Any, buffers: Sequence[Any]) -> Optional["NodeReduce"]:
        """Collective over ``g``'s members: a NodeReduce for ``buffers``, or None (on every
        rank alike) where it does not apply (see the module docstring).

        Whether the ranks share a node is found by trying: rank 0 makes the segment and the
        others map it by name, which fails on another machine. Only mpitensor's own
        collectives are used (no communicator is made), so a peer that fails meanwhile gives
        its usual error."""
        want = setting()
        ok = (want != "off" and _shm.usable()
              and all(type(b) is np.ndarray and b.dtype in _DTYPES and b.flags.c_contiguous
                      for b in buffers)
              and sum(b.nbytes for b in buffers) <= MAX_BYTES
              and (want == "on" or node_ranks > node_cpus))
        if not _all(g, ok):
            return None
        size = cls.segment_bytes(buffers, g.size_)
        path = _shm.create(_PREFIX, size) if g.rank_ == 0 else None
        # the name, as 32 hex digits (all zero: rank 0 could not make it), passed on by a MAX
        # all-reduce of rank 0's digits and the others' zeros
        from ...process_group import ReduceOp

        name = np.zeros(32, np.uint8)
        if path is not None:
            name[:] = np.frombuffer(os.path.basename(path)[-32:].encode(), np.uint8)
        g.all_reduce(name, ReduceOp.MAX)
        theirs = (os.path.join(_shm.DIR, _PREFIX + name.tobytes().decode()) if name.any()
                  else None)
        mm = _shm.map_everywhere(theirs, size, path, lambda mapped: _all(g, mapped))
        if mm is None:
            return None
        return cls(g, mm, buffers)

    def start(self, b: int, buf: np.ndarray) -> Any:
        """Post this rank's bucket ``b`` (a copy into its slot) and return the Work whose
        ``wait()`` sums every rank's into ``buf``."""
        from ...process_group import Work

        s = self.count[b] = self.count[b] + 1
        p = s & 1
        np.copyto(self.slots[self.rank][p][b], buf)
        self.flags[self.rank][b, p] = s  # after the data: x86 stores are seen in order
        g = self.group
        seq = g._fast_count("all_reduce", buf)
        return Work(_Arrivals(self, b, s, buf), None, [buf], group=g,
                    describe=lambda: f"rank {g.global_rank}: all_reduce (#{seq} on {g.name}, "
                                     "through shared memory)",
                    info=("all_reduce", seq, "coll", None, None))


def _all(g: Any, flag: bool) -> bool:
    """Whether ``flag`` holds on every member of ``g`` (one small all-reduce)."""
    from ...process_group import ReduceOp

    v = np.array([int(flag)], dtype=np.int64)
    g.all_reduce(v, ReduceOp.MIN)
    return bool(v[0])


class _Arrivals:
    """The request of one posted bucket: complete once every rank has posted it; completing
    sums the slots into the bucket, in rank order."""

    __slots__ = ("node", "b", "s", "buf", "done")
    passive = True  # nothing moves by polling it: its waiter may sleep at once (_watchdog)

    def __init__(self, node: NodeReduce, b: int, s: int, buf: np.ndarray) -> None:
        self.node, self.b, self.s, self.buf, self.done = node, b, s, buf, False

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - MPI's request protocol
        if self.done:
            return True
        node, b, s = self.node, self.b, self.s
        p = s & 1
        for f in node.flags:
            if f[b, p] != s:
                return False
        slots = node.slots
        out = self.buf
        np.copyto(out, slots[0][p][b])
        for r in range(1, node.size):
            np.add(out, slots[r][p][b], out=out)
        self.done = True
        return True
