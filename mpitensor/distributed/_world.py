"""The one piece of global state: the default group and the groups made from it.

``Backend`` names, the state itself, ``dist.group.WORLD`` and ``_pg``, which every public
function uses to find the group it was given (or the default one).
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

from .._base import config as _config
from ..errors import (
    NotInitializedError,
)
from .process_group import ProcessGroup


class Backend(str):
    """Backend names accepted by :func:`init_process_group`: ``"mpi"``, ``"nccl"``, ``"gloo"``.

    ``"gloo"`` is an alias of the CPU MPI path, so programs written for gloo run unchanged.
    """

    MPI = "mpi"
    NCCL = "nccl"
    GLOO = "gloo"
    UNDEFINED = "undefined"

    def __new__(cls, name: str) -> "Backend":
        if not isinstance(name, str):
            raise TypeError(f"backend must be a string such as 'mpi', got {name!r}")
        return str.__new__(cls, name.lower())


class _State:
    """The default process group and the groups made from it (the one piece of global state)."""

    def __init__(self) -> None:
        self.world: Optional[ProcessGroup] = None
        self.groups: "weakref.WeakSet[ProcessGroup]" = weakref.WeakSet()
        self.debug: bool = _config.DEBUG
        self.gloo_notice_given = False
        self.group_count = 0
        self.installed_abort_handler = False


_state = _State()


class _GroupNamespace:
    """``dist.group.WORLD``: the default group, as in torch."""

    @property
    def WORLD(self) -> Optional[ProcessGroup]:  # noqa: N802 - torch's name
        return _state.world


group = _GroupNamespace()


def _default() -> ProcessGroup:
    world = _state.world
    if world is None:
        raise NotInitializedError(
            "the default process group has not been initialized: call "
            "mpitensor.distributed.init_process_group() first (under `mpiexec -n N python ...`, "
            "or plain `python` for a single rank)")
    return world


def _pg(group: Optional[ProcessGroup]) -> ProcessGroup:
    if group is None:
        world = _state.world
        if world is None:
            _default()
        return world
    if _state.world is None:
        _default()
    if isinstance(group, ProcessGroup):
        return group
    raise TypeError(f"group must be a process group from new_group() or None, got {group!r}")


def _timeout_seconds(timeout: Any) -> float:
    if timeout is None:
        return _config.DEFAULT_TIMEOUT_S
    if hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or a timedelta "
                         f"(float('inf') for no bound), got {timeout!r}")
    return float(timeout)


def get_backend(group: Optional[ProcessGroup] = None) -> str:
    """Return the backend name of ``group`` (default group when None): ``"mpi"`` or ``"nccl"``."""
    return _pg(group).backend_label


def get_rank(group: Optional[ProcessGroup] = None) -> int:
    """Return this process's rank in ``group`` (-1 when it is not a member, as in torch)."""
    return _pg(group).rank_


def get_world_size(group: Optional[ProcessGroup] = None) -> int:
    """Return the number of ranks in ``group`` (-1 when this process is not a member)."""
    pg = _pg(group)
    return pg.size_ if pg.rank_ >= 0 else -1
