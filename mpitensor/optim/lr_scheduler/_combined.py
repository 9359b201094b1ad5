"""Schedules made of schedules: ``SequentialLR`` hands over at milestones, ``ChainedScheduler``
applies several at every step.
"""

from __future__ import annotations

import bisect
from typing import Any, Dict, List, Optional, Sequence

from ..optimizer import Optimizer
from ._base import LRScheduler, _check_optimizer
from ._plateau import ReduceLROnPlateau


def _check_parts(owner: str, schedulers: Any, optimizer: Optimizer) -> List[LRScheduler]:
    parts = list(schedulers)
    if not parts:
        raise ValueError(f"{owner} expects at least one scheduler")
    for i, s in enumerate(parts):
        if not hasattr(s, "optimizer"):
            raise TypeError(f"{owner}: schedulers[{i}] is a {type(s).__name__}, not a "
                            f"learning-rate scheduler")
        if isinstance(s, ReduceLROnPlateau):
            raise ValueError(f"{owner}: schedulers[{i}] is a ReduceLROnPlateau, which steps on "
                             f"a metric and cannot be combined; step it on its own")
        if s.optimizer is not optimizer:
            raise ValueError(f"{owner}: schedulers[{i}] drives a different optimizer than the "
                             f"others; every scheduler must be built on the same optimizer")
    return parts


def _undo_step(scheduler: Any) -> None:
    """Take back one step of every schedule inside ``scheduler`` (the parts of nested
    SequentialLR/ChainedScheduler included; a composite has no epoch of its own to undo)."""
    parts = getattr(scheduler, "_schedulers", None)
    if parts is not None:
        for part in parts:
            _undo_step(part)
    elif hasattr(scheduler, "last_epoch"):
        scheduler.last_epoch -= 1


class SequentialLR(LRScheduler):
    """Run one schedule after another, handing over at the milestone epochs.

    ``schedulers[i]`` drives the rates from ``milestones[i - 1]`` on; at a milestone the next
    schedule starts from its epoch 0 (its closed form at 0). Creating it resets the groups to
    their initial rates and takes the first schedule's first step.

    Args:
        optimizer: the optimiser every schedule drives.
        schedulers: the schedules, in order.
        milestones: the epochs at which the next schedule takes over (one fewer than
            ``schedulers``).
        last_epoch: the last epoch index when resuming (default -1).

    Raises:
        ValueError: no schedulers, a ReduceLROnPlateau among them, one built on another
            optimiser, or the wrong number of milestones.
        TypeError: an entry is not a scheduler.

    Example:
        >>> import mpitensor as mt
        >>> opt = mt.optim.SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
        >>> warm = ConstantLR(opt, factor=0.1, total_iters=2)
        >>> decay = ExponentialLR(opt, gamma=0.5)
        >>> s = SequentialLR(opt, [warm, decay], milestones=[2])
        >>> [round((s.step(), s.get_last_lr()[0])[1], 6) for _ in range(4)]
        [0.1, 1.0, 0.5, 0.25]
    """

    def __init__(self, optimizer: Optimizer, schedulers: List[LRScheduler],
                 milestones: List[int], last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        parts = _check_parts("SequentialLR", schedulers, optimizer)
        if len(milestones) != len(parts) - 1:
            raise ValueError(f"SequentialLR: {len(parts)} schedulers need {len(parts) - 1} "
                             f"milestones, got {len(milestones)}")
        self._schedulers = parts
        self._milestones = list(milestones)
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in optimizer.param_groups:  # the parts' constructors already moved them
            group["lr"] = group["initial_lr"]
        _undo_step(self)  # and stepped once each: take those steps back
        parts[0]._initial_step()
        self._last_lr = parts[0].get_last_lr()

    def step(self) -> None:  # type: ignore[override]
        """Advance one epoch with the schedule in charge (a new one starts at its epoch 0)."""
        self.last_epoch += 1
        i = bisect.bisect_right(self._milestones, self.last_epoch)
        part = self._schedulers[i]
        if i > 0 and self._milestones[i - 1] == self.last_epoch:
            # the part starts afresh: its epoch 0 (closed form), counted as its first step
            part._step_count = 0
            part.step(0)
        else:
            part.step()
        self._last_lr = part.get_last_lr()

    def state_dict(self) -> Dict[str, Any]:
        """Return the state, with each part's state dict under ``"_schedulers"`` (torch's
        layout)."""
        state = {k: v for k, v in vars(self).items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    _restored_apart = ("_schedulers",)

    def _restore_apart(self, state_dict: Dict[str, Any]) -> None:
        """Every part restores its own state."""
        for s, saved in zip(self._schedulers, state_dict.get("_schedulers", [])):
            s.load_state_dict(saved)


class ChainedScheduler(LRScheduler):
    """Step several schedules together: each :meth:`step` steps every one of them, in order.

    Args:
        schedulers: the schedules (all on the same optimiser).
        optimizer: that optimiser (default: the first schedule's).

    Raises:
        ValueError: no schedulers, a ReduceLROnPlateau among them, or one built on another
            optimiser.
        TypeError: an entry is not a scheduler.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
        >>> s = ChainedScheduler([ConstantLR(opt, factor=0.5, total_iters=2),
        ...                       ExponentialLR(opt, gamma=0.9)])
        >>> [round((s.step(), s.get_last_lr()[0])[1], 6) for _ in range(2)]
        [0.45, 0.81]
    """

    def __init__(self, schedulers: Sequence[LRScheduler],
                 optimizer: Optional[Optimizer] = None) -> None:
        parts = list(schedulers)
        if not parts:
            raise ValueError("ChainedScheduler expects at least one scheduler")
        opt = optimizer if optimizer is not None else getattr(parts[0], "optimizer", None)
        _check_optimizer(opt)
        self._schedulers = _check_parts("ChainedScheduler", parts, opt)
        self.optimizer = opt
        self._last_lr = [group["lr"] for group in opt.param_groups]

    def step(self) -> None:  # type: ignore[override]
        """Step every schedule once, in order."""
        for s in self._schedulers:
            s.step()
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    state_dict = SequentialLR.state_dict
    _restored_apart = SequentialLR._restored_apart
    _restore_apart = SequentialLR._restore_apart
