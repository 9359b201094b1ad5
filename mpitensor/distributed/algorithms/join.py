"""Training on uneven inputs across ranks: the :class:`Join` context manager and the
:class:`Joinable` / :class:`JoinHook` protocol (``torch.distributed.algorithms.join``).

A *joinable* (a class whose per-iteration collectives must be matched) calls
:meth:`Join.notify_join_context` once per iteration; a rank that runs out of inputs leaves the
``with Join(...)`` block and, in ``__exit__``, *shadows* the ranks still training: each round
it counts the ranks still active (a sum of their notifications) and, while any is, runs every
joinable's :meth:`JoinHook.main_hook` (the collectives of one iteration, on dummy data). When
all have joined, :meth:`JoinHook.post_hook` runs once with whether this rank joined last.
"""

from __future__ import annotations

import abc
import warnings
from types import TracebackType
from typing import Any, List, NamedTuple, Optional, Type

import numpy as np

__all__ = ["Join", "JoinHook", "Joinable"]

#: rounds of shadowing after which a warning notes the skew between ranks
_SKEW_WARNING = 1000


class JoinHook:
    """What a joined rank runs for one joinable: override either hook (both do nothing)."""

    def main_hook(self) -> None:
        """Shadow one iteration of the ranks still training (their collectives)."""

    def post_hook(self, is_last_joiner: bool) -> None:
        """Run once after every rank joined (e.g. broadcast the last joiner's final state)."""


class _JoinConfig(NamedTuple):
    enable: bool
    throw_on_early_termination: bool
    is_first_joinable: bool


_DISABLED = _JoinConfig(False, False, False)


class Joinable(abc.ABC):
    """Base of the classes :class:`Join` manages. Subclasses call ``super().__init__()`` and
    define :meth:`join_hook`, :attr:`join_device` and :attr:`join_process_group`."""

    @abc.abstractmethod
    def __init__(self) -> None:
        super().__init__()
        self._join_config = _DISABLED

    @abc.abstractmethod
    def join_hook(self, **kwargs: Any) -> JoinHook:
        """The :class:`JoinHook` of this joinable (``kwargs``: those given to :class:`Join`)."""

    @property
    @abc.abstractmethod
    def join_device(self) -> Any:
        """The device of the join's counting collectives."""

    @property
    @abc.abstractmethod
    def join_process_group(self) -> Any:
        """The process group the joinable's collectives run on."""


class Join:
    """Context manager that lets ranks with fewer inputs finish early (see the module doc).

    Args:
        joinables: the :class:`Joinable` objects of the loop (the same on every rank, in the
            same order, on one process group).
        enable: ``False`` turns the context into a plain block.
        throw_on_early_termination: raise ``RuntimeError`` on every rank as soon as one
            rank runs out of inputs, instead of shadowing.
        **kwargs: passed to every ``join_hook``.

    Raises:
        ValueError: no joinable, or joinables on different process groups.
    """

    def __init__(self, joinables: List[Joinable], enable: bool = True,
                 throw_on_early_termination: bool = False, **kwargs: Any) -> None:
        if len(joinables) == 0:
            raise ValueError("Join: give at least one Joinable")
        for j in joinables:
            if not isinstance(j, Joinable):
                raise TypeError(f"Join: {j!r} is not a Joinable")
        self._joinables = list(joinables)
        self._join_hooks = [j.join_hook(**kwargs) for j in self._joinables]
        self._enable = bool(enable)
        self._throw_on_early_termination = bool(throw_on_early_termination)
        for k, j in enumerate(self._joinables):
            j._join_config = _JoinConfig(self._enable, self._throw_on_early_termination,
                                         k == 0)
        groups = {id(j.join_process_group): j.join_process_group for j in self._joinables}
        if len(groups) > 1:
            raise ValueError("Join: the joinables use different process groups; one Join "
                             "context takes joinables of a single group")
        from .. import get_rank

        self._process_group = self._joinables[0].join_process_group
        self._device = self._joinables[0].join_device
        self._rank = get_rank(self._process_group)

    def __enter__(self) -> "Join":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if not self._enable or exc_type is not None:
            return  # an exception propagates as it is
        last = True
        rounds = 0
        while True:
            if rounds == _SKEW_WARNING + 1:
                warnings.warn(f"Join: rank {self._rank} has at least {_SKEW_WARNING} fewer "
                              "inputs than the ranks still training; such skew costs time",
                              stacklevel=2)
            if self._count(0.0) == 0:
                break
            if self._throw_on_early_termination:
                self._count(1.0)  # tell the active ranks, which check every iteration
                raise RuntimeError(f"Join: rank {self._rank} ran out of inputs "
                                   "(throw_on_early_termination=True)")
            for hook in self._join_hooks:
                hook.main_hook()
            last = False
            rounds += 1
        for hook in self._join_hooks:
            hook.post_hook(last)

    def _count(self, mine: float) -> float:
        return _sum_one(mine, self._process_group, self._device, False)

    @staticmethod
    def notify_join_context(joinable: Joinable) -> Any:
        """Called by a joinable once per iteration, before its collectives: matches the joined
        ranks' count. Only the first joinable of a :class:`Join` communicates; returns its
        asynchronous work (``None`` for the others, or outside an enabled join).

        Raises:
            RuntimeError: ``throw_on_early_termination`` is set and a rank ran out of inputs.
        """
        config = getattr(joinable, "_join_config", None)
        if config is None:
            raise RuntimeError(f"{type(joinable).__name__} does not call Joinable.__init__ "
                               "from its constructor")
        if not (config.enable and config.is_first_joinable):
            return None
        group, device = joinable.join_process_group, joinable.join_device
        earlier = getattr(joinable, "_join_work", None)
        if earlier is not None:
            earlier.wait()
        work = _sum_one(1.0, group, device, True)
        # held until the next call: the sum writes into its buffer until it completes, even
        # where the caller drops the work
        joinable._join_work = work
        if config.throw_on_early_termination and _sum_one(0.0, group, device, False) > 0:
            raise RuntimeError("Join: a rank ran out of inputs; every rank stops "
                               "(throw_on_early_termination=True)")
        return work


def _sum_one(value: float, group: Any, device: Any, async_op: bool) -> Any:
    """Sum one number over ``group`` (on ``device``); the total, or the work when async."""
    from ..._ops.create import tensor
    from .. import all_reduce

    t = tensor(np.array([value], dtype=np.float32), device=device)
    work = all_reduce(t, group=group, async_op=async_op)
    return work if async_op else float(t._data[0])
