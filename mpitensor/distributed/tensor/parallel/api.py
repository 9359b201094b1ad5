"""``parallelize_module``: apply tensor-parallel styles to a module and its sub-modules."""

from __future__ import annotations

import fnmatch
from typing import Any, Dict, List, Optional, Union

from .style import ParallelStyle

__all__ = ["parallelize_module"]


def _matches(module: Any, pattern: str) -> List[Any]:
    """The sub-modules whose dotted name matches ``pattern`` segment by segment (``*``,
    ``?`` and ``[...]`` as in fnmatch)."""
    want = pattern.split(".")
    return [m for name, m in module.named_modules()
            if name and len(name.split(".")) == len(want)
            and all(fnmatch.fnmatchcase(a, b) for a, b in zip(name.split("."), want))]


def parallelize_module(module: Any, device_mesh: Any = None,
                       parallelize_plan: Union[ParallelStyle, Dict[str, ParallelStyle],
                                               None] = None,
                       *, src_data_rank: Optional[int] = 0) -> Any:
    """Shard ``module`` over the 1-D ``device_mesh`` as ``parallelize_plan`` says.

    Args:
        module: the module to change in place (also returned).
        device_mesh: a 1-D mesh (the tensor-parallel dim of a larger one, ``mesh["tp"]``).
        parallelize_plan: one :class:`ParallelStyle` for ``module`` itself, or a dict from
            sub-module names (dotted, with ``*`` wildcards per segment) to styles.
        src_data_rank: the rank whose parameter values are scattered (None: each rank keeps
            its own values and takes its piece of them).

    Raises:
        ValueError: a plan key that names no sub-module, or no mesh.
        TypeError: a style applied to a module type it does not handle, naming both.
    """
    if device_mesh is None:
        raise ValueError("parallelize_module needs a device_mesh (e.g. init_device_mesh('cpu',"
                         " (world_size,)))")
    if parallelize_plan is None:
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        parallelize_plan.src_data_rank = src_data_rank
        return parallelize_plan._apply(module, device_mesh)
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"parallelize_plan must be a ParallelStyle or a dict of them, got "
                        f"{type(parallelize_plan).__name__}")
    for key, style in parallelize_plan.items():
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"parallelize_plan[{key!r}] is {type(style).__name__}, not a "
                            "ParallelStyle")
        found = _matches(module, key)
        if not found:
            raise ValueError(f"parallelize_plan names {key!r}, which matches no sub-module of "
                             f"{type(module).__name__}")
        for sub in found:
            try:
                parallelize_module(sub, device_mesh, style, src_data_rank=src_data_rank)
            except TypeError as e:
                raise TypeError(f"parallelize_plan[{key!r}]: {e}") from None
    return module
