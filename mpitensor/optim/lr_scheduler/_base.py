"""The scheduler base class (``LRScheduler``) and the argument checks every schedule shares.
"""

from __future__ import annotations

import math
import types
from typing import Any, Dict, List, Optional, Tuple

from ..optimizer import Optimizer


def _check_optimizer(optimizer: Any) -> Optimizer:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"a scheduler drives an mpitensor.optim.Optimizer; got "
                        f"{type(optimizer).__name__}, which is not an Optimizer")
    return optimizer


def _starting_rates(optimizer: Optimizer, last_epoch: int) -> List[float]:
    """Return every group's ``initial_lr``, recording it first on a fresh start."""
    groups = optimizer.param_groups
    if last_epoch == -1:
        for group in groups:
            group.setdefault("initial_lr", group["lr"])
    missing = [i for i, group in enumerate(groups) if "initial_lr" not in group]
    if missing:
        # Resuming needs the rates the run began with, and only the optimiser's state has them.
        raise KeyError(f"cannot resume a scheduler at last_epoch={last_epoch}: parameter "
                       f"group(s) {missing} have no 'initial_lr'; call "
                       f"optimizer.load_state_dict(...) before creating the scheduler, or pass "
                       f"last_epoch=-1 to start afresh")
    return [group["initial_lr"] for group in groups]


class LRScheduler:
    """Base of the schedulers: subclasses say what :meth:`get_lr` returns.

    Creating a scheduler already takes the first :meth:`step` (to epoch 0), as in torch.

    Args:
        optimizer: the optimiser whose learning rates are scheduled.
        last_epoch: index of the last finished epoch when resuming; -1 (the default) starts
            afresh and stores each group's current ``lr`` as its ``initial_lr``.

    Raises:
        TypeError: ``optimizer`` is not an :class:`Optimizer`.
        KeyError: ``last_epoch != -1`` but a group has no ``initial_lr``.
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        self.optimizer = _check_optimizer(optimizer)
        self.base_lrs: List[float] = _starting_rates(optimizer, last_epoch)
        self.last_epoch = last_epoch
        self._last_lr: List[float] = []
        self._initial_step()

    def _initial_step(self) -> None:
        """Take the first step, as the constructor does (SequentialLR repeats it for its first).

        That step may keep the optimiser's current rates (schedules that build on them check
        ``_is_initial``), so a resumed run does not move one epoch ahead of itself.
        """
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def get_lr(self) -> List[float]:
        """Return each group's rate for epoch ``last_epoch``, given the rates of the epoch before.

        Raises:
            NotImplementedError: always, here; every schedule provides its own.
        """
        raise NotImplementedError(f"{type(self).__name__} must define get_lr()")

    def _rates_at_epoch(self) -> List[float]:
        # A jump to an arbitrary epoch cannot build on the previous rates; schedules with a
        # closed form override this, the others fall back on the step-to-step rule.
        return self.get_lr()

    def get_last_lr(self) -> List[float]:
        """Return the learning rate of every group as the last :meth:`step` set it."""
        return list(self._last_lr)

    def step(self, epoch: Optional[int] = None) -> None:
        """Move to the next epoch (or straight to ``epoch``) and update every group's ``lr``.

        Args:
            epoch: jump to this epoch instead of the next one (torch deprecates it; the rates
                then come from the schedule's closed form).

        Example:
            >>> import mpitensor as mt
            >>> from mpitensor.optim import SGD
            >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
            >>> s = StepLR(opt, step_size=1, gamma=0.5); s.step(); s.get_last_lr()
            [0.5]
        """
        self._step_count += 1
        if epoch is not None:
            self.last_epoch = int(epoch)
            new_rates = self._rates_at_epoch()
        else:
            self.last_epoch += 1
            new_rates = self.get_lr()
        groups = self.optimizer.param_groups
        for group, rate in zip(groups, new_rates):
            group["lr"] = rate
        self._last_lr = [group["lr"] for group in groups]

    def state_dict(self) -> Dict[str, Any]:
        """Return the scheduler's attributes (the optimiser excepted) for ``mpitensor.save``."""
        state = dict(vars(self))
        del state["optimizer"]  # saved on its own; a checkpoint holds it once
        return state

    #: entries of a state dict that are not attributes to set back as saved: a schedule
    #: restores them itself, in :meth:`_restore_apart`
    _restored_apart: Tuple[str, ...] = ()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (torch's scheduler dicts load too).

        Raises:
            TypeError: ``state_dict`` is not a dict.
        """
        if not isinstance(state_dict, dict):
            raise TypeError(f"load_state_dict() expects the dict that state_dict() returned, "
                            f"got {type(state_dict).__name__}")
        vars(self).update({k: v for k, v in state_dict.items() if k not in self._restored_apart})
        self._restore_apart(state_dict)

    def _restore_apart(self, state_dict: Dict[str, Any]) -> None:
        """Restore the entries named in ``_restored_apart`` (none here)."""


def _callable_state(fn: Any) -> Optional[Dict[str, Any]]:
    """What a state dict keeps of a user function: a copy of a callable object's attributes;
    None for plain functions and lambdas, which do not pickle reliably."""
    if isinstance(fn, types.FunctionType) or not hasattr(fn, "__dict__"):
        return None
    return dict(vars(fn))


def _real(owner: str, name: str, value: Any) -> float:
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{owner}: {name} must be a number, got {type(value).__name__} "
                        f"({value!r})")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{owner}: {name} must be a number, got {type(value).__name__} "
                        f"({value!r})") from None
    if math.isnan(out):
        raise ValueError(f"{owner}: {name} is NaN; give a number")
    return out


def _positive_int(owner: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")
    return value


def _per_group(owner: str, name: str, optimizer: Optimizer, value: Any) -> List[Any]:
    """One value per parameter group: a list/tuple as given, or a scalar repeated."""
    n = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{owner}: {name} has {len(value)} values but the optimizer has "
                             f"{n} parameter groups; give one value per group or a single "
                             f"number")
        return list(value)
    return [value] * n


def _factor(owner: str, name: str, value: Any, low_open: bool) -> float:
    v = _real(owner, name, value)
    if v > 1.0 or (v <= 0.0 if low_open else v < 0.0):
        bound = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{owner}: {name} multiplies the initial rates and must lie in {bound}, "
                         f"got {value!r}")
    return v
