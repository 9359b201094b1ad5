"""The few object collectives a save or load needs, and one process's stand-in for them.

Without an initialised process group, a save or load runs as one process (rank 0 of 1), as
torch's ``dcp`` does; every helper here then answers locally.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, List, Optional

from mpitensor import distributed as dist

# each process group's own communicator for async_save's background agreement, made at the
# first async_save on that group (every member calls it there) and kept for the process
_PRIVATE: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


class Group:
    """Rank, size and object collectives of ``process_group`` (or of this process alone)."""

    def __init__(self, process_group: Any = None, no_dist: bool = False) -> None:
        self.active = not no_dist and dist.is_available() and dist.is_initialized()
        self.group = process_group
        if self.active:
            self.rank = dist.get_rank(process_group)
            self.size = dist.get_world_size(process_group)
        elif process_group is not None and not no_dist:
            raise ValueError("process_group was given but no process group is initialised; "
                             "call init_process_group first, or pass process_group=None")
        else:
            self.rank, self.size = 0, 1

    def all_gather(self, obj: Any) -> List[Any]:
        if not self.active or self.size == 1:
            return [obj]
        out: List[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.active or self.size == 1:
            return obj
        box: List[Optional[Any]] = [obj]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        return box[0]

    def agree(self, problems: List[str], what: str, error: type) -> None:
        """Raise ``error`` on every rank if any rank has problems (all of them, by rank)."""
        fail(self.all_gather(problems), what, error)


class _Private(Group):
    """The same ranks as a :class:`Group`, over a communicator nobody else uses.

    An ``async_save``'s writer thread agrees on the outcome here while the program goes on
    using its own group: the two never meet in one communicator, so neither can take the
    other's messages. The group is not one of the job's (``destroy_process_group`` leaves it),
    so a save still in flight when the program tears its group down still finishes.
    """

    def __init__(self, pg: Any, rank: int, size: int) -> None:
        self.active, self.group, self.rank, self.size = True, pg, rank, size

    def all_gather(self, obj: Any) -> List[Any]:
        return list(self.group.allgather_obj(obj, "async_save"))

    def broadcast(self, obj: Any) -> Any:
        return self.group.bcast_obj(obj, 0, "async_save")


def private(group: Group) -> Group:
    """A :class:`Group` of the same ranks over a communicator of its own (collective the first
    time for a process group: every member must call it); ``group`` itself when it needs no
    communication (one process)."""
    if not group.active or group.size == 1:
        return group
    pg = group.group if group.group is not None else dist.group.WORLD
    dup = _PRIVATE.get(pg)
    if dup is None:
        dup = pg.split(dist.get_process_group_ranks(pg), f"{pg.name}/async_save")
        _PRIVATE[pg] = dup
    return _Private(dup, group.rank, group.size)


def threads_may_communicate() -> bool:
    """Whether a second thread may communicate while the program's thread does: MPI started
    at ``MPI_THREAD_MULTIPLE`` (mpi4py's default), or no MPI at all."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is None or not mpi.Is_initialized() or mpi.Query_thread() >= mpi.THREAD_MULTIPLE


def fail(by_rank: List[List[str]], what: str, error: type) -> None:
    """Raise ``error`` listing every rank's problems, if there are any."""
    lines = [f"rank {r}: {p}" if len(by_rank) > 1 else p
             for r, ps in enumerate(by_rank) for p in ps]
    if lines:
        shown = lines[:20] + ([f"... and {len(lines) - 20} more"] if len(lines) > 20 else [])
        raise error(f"{what}:\n  " + "\n  ".join(shown))
