"""Learning-rate schedules, importable as ``torch.optim.lr_scheduler`` code expects.

A scheduler owns no rates of its own: it rewrites ``group["lr"]`` in its optimiser's parameter
groups each time :meth:`LRScheduler.step` is called (once per epoch, after ``optimizer.step()``),
and remembers in ``base_lrs`` where every group started. The schedules here decay by powers of a
``gamma`` factor; they share one base that multiplies the current rates at the epochs where a
decay falls, which is what makes the sequence bit-for-bit the one torch produces.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, Dict, List, Optional

from .optimizer import Optimizer

__all__ = ["LRScheduler", "StepLR", "MultiStepLR"]


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
        self.step()

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

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (torch's scheduler dicts load too).

        Raises:
            TypeError: ``state_dict`` is not a dict.
        """
        if not isinstance(state_dict, dict):
            raise TypeError(f"load_state_dict() expects the dict that state_dict() returned, "
                            f"got {type(state_dict).__name__}")
        vars(self).update(state_dict)


_LRScheduler = LRScheduler  # the older name, still used by schedulers written for torch < 2.0


class _PowerDecay(LRScheduler):
    """A schedule whose rate at epoch ``e`` is ``base_lr * gamma ** n(e)`` for a count ``n``."""

    gamma: float

    def _decays_at(self, epoch: int) -> int:
        """How many times the rate is multiplied by ``gamma`` on entering ``epoch``."""
        raise NotImplementedError

    def _decays_up_to(self, epoch: int) -> int:
        """How many decays have happened by ``epoch``, counting those at ``epoch`` itself."""
        raise NotImplementedError

    def get_lr(self) -> List[float]:
        """Return the current rates, multiplied by ``gamma`` once per decay at this epoch."""
        current = [group["lr"] for group in self.optimizer.param_groups]
        count = self._decays_at(self.last_epoch)
        if count == 0:
            return current
        # One multiplication by gamma**count (not count by gamma) keeps torch's rounding.
        factor = self.gamma ** count
        return [rate * factor for rate in current]

    def _rates_at_epoch(self) -> List[float]:
        factor = self.gamma ** self._decays_up_to(self.last_epoch)
        return [base * factor for base in self.base_lrs]


class StepLR(_PowerDecay):
    """Multiply every group's learning rate by ``gamma`` every ``step_size`` epochs.

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
            raise ValueError(f"StepLR needs step_size to be a positive int (epochs between "
                             f"decays), got {step_size!r}")
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def _decays_at(self, epoch: int) -> int:
        return int(epoch > 0 and epoch % self.step_size == 0)

    def _decays_up_to(self, epoch: int) -> int:
        return epoch // self.step_size


class MultiStepLR(_PowerDecay):
    """Multiply every group's learning rate by ``gamma`` at each milestone epoch.

    Args:
        optimizer: the optimiser.
        milestones: epoch indices (a milestone listed twice decays twice).
        gamma: multiplicative factor (default 0.1).
        last_epoch: the last epoch index when resuming (default -1).

    Raises:
        ValueError: a milestone is not an int.

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
        epochs = list(milestones)
        odd = [m for m in epochs if isinstance(m, bool) or not isinstance(m, int)]
        if odd:
            raise ValueError(f"MultiStepLR milestones are epoch numbers (ints); got {odd!r} "
                             f"in {epochs!r}")
        self.milestones: Counter = Counter(epochs)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def _decays_at(self, epoch: int) -> int:
        return self.milestones.get(epoch, 0)

    def _decays_up_to(self, epoch: int) -> int:
        return sum(n for m, n in self.milestones.items() if m <= epoch)

    def state_dict(self) -> Dict[str, Any]:
        """Return the state, with ``milestones`` as a plain dict that ``mpitensor.save`` stores."""
        state = super().state_dict()
        state["milestones"] = dict(self.milestones)
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        super().load_state_dict(state_dict)
        self.milestones = Counter(self.milestones)
