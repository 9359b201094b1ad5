"""One check shared by the sharding wrappers: every rank describes the same parameters."""

from __future__ import annotations

from typing import Any, List


def check_same_everywhere(mine: List[Any], group: Any, who: str, what: str = "parameter") -> None:
    """Raise ``ValueError`` on every rank where the ranks' lists ``mine`` differ.

    Args:
        mine: this rank's description, one picklable entry per item (e.g. ``(shape, dtype)``).
        group: the process group to compare over (one ``all_gather_object``).
        who: the caller's name, for the message.
        what: what one entry describes, for the message.
    """
    import mpitensor.distributed as dist

    everyone: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    bad = [r for r, theirs in enumerate(everyone) if theirs != mine]
    if not bad:
        return
    theirs = everyone[bad[0]]
    # global ranks: on a sub-group (a mesh's "dp" line) its own numbering would mislead
    r, me = dist.get_global_rank(group, bad[0]), dist.get_rank()
    k = next((k for k, (a, b) in enumerate(zip(theirs, mine)) if a != b), None)
    detail = (f"{len(theirs)} {what}s on rank {r}, {len(mine)} on rank {me}" if k is None
              else f"{what} {k} is {theirs[k]} on rank {r} and {mine[k]} on rank {me}")
    raise ValueError(f"{who}: the {what}s differ across ranks ({detail}); build the same model "
                     f"on every rank, in the same order")
