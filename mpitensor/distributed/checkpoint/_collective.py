"""The few object collectives a save or load needs, and one process's stand-in for them.

Without an initialised process group, a save or load runs as one process (rank 0 of 1), as
torch's ``dcp`` does; every helper here then answers locally.
"""

from __future__ import annotations

from typing import Any, List, Optional

from mpitensor import distributed as dist


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


def fail(by_rank: List[List[str]], what: str, error: type) -> None:
    """Raise ``error`` listing every rank's problems, if there are any."""
    lines = [f"rank {r}: {p}" if len(by_rank) > 1 else p
             for r, ps in enumerate(by_rank) for p in ps]
    if lines:
        shown = lines[:20] + ([f"... and {len(lines) - 20} more"] if len(lines) > 20 else [])
        raise error(f"{what}:\n  " + "\n  ".join(shown))
