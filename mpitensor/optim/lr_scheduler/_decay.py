"""Schedules that decay (or warm up) with the epoch count: powers of ``gamma`` (``StepLR``,
``MultiStepLR``, ``ExponentialLR``) and fixed-length ramps (``LinearLR``, ``ConstantLR``,
``PolynomialLR``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, Dict, List

from ..optimizer import Optimizer
from ._base import LRScheduler, _factor, _real


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


class ExponentialLR(LRScheduler):
    """Multiply every group's learning rate by ``gamma`` at every epoch.

    Args:
        optimizer: the optimiser.
        gamma: multiplicative factor per epoch (a number >= 0).
        last_epoch: the last epoch index when resuming (default -1).

    Raises:
        ValueError: ``gamma`` is negative or NaN.
        TypeError: ``gamma`` is not a number.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
        >>> s = ExponentialLR(opt, gamma=0.5)
        >>> for _ in range(3): s.step()
        >>> s.get_last_lr()
        [0.125]
    """

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        if _real("ExponentialLR", "gamma", gamma) < 0:
            raise ValueError(f"ExponentialLR: gamma must be >= 0 (a negative factor would make "
                             f"negative learning rates), got {gamma!r}")
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> List[float]:
        """Return the current rates times ``gamma`` (unchanged on the constructor's step)."""
        current = [group["lr"] for group in self.optimizer.param_groups]
        if self._is_initial:
            return current
        return [rate * self.gamma for rate in current]

    def _rates_at_epoch(self) -> List[float]:
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class LinearLR(LRScheduler):
    """Scale every group's rate linearly from ``start_factor`` to ``end_factor`` of its initial
    value over ``total_iters`` epochs, then keep it (a linear warm-up, or a linear decay).

    Args:
        optimizer: the optimiser.
        start_factor: factor at epoch 0, in (0, 1] (default 1/3).
        end_factor: factor from epoch ``total_iters`` on, in [0, 1] (default 1).
        total_iters: epochs the change takes (default 5).
        last_epoch: the last epoch index when resuming (default -1).

    Raises:
        ValueError: a factor is out of range or NaN.
        TypeError: a factor is not a number.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
        >>> s = LinearLR(opt, start_factor=0.5, total_iters=2)
        >>> [round(s.get_last_lr()[0], 6)] + [(s.step(), round(s.get_last_lr()[0], 6))[1]
        ...                                   for _ in range(3)]
        [0.5, 0.75, 1.0, 1.0]
    """

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3,
                 end_factor: float = 1.0, total_iters: int = 5, last_epoch: int = -1) -> None:
        _factor("LinearLR", "start_factor", start_factor, low_open=True)
        _factor("LinearLR", "end_factor", end_factor, low_open=False)
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> List[float]:
        """Return the next rates from the current ones (torch's step-to-step form)."""
        current = [group["lr"] for group in self.optimizer.param_groups]
        t, a, b = self.last_epoch, self.start_factor, self.end_factor
        if t == 0:
            return [rate * a for rate in current]
        if self._is_initial or t > self.total_iters:  # a resumed run keeps its current rates
            return current
        # the ratio of the factor at t to the factor at t - 1
        ratio = 1.0 + (b - a) / (self.total_iters * a + (t - 1) * (b - a))
        return [rate * ratio for rate in current]

    def _rates_at_epoch(self) -> List[float]:
        a, b = self.start_factor, self.end_factor
        done = min(self.total_iters, self.last_epoch)
        return [base * (a + (b - a) * done / self.total_iters) for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """Multiply every group's rate by ``factor`` for the first ``total_iters`` epochs, then
    restore it.

    Args:
        optimizer: the optimiser.
        factor: the factor applied until epoch ``total_iters``, in [0, 1] (default 1/3).
        total_iters: epochs at the reduced rate (default 5).
        last_epoch: the last epoch index when resuming (default -1).

    Raises:
        ValueError: ``factor`` is out of range or NaN.
        TypeError: ``factor`` is not a number.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
        >>> s = ConstantLR(opt, factor=0.5, total_iters=2)
        >>> s.get_last_lr(), (s.step(), s.get_last_lr())[1], (s.step(), s.get_last_lr())[1]
        ([0.5], [0.5], [1.0])
    """

    def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5,
                 last_epoch: int = -1) -> None:
        _factor("ConstantLR", "factor", factor, low_open=False)
        self.factor = factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> List[float]:
        """Return the current rates, times ``factor`` at epoch 0, divided by it at the end."""
        current = [group["lr"] for group in self.optimizer.param_groups]
        if self.last_epoch == 0:
            return [rate * self.factor for rate in current]
        if self.last_epoch != self.total_iters:
            return current
        return [rate * (1.0 / self.factor) for rate in current]

    def _rates_at_epoch(self) -> List[float]:
        over = self.last_epoch >= self.total_iters
        return [base * (self.factor + over * (1 - self.factor)) for base in self.base_lrs]


class PolynomialLR(LRScheduler):
    """Decay every group's rate to zero over ``total_iters`` epochs along ``(1 - t/T) ** power``.

    Args:
        optimizer: the optimiser.
        total_iters: epochs until the rate reaches zero (default 5).
        power: the polynomial's power (default 1, a linear decay).
        last_epoch: the last epoch index when resuming (default -1).

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
        >>> s = PolynomialLR(opt, total_iters=4, power=2.0)
        >>> s.step(); s.get_last_lr()
        [0.5625]
    """

    def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0,
                 last_epoch: int = -1) -> None:
        self.total_iters = total_iters
        self.power = power
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> List[float]:
        """Return the next rates from the current ones (torch's step-to-step form)."""
        current = [group["lr"] for group in self.optimizer.param_groups]
        t, total = self.last_epoch, self.total_iters
        if self._is_initial or t == 0 or t > total:
            return current
        ratio = ((1.0 - t / total) / (1.0 - (t - 1) / total)) ** self.power
        return [rate * ratio for rate in current]

    def _rates_at_epoch(self) -> List[float]:
        left = 1.0 - min(self.total_iters, self.last_epoch) / self.total_iters
        return [base * left ** self.power for base in self.base_lrs]
