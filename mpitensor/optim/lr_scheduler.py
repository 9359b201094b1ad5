"""Learning-rate schedules with torch's names and semantics (``torch.optim.lr_scheduler``).

A scheduler edits ``group["lr"]`` of its optimiser's parameter groups; call ``scheduler.step()``
once per epoch, after ``optimizer.step()``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, Dict, List, Optional

from .optimizer import Optimizer

__all__ = ["LRScheduler", "StepLR", "MultiStepLR"]


class LRScheduler:
    """Base class of schedulers: ``step()``, ``get_last_lr()``, ``state_dict()``.

    Args:
        optimizer: the optimiser whose learning rates are scheduled.
        last_epoch: index of the last epoch when resuming (-1 to start fresh; then every group
            needs an ``initial_lr``, which a fresh scheduler records).

    Raises:
        TypeError: ``optimizer`` is not an :class:`Optimizer`.
        KeyError: resuming (``last_epoch != -1``) with a group that has no ``initial_lr``.
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] "
                                   f"when resuming an optimizer (last_epoch={last_epoch}); "
                                   f"load the optimizer's state_dict first")
        self.base_lrs: List[float] = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._last_lr: List[float] = []
        self.step()

    def get_lr(self) -> List[float]:
        """Return the learning rates for the current ``last_epoch`` (chainable form)."""
        raise NotImplementedError

    def get_last_lr(self) -> List[float]:
        """Return the learning rate of every group as last set by :meth:`step`."""
        return list(self._last_lr)

    def step(self, epoch: Optional[int] = None) -> None:
        """Advance one epoch (or jump to ``epoch``) and set every group's ``lr``.

        Example:
            >>> import mpitensor as mt
            >>> from mpitensor.optim import SGD
            >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
            >>> s = StepLR(opt, step_size=1, gamma=0.5); s.step(); s.get_last_lr()
            [0.5]
        """
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = int(epoch)
            values = self._get_closed_form_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> List[float]:
        return self.get_lr()

    def state_dict(self) -> Dict[str, Any]:
        """Return the scheduler's state (everything but the optimiser), for ``mpitensor.save``."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict`."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"load_state_dict() takes a dict, got {type(state_dict).__name__}")
        self.__dict__.update(state_dict)


class StepLR(LRScheduler):
    """Multiply every group's learning rate by ``gamma`` each ``step_size`` epochs.

    Args:
        optimizer: the optimiser.
        step_size: period of the decay, in epochs (a positive int).
        gamma: multiplicative factor (default 0.1).
        last_epoch: the last epoch index when resuming (default -1).

    Raises:
        ValueError: ``step_size`` is not a positive int.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
        >>> s = StepLR(opt, step_size=2, gamma=0.1)
        >>> for _ in range(2): s.step()
        >>> s.get_last_lr()
        [0.1]
    """

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size <= 0:
            raise ValueError(f"step_size must be a positive int, got {step_size!r}")
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> List[float]:
        """Return the current rates, decayed by ``gamma`` on multiples of ``step_size``."""
        groups = self.optimizer.param_groups
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [g["lr"] for g in groups]
        return [g["lr"] * self.gamma for g in groups]

    def _get_closed_form_lr(self) -> List[float]:
        return [b * self.gamma ** (self.last_epoch // self.step_size) for b in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply every group's learning rate by ``gamma`` at each milestone epoch.

    Args:
        optimizer: the optimiser.
        milestones: epoch indices (a milestone listed twice decays twice).
        gamma: multiplicative factor (default 0.1).
        last_epoch: the last epoch index when resuming (default -1).

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
        >>> s = MultiStepLR(opt, milestones=[1, 3], gamma=0.5)
        >>> [(s.step(), s.get_last_lr()[0])[1] for _ in range(3)]
        [0.5, 0.5, 0.25]
    """

    def __init__(self, optimizer: Optimizer, milestones: Iterable[int], gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        ms = list(milestones)
        for m in ms:
            if isinstance(m, bool) or not isinstance(m, int):
                raise ValueError(f"milestones must be ints, got {m!r}")
        self.milestones: Counter = Counter(ms)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> List[float]:
        """Return the current rates, decayed by ``gamma`` (per repeat) at a milestone."""
        groups = self.optimizer.param_groups
        if self.last_epoch not in self.milestones:
            return [g["lr"] for g in groups]
        f = self.gamma ** self.milestones[self.last_epoch]
        return [g["lr"] * f for g in groups]

    def _get_closed_form_lr(self) -> List[float]:
        n = sum(c for m, c in self.milestones.items() if m <= self.last_epoch)
        return [b * self.gamma ** n for b in self.base_lrs]

    def state_dict(self) -> Dict[str, Any]:
        """Return the state; ``milestones`` as a plain dict so ``mpitensor.save`` can store it."""
        sd = super().state_dict()
        sd["milestones"] = dict(self.milestones)
        return sd

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict`."""
        super().load_state_dict(state_dict)
        self.milestones = Counter(self.milestones)
