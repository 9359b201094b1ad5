"""The planner options of ``save`` and ``load``, under torch's class names.

torch's planners are objects with hooks that build and rewrite the plans; here the plans are
fixed (see ``_planning.py``) and a planner carries the options that change them. An option
whose other value would mean a different plan raises instead of being ignored.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["DefaultSavePlanner", "DefaultLoadPlanner"]


def _only(name: str, value: Any, supported: Any) -> None:
    if value != supported:
        raise NotImplementedError(f"{name}={value!r} is not supported: checkpoints here are "
                                  f"always written with {name}={supported!r}")


class DefaultSavePlanner:
    """Options of a save.

    Args:
        flatten_state_dict: nested dicts become dotted entries (the only layout written).
        flatten_sharded_tensors: accepted for torch's signature (always True here).
        dedup_replicated_tensors: a tensor held whole by several ranks is written once (always
            True here; torch deprecated the switch).
        dedup_save_to_lowest_rank: give each replicated chunk to its lowest holding rank
            instead of the least loaded one.

    Example:
        >>> dcp.save(sd, checkpoint_id=p, planner=DefaultSavePlanner())  # doctest: +SKIP
    """

    def __init__(self, flatten_state_dict: bool = True, flatten_sharded_tensors: bool = True,
                 dedup_replicated_tensors: Optional[bool] = None,
                 dedup_save_to_lowest_rank: bool = False,
                 enable_plan_caching: bool = False) -> None:
        # enable_plan_caching only spares torch re-planning; plans here are cheap to rebuild
        _only("flatten_state_dict", flatten_state_dict, True)
        _only("flatten_sharded_tensors", flatten_sharded_tensors, True)
        if dedup_replicated_tensors is not None:
            _only("dedup_replicated_tensors", dedup_replicated_tensors, True)
        self.dedup_save_to_lowest_rank = bool(dedup_save_to_lowest_rank)


class DefaultLoadPlanner:
    """Options of a load.

    Args:
        flatten_state_dict: nested dicts are matched as dotted entries (always True here).
        flatten_sharded_tensors: accepted for torch's signature (always True here).
        allow_partial_load: entries of the state dict that the checkpoint lacks are left as
            they are, instead of failing the load.

    Example:
        >>> dcp.load(sd, checkpoint_id=p, planner=DefaultLoadPlanner(allow_partial_load=True))
        ... # doctest: +SKIP
    """

    def __init__(self, flatten_state_dict: bool = True, flatten_sharded_tensors: bool = True,
                 allow_partial_load: bool = False) -> None:
        _only("flatten_state_dict", flatten_state_dict, True)
        _only("flatten_sharded_tensors", flatten_sharded_tensors, True)
        self.allow_partial_load = bool(allow_partial_load)
