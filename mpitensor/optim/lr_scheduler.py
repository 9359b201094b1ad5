"""Learning-rate schedules, importable as ``torch.optim.lr_scheduler`` code expects.

A scheduler owns no rates of its own: it rewrites ``group["lr"]`` in its optimiser's parameter
groups each time :meth:`LRScheduler.step` is called (once per epoch, after ``optimizer.step()``),
and remembers in ``base_lrs`` where every group started. Each schedule computes the next rates
the way torch does (most from the current rates, step to step), so that the sequence is
bit-for-bit the one torch produces: ``StepLR``, ``MultiStepLR`` and ``ExponentialLR`` multiply by
powers of ``gamma``; ``CosineAnnealingLR`` follows torch's recursive cosine; ``LambdaLR`` scales
``base_lrs`` by user functions; ``OneCycleLR`` anneals per batch between ``max_lr`` and small
rates (and cycles the momentum the other way); ``ReduceLROnPlateau`` watches a metric instead of
the epoch count. ``LinearLR``, ``ConstantLR`` and ``PolynomialLR`` warm up or decay over
``total_iters`` epochs; ``CosineAnnealingWarmRestarts`` restarts the cosine (periods growing by
``T_mult``); ``CyclicLR`` cycles between two rates per batch; ``SequentialLR`` hands over from
one schedule to the next at milestones and ``ChainedScheduler`` applies several at every step.
"""

from __future__ import annotations

import bisect
import functools
import math
import types
from collections import Counter
from collections.abc import Iterable
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from .optimizer import Optimizer

__all__ = ["LRScheduler", "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
           "LambdaLR", "OneCycleLR", "ReduceLROnPlateau", "LinearLR", "ConstantLR",
           "PolynomialLR", "CosineAnnealingWarmRestarts", "CyclicLR", "SequentialLR",
           "ChainedScheduler", "MultiplicativeLR"]


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


# ---- checks shared by the schedules below ---------------------------------------------------

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


class CosineAnnealingLR(LRScheduler):
    """Anneal every group's rate from its initial value to ``eta_min`` along a half cosine.

    The rate follows ``eta_min + (base_lr - eta_min) * (1 + cos(pi * t / T_max)) / 2``, computed
    as torch does, from the previous rate at each :meth:`step` (so a rate changed by hand is
    carried along); past ``T_max`` it climbs back up and keeps oscillating (no restarts).

    Args:
        optimizer: the optimiser.
        T_max: half-period, in epochs (a number > 0).
        eta_min: the lowest rate (default 0).
        last_epoch: the last epoch index when resuming (default -1).

    Raises:
        ValueError: ``T_max`` is not > 0, or a value is NaN.
        TypeError: ``T_max`` or ``eta_min`` is not a number.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
        >>> s = CosineAnnealingLR(opt, T_max=2)
        >>> s.step(); round(s.get_last_lr()[0], 6)
        0.5
    """

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,  # noqa: N803
                 last_epoch: int = -1) -> None:
        if not _real("CosineAnnealingLR", "T_max", T_max) > 0:
            raise ValueError(f"CosineAnnealingLR: T_max (epochs from the initial rate down to "
                             f"eta_min) must be > 0, got {T_max!r}")
        _real("CosineAnnealingLR", "eta_min", eta_min)
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> List[float]:
        """Return the next rates from the current ones (torch's recursive form)."""
        groups = self.optimizer.param_groups
        current = [group["lr"] for group in groups]
        if self._is_initial:
            return current
        t, period, low = self.last_epoch, self.T_max, self.eta_min
        if (t - 1 - period) % (2 * period) == 0:
            # the bottom of the cosine: the ratio below would divide by zero, so add the rise
            rise = (1 - math.cos(math.pi / period)) / 2
            return [rate + (base - low) * rise for rate, base in zip(current, self.base_lrs)]
        ratio = (1 + math.cos(math.pi * t / period)) / (1 + math.cos(math.pi * (t - 1) / period))
        return [ratio * (rate - low) + low for rate in current]

    def _rates_at_epoch(self) -> List[float]:
        t, period, low = self.last_epoch, self.T_max, self.eta_min
        return [low + (base - low) * (1 + math.cos(math.pi * t / period)) / 2
                for base in self.base_lrs]


class LambdaLR(LRScheduler):
    """Set every group's rate to its initial rate times a function of the epoch.

    Args:
        optimizer: the optimiser.
        lr_lambda: a function ``epoch -> factor``, or a list/tuple with one per group.
        last_epoch: the last epoch index when resuming (default -1).

    Raises:
        ValueError: a list of functions whose length is not the number of groups.
        TypeError: a function is not callable.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=2.0)
        >>> s = LambdaLR(opt, lambda epoch: 1 / (epoch + 1))
        >>> s.step(); s.get_last_lr()
        [1.0]
    """

    def __init__(self, optimizer: Optimizer,
                 lr_lambda: Union[Callable[[int], float], Sequence[Callable[[int], float]]],
                 last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        n = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != n:
                raise ValueError(f"LambdaLR: got {len(lr_lambda)} lr_lambdas for {n} parameter "
                                 f"groups; give one function per group, or a single function")
            lambdas = list(lr_lambda)
        else:
            lambdas = [lr_lambda] * n
        odd = [i for i, fn in enumerate(lambdas) if not callable(fn)]
        if odd:
            raise TypeError(f"LambdaLR: lr_lambda entries {odd} are not callable; each must map "
                            f"an epoch number to a factor")
        self.lr_lambdas: List[Callable[[int], float]] = lambdas
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> List[float]:
        """Return ``base_lr * lr_lambda(last_epoch)`` for every group."""
        return [base * fn(self.last_epoch) for fn, base in zip(self.lr_lambdas, self.base_lrs)]

    def state_dict(self) -> Dict[str, Any]:
        """Return the state; plain functions and lambdas are stored as None (they do not pickle
        reliably), callable objects as a copy of their attributes (``__dict__``).
        """
        state = super().state_dict()
        state["lr_lambdas"] = [dict(vars(fn)) if not isinstance(fn, types.FunctionType)
                               and hasattr(fn, "__dict__") else None
                               for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore the state; saved attributes go back into this scheduler's callable objects.

        Raises:
            TypeError: ``state_dict`` is not a dict.
        """
        if not isinstance(state_dict, dict):
            raise TypeError(f"load_state_dict() expects the dict that state_dict() returned, "
                            f"got {type(state_dict).__name__}")
        rest = {k: v for k, v in state_dict.items() if k != "lr_lambdas"}
        super().load_state_dict(rest)
        for fn, saved in zip(self.lr_lambdas, state_dict.get("lr_lambdas") or []):
            if saved is not None:
                fn.__dict__.update(saved)


class MultiplicativeLR(LambdaLR):
    """Multiply every group's current rate by a function of the epoch, at every epoch.

    Unlike :class:`LambdaLR` (``base_lr * f(epoch)``), the factors compound:
    ``lr_t = lr_{t-1} * f(t)``.

    Args:
        optimizer: the optimiser.
        lr_lambda: a function ``epoch -> factor``, or a list/tuple with one per group.
        last_epoch: the last epoch index when resuming (default -1).

    Raises:
        ValueError: a list of functions whose length is not the number of groups.
        TypeError: a function is not callable.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
        >>> s = MultiplicativeLR(opt, lambda epoch: 0.5)
        >>> for _ in range(3): s.step()
        >>> s.get_last_lr()
        [0.125]
    """

    def get_lr(self) -> List[float]:
        """Return the current rates times ``lr_lambda(last_epoch)`` (unchanged on the first
        step, taken by the constructor)."""
        current = [group["lr"] for group in self.optimizer.param_groups]
        if self._is_initial:
            return current
        return [rate * fn(self.last_epoch) for fn, rate in zip(self.lr_lambdas, current)]


class OneCycleLR(LRScheduler):
    """The one-cycle policy (Smith & Topin): warm up to ``max_lr``, then anneal far below the start.

    Meant to be stepped after every batch. The rate goes from ``max_lr / div_factor`` up to
    ``max_lr`` over the first ``pct_start`` of ``total_steps``, then down to
    ``max_lr / div_factor / final_div_factor``; with ``three_phase`` it first comes back down to
    the starting rate and only then anneals to the minimum. With ``cycle_momentum``, SGD's
    ``momentum`` (or Adam's ``beta1``) moves the opposite way between ``max_momentum`` and
    ``base_momentum``. Each group records ``initial_lr``, ``max_lr``, ``min_lr`` (and
    ``max_momentum``, ``base_momentum``), as in torch.

    Args:
        optimizer: the optimiser.
        max_lr: the peak rate, or one per group.
        total_steps: the number of steps of the cycle; or give ``epochs`` and
            ``steps_per_epoch`` (their product is used).
        epochs, steps_per_epoch: see ``total_steps``.
        pct_start: the fraction of the cycle spent warming up (default 0.3).
        anneal_strategy: ``"cos"`` (default) or ``"linear"``.
        cycle_momentum: cycle the momentum or beta1 inversely to the rate (default True).
        base_momentum: the momentum at the peak rate, or one per group (default 0.85).
        max_momentum: the momentum at the start and the end, or one per group (default 0.95).
        div_factor: ``initial_lr = max_lr / div_factor`` (default 25).
        final_div_factor: ``min_lr = initial_lr / final_div_factor`` (default 1e4).
        three_phase: use the three-phase form (default False).
        last_epoch: the index of the last step taken when resuming (default -1).

    Raises:
        ValueError: no valid ``total_steps`` (or ``epochs`` and ``steps_per_epoch``),
            ``pct_start`` outside [0, 1], an unknown ``anneal_strategy``, a non-positive
            divisor, a negative rate or momentum, a per-group list of the wrong length,
            ``cycle_momentum`` with an optimiser that has neither ``momentum`` nor ``betas``, a
            cycle whose first or last phase is empty (torch would divide by zero), or a
            :meth:`step` past ``total_steps``.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9)
        >>> s = OneCycleLR(opt, max_lr=1.0, total_steps=10, anneal_strategy="linear")
        >>> s.get_last_lr(), opt.param_groups[0]["momentum"]
        ([0.04], 0.95)
        >>> for _ in range(2): s.step()
        >>> s.get_last_lr()  # the peak, at step pct_start * total_steps - 1
        [1.0]
    """

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: Union[float, Sequence[float]],
        total_steps: Optional[int] = None,
        epochs: Optional[int] = None,
        steps_per_epoch: Optional[int] = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: Union[float, Sequence[float]] = 0.85,
        max_momentum: Union[float, Sequence[float]] = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ) -> None:
        owner = "OneCycleLR"
        _check_optimizer(optimizer)
        # every argument is checked before any group is touched
        if total_steps is not None:
            total = _positive_int(owner, "total_steps", total_steps)
        elif epochs is not None and steps_per_epoch is not None:
            total = (_positive_int(owner, "epochs", epochs)
                     * _positive_int(owner, "steps_per_epoch", steps_per_epoch))
        else:
            raise ValueError(f"{owner}: the length of the cycle is missing; pass total_steps, or "
                             f"both epochs and steps_per_epoch")
        if not 0.0 <= _real(owner, "pct_start", pct_start) <= 1.0:
            raise ValueError(f"{owner}: pct_start is the fraction of the cycle spent warming up "
                             f"and must lie in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"{owner}: anneal_strategy must be 'cos' or 'linear', got "
                             f"{anneal_strategy!r}")
        for name, value in (("div_factor", div_factor), ("final_div_factor", final_div_factor)):
            if not _real(owner, name, value) > 0:
                raise ValueError(f"{owner}: {name} divides a learning rate and must be > 0, "
                                 f"got {value!r}")
        max_lrs = _per_group(owner, "max_lr", optimizer, max_lr)
        for v in max_lrs:
            if _real(owner, "max_lr", v) < 0:
                raise ValueError(f"{owner}: max_lr must be >= 0, got {v!r}")
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                kind = type(optimizer).__name__
                raise ValueError(f"{owner}: cycle_momentum=True needs an optimiser with a "
                                 f"'momentum' or 'betas' hyper-parameter ({kind} has neither); "
                                 f"pass cycle_momentum=False")
            max_moms = _per_group(owner, "max_momentum", optimizer, max_momentum)
            base_moms = _per_group(owner, "base_momentum", optimizer, base_momentum)
            for v in max_moms + base_moms:
                if _real(owner, "momentum", v) < 0:
                    raise ValueError(f"{owner}: momenta must be >= 0, got {v!r}")
        warm_end = float(pct_start * total) - 1
        if three_phase:
            phases = [
                dict(end_step=warm_end, start_lr="initial_lr", end_lr="max_lr",
                     start_momentum="max_momentum", end_momentum="base_momentum"),
                dict(end_step=float(2 * pct_start * total) - 2, start_lr="max_lr",
                     end_lr="initial_lr", start_momentum="base_momentum",
                     end_momentum="max_momentum"),
                dict(end_step=total - 1, start_lr="initial_lr", end_lr="min_lr",
                     start_momentum="max_momentum", end_momentum="max_momentum"),
            ]
        else:
            phases = [
                dict(end_step=warm_end, start_lr="initial_lr", end_lr="max_lr",
                     start_momentum="max_momentum", end_momentum="base_momentum"),
                dict(end_step=total - 1, start_lr="max_lr", end_lr="min_lr",
                     start_momentum="base_momentum", end_momentum="max_momentum"),
            ]
        if phases[0]["end_step"] == 0 or phases[-1]["end_step"] == phases[-2]["end_step"]:
            raise ValueError(f"{owner}: with total_steps={total} and pct_start={pct_start} a "
                             f"phase of the cycle has no length; change pct_start or use more "
                             f"steps")
        self.total_steps = total
        self._schedule_phases: List[Dict[str, Any]] = phases
        self._anneal_func_type = anneal_strategy
        self.cycle_momentum = bool(cycle_momentum)
        if last_epoch == -1:
            for group, top in zip(optimizer.param_groups, max_lrs):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        if self.cycle_momentum:
            self.use_beta1 = "betas" in optimizer.defaults
            if last_epoch == -1:
                for group, high, low in zip(optimizer.param_groups, max_moms, base_moms):
                    self._set_momentum(group, high)
                    group["max_momentum"] = high
                    group["base_momentum"] = low
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group: Dict[str, Any], value: float) -> None:
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> List[float]:
        """Return the rates at step ``last_epoch`` (and set the momenta, when cycled).

        Raises:
            ValueError: ``last_epoch`` is past ``total_steps``.
        """
        n = self.last_epoch
        if n > self.total_steps:
            raise ValueError(f"OneCycleLR: step {n} is past the end of the cycle "
                             f"(total_steps={self.total_steps}); build the scheduler with more "
                             f"steps, or stop stepping it")
        rates = []
        last = len(self._schedule_phases) - 1
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if n <= end or i == last:
                    pct = (n - start) / (end - start)
                    rates.append(self._anneal(group[phase["start_lr"]], group[phase["end_lr"]],
                                              pct))
                    if self.cycle_momentum:
                        self._set_momentum(group, self._anneal(group[phase["start_momentum"]],
                                                               group[phase["end_momentum"]],
                                                               pct))
                    break
                start = end
        return rates

    def step(self, epoch: Optional[int] = None) -> None:
        """Move to the next step (or to step ``epoch``) of the cycle.

        Raises:
            ValueError: the step would be past ``total_steps``; nothing changes then.
        """
        target = self.last_epoch + 1 if epoch is None else int(epoch)
        if target > self.total_steps:
            raise ValueError(f"OneCycleLR: step {target} is past the end of the cycle "
                             f"(total_steps={self.total_steps}); build the scheduler with more "
                             f"steps, or stop stepping it")
        super().step(epoch)


class ReduceLROnPlateau(LRScheduler):
    """Cut the learning rates by ``factor`` when a watched metric stops improving.

    Call ``step(metric)`` once per epoch with, say, the validation loss. A value counts as an
    improvement when it beats the best so far by more than ``threshold`` (relative, or absolute
    with ``threshold_mode="abs"``); after more than ``patience`` epochs without one, every rate
    is multiplied by ``factor`` (not below ``min_lr``; changes smaller than ``eps`` are skipped),
    and ``cooldown`` epochs follow during which bad epochs are not counted.

    Args:
        optimizer: the optimiser.
        mode: ``"min"`` (default) when lower is better, ``"max"`` when higher is.
        factor: multiplier applied to the rates, in [0, 1) (default 0.1).
        patience: bad epochs tolerated before a cut (default 10).
        threshold: how much better a value must be to count (default 1e-4).
        threshold_mode: ``"rel"`` (default) or ``"abs"``.
        cooldown: epochs to wait after a cut before counting again (default 0).
        min_lr: the lowest rate, or one per group (default 0).
        eps: the smallest change of a rate worth making (default 1e-8).

    Raises:
        ValueError: an unknown ``mode`` or ``threshold_mode``, ``factor`` outside [0, 1), a
            negative ``patience``, ``cooldown``, ``min_lr`` or ``eps``, or a list of ``min_lr``
            of the wrong length.
        TypeError: ``optimizer`` is not an Optimizer, or a value is not a number.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
        >>> s = ReduceLROnPlateau(opt, patience=1, factor=0.5)
        >>> for loss in (3.0, 2.0, 2.5, 2.5): s.step(loss)
        >>> s.get_last_lr()
        [0.5]
    """

    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: Union[float, Sequence[float]] = 0,
        eps: float = 1e-8,
    ) -> None:
        owner = "ReduceLROnPlateau"
        _check_optimizer(optimizer)
        if mode not in ("min", "max"):
            raise ValueError(f"{owner}: mode must be 'min' (lower is better) or 'max', got "
                             f"{mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"{owner}: threshold_mode must be 'rel' or 'abs', got "
                             f"{threshold_mode!r}")
        if not 0.0 <= _real(owner, "factor", factor) < 1.0:
            raise ValueError(f"{owner}: factor multiplies the rates on a plateau and must lie in "
                             f"[0, 1), got {factor!r}")
        for name, value in (("patience", patience), ("cooldown", cooldown)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{owner}: {name} counts epochs and must be an int >= 0, got "
                                 f"{value!r}")
        _real(owner, "threshold", threshold)
        if _real(owner, "eps", eps) < 0:
            raise ValueError(f"{owner}: eps must be >= 0, got {eps!r}")
        min_lrs = _per_group(owner, "min_lr", optimizer, min_lr)
        for v in min_lrs:
            if _real(owner, "min_lr", v) < 0:
                raise ValueError(f"{owner}: min_lr must be >= 0, got {v!r}")
        self.optimizer = optimizer
        self.factor = factor
        self.default_min_lr = None if isinstance(min_lr, (list, tuple)) else min_lr
        self.min_lrs = min_lrs
        self.patience = patience
        self.cooldown = cooldown
        self.eps = eps
        self.last_epoch = 0
        self._last_lr = [group["lr"] for group in optimizer.param_groups]
        self.mode = mode
        self.threshold = threshold
        self.threshold_mode = threshold_mode
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    @property
    def in_cooldown(self) -> bool:
        """Whether a cut happened less than ``cooldown`` epochs ago."""
        return self.cooldown_counter > 0

    def _improves(self, value: float) -> bool:
        """Whether ``value`` beats the best so far by more than the threshold."""
        sign = 1.0 if self.mode == "max" else -1.0  # +1: higher is better
        if self.threshold_mode == "rel":
            bar = self.best * (1.0 + sign * self.threshold)
        else:
            bar = self.best + sign * self.threshold
        return sign * (value - bar) > 0

    def get_lr(self) -> List[float]:
        """Return the current rates (this schedule changes them only from :meth:`step`)."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def step(self, metrics: Any, epoch: Optional[int] = None) -> None:  # type: ignore[override]
        """Record this epoch's metric and cut the rates if it has stalled for too long.

        Args:
            metrics: the watched value (a number, or a one-element Tensor/array).
            epoch: the epoch number to record (deprecated in torch; by default the next one).

        Raises:
            TypeError: ``metrics`` cannot be read as a number.
            RuntimeError: groups were added since construction and ``min_lr`` was a list.
        """
        try:
            current = float(metrics)
        except (TypeError, ValueError):
            raise TypeError(f"ReduceLROnPlateau.step() takes the watched metric as a number, "
                            f"got {type(metrics).__name__}") from None
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        improved = self._improves(current)
        if improved:
            self.best = current
        if self.cooldown_counter > 0:  # right after a cut, stalled epochs are not counted
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs = 0 if improved else self.num_bad_epochs + 1
        if self.num_bad_epochs > self.patience:
            self._cut_rates()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _cut_rates(self) -> None:
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(f"ReduceLROnPlateau: the optimizer now has {len(groups)} "
                                   f"parameter groups but min_lr was given for "
                                   f"{len(self.min_lrs)}; set scheduler.min_lrs to one value "
                                   f"per group")
            self.min_lrs = [self.default_min_lr] * len(groups)
        for group, floor in zip(groups, self.min_lrs):
            old = float(group["lr"])
            new = max(old * self.factor, floor)
            if old - new > self.eps:
                group["lr"] = new

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (torch's dicts load too).

        Raises:
            TypeError: ``state_dict`` is not a dict.
        """
        super().load_state_dict(state_dict)
        self.mode_worse = math.inf if self.mode == "min" else -math.inf


# ---- warm-up and decay over a fixed number of epochs ------------------------------------------

def _factor(owner: str, name: str, value: Any, low_open: bool) -> float:
    v = _real(owner, name, value)
    if v > 1.0 or (v <= 0.0 if low_open else v < 0.0):
        bound = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{owner}: {name} multiplies the initial rates and must lie in {bound}, "
                         f"got {value!r}")
    return v


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


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing with warm restarts (SGDR, Loshchilov & Hutter).

    Within a period of ``T_i`` epochs the rate follows
    ``eta_min + (base_lr - eta_min) * (1 + cos(pi * T_cur / T_i)) / 2``; at its end it restarts
    from ``base_lr``, and the next period is ``T_mult`` times longer. ``step(epoch)`` takes a
    fractional epoch (e.g. ``epoch + batch / batches`` after every batch).

    Args:
        optimizer: the optimiser.
        T_0: epochs of the first period (a positive int).
        T_mult: growth factor of the periods (an int >= 1, default 1).
        eta_min: the lowest rate (default 0).
        last_epoch: the last epoch index when resuming (default -1).

    Raises:
        ValueError: ``T_0`` is not a positive int, ``T_mult`` not an int >= 1, ``eta_min`` not a
            number; at :meth:`step`, a negative epoch.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
        >>> s = CosineAnnealingWarmRestarts(opt, T_0=2)
        >>> [(s.step(), round(s.get_last_lr()[0], 6))[1] for _ in range(3)]
        [0.5, 1.0, 0.5]
    """

    def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1,  # noqa: N803
                 eta_min: float = 0.0, last_epoch: int = -1) -> None:
        owner = "CosineAnnealingWarmRestarts"
        if isinstance(T_0, bool) or not isinstance(T_0, int) or T_0 <= 0:
            raise ValueError(f"{owner}: T_0 (epochs of the first period) must be a positive "
                             f"int, got {T_0!r}")
        if isinstance(T_mult, bool) or not isinstance(T_mult, int) or T_mult < 1:
            raise ValueError(f"{owner}: T_mult (growth of the periods) must be an int >= 1, "
                             f"got {T_mult!r}")
        if isinstance(eta_min, bool) or not isinstance(eta_min, (float, int)):
            raise ValueError(f"{owner}: eta_min must be a float or an int, got "
                             f"{type(eta_min).__name__} ({eta_min!r})")
        self.T_0 = T_0
        self.T_i = T_0
        self.T_mult = T_mult
        self.eta_min = eta_min
        self.T_cur: Union[int, float] = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> List[float]:
        """Return the rates at position ``T_cur`` of the current period ``T_i``."""
        low = self.eta_min
        wave = (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
        return [low + (base - low) * wave for base in self.base_lrs]

    def step(self, epoch: Optional[float] = None) -> None:  # type: ignore[override]
        """Advance one epoch, or go to ``epoch`` (a float: a fraction of the way through one).

        Args:
            epoch: the (fractional) epoch to go to; by default the next whole epoch.

        Raises:
            ValueError: ``epoch`` is negative.

        Example:
            >>> import mpitensor as mt
            >>> from mpitensor.optim import SGD
            >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
            >>> s = CosineAnnealingWarmRestarts(opt, T_0=2)
            >>> s.step(0.5); round(s.get_last_lr()[0], 6)
            0.853553
        """
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur = self.T_cur - self.T_i
                self.T_i = self.T_i * self.T_mult
        else:
            if epoch < 0:
                raise ValueError(f"CosineAnnealingWarmRestarts: epochs are >= 0, got {epoch!r}")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:
                    # periods T_0, T_0 m, T_0 m^2, ...: n whole periods end before epoch
                    m = self.T_mult
                    n = int(math.log((epoch / self.T_0 * (m - 1) + 1), m))
                    self.T_cur = epoch - self.T_0 * (m ** n - 1) / (m - 1)
                    self.T_i = self.T_0 * m ** n
            else:
                self.T_i = self.T_0
                self.T_cur = epoch
        self.last_epoch = math.floor(epoch)
        groups = self.optimizer.param_groups
        for group, rate in zip(groups, self.get_lr()):
            group["lr"] = rate
        self._last_lr = [group["lr"] for group in groups]


def _triangular_scale(x: float) -> float:
    return 1.0


def _triangular2_scale(x: float) -> float:
    return 1 / (2.0 ** (x - 1))


def _exp_range_scale(gamma: float, x: float) -> float:
    return gamma ** x


class CyclicLR(LRScheduler):
    """Cycle every group's rate between ``base_lr`` and ``max_lr`` (Smith, 2017), per batch.

    Each cycle rises for ``step_size_up`` steps and falls for ``step_size_down``; the amplitude
    is scaled by a policy: ``"triangular"`` (constant), ``"triangular2"`` (halved every cycle),
    ``"exp_range"`` (``gamma ** step``), or a ``scale_fn`` of the cycle number
    (``scale_mode="cycle"``) or of the step (``"iterations"``). With ``cycle_momentum``, the
    momentum (or Adam's ``beta1``) moves the opposite way between ``max_momentum`` and
    ``base_momentum``; groups record ``max_momentum`` and ``base_momentum``, as in torch.

    Args:
        optimizer: the optimiser.
        base_lr: the lower rate, or one per group (the groups' ``lr`` is set to it).
        max_lr: the upper rate, or one per group.
        step_size_up: steps of the rising half (default 2000).
        step_size_down: steps of the falling half (default: ``step_size_up``).
        mode: ``"triangular"``, ``"triangular2"`` or ``"exp_range"`` (ignored with
            ``scale_fn``).
        gamma: the base of ``"exp_range"`` (default 1).
        scale_fn: a custom amplitude policy, one argument.
        scale_mode: what ``scale_fn`` is given: ``"cycle"`` or ``"iterations"``.
        cycle_momentum: cycle the momentum too (default True).
        base_momentum, max_momentum: the momentum bounds, or one per group (default 0.8, 0.9).
        last_epoch: the last batch index when resuming (default -1).

    Raises:
        ValueError: an unknown ``mode`` without ``scale_fn``, a list of the wrong length, or
            ``cycle_momentum`` with an optimiser that has neither ``momentum`` nor ``betas``.
        TypeError: ``optimizer`` is not an Optimizer.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9)
        >>> s = CyclicLR(opt, base_lr=0.1, max_lr=0.5, step_size_up=2)
        >>> [round((s.step(), s.get_last_lr()[0])[1], 6) for _ in range(4)]
        [0.3, 0.5, 0.3, 0.1]
    """

    def __init__(
        self,
        optimizer: Optimizer,
        base_lr: Union[float, List[float]],
        max_lr: Union[float, List[float]],
        step_size_up: int = 2000,
        step_size_down: Optional[int] = None,
        mode: str = "triangular",
        gamma: float = 1.0,
        scale_fn: Optional[Callable[[float], float]] = None,
        scale_mode: str = "cycle",
        cycle_momentum: bool = True,
        base_momentum: float = 0.8,
        max_momentum: float = 0.9,
        last_epoch: int = -1,
    ) -> None:
        owner = "CyclicLR"
        _check_optimizer(optimizer)
        base_lrs = _per_group(owner, "base_lr", optimizer, base_lr)
        max_lrs = _per_group(owner, "max_lr", optimizer, max_lr)
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ValueError(f"{owner}: mode must be 'triangular', 'triangular2' or "
                             f"'exp_range' (or give a scale_fn), got {mode!r}")
        if scale_fn is not None and scale_mode not in ("cycle", "iterations"):
            raise ValueError(f"{owner}: scale_mode must be 'cycle' or 'iterations', got "
                             f"{scale_mode!r}")
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError(f"{owner}: cycle_momentum=True needs an optimiser with a "
                                 f"'momentum' or 'betas' hyper-parameter "
                                 f"({type(optimizer).__name__} has neither); pass "
                                 f"cycle_momentum=False")
            base_moms = _per_group(owner, "base_momentum", optimizer, base_momentum)
            max_moms = _per_group(owner, "max_momentum", optimizer, max_momentum)
        if last_epoch == -1:
            for group, rate in zip(optimizer.param_groups, base_lrs):
                group["lr"] = rate
        self.max_lrs = max_lrs
        up = float(step_size_up)
        down = float(step_size_down) if step_size_down is not None else up
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        self.mode = mode
        self.gamma = gamma
        self._scale_fn_custom = scale_fn
        self.scale_mode = scale_mode
        self._init_scale_fn()
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum:
            self.use_beta1 = "betas" in optimizer.defaults
            self.base_momentums = base_moms
            self.max_momentums = max_moms
            if last_epoch == -1:
                for group, high, low in zip(optimizer.param_groups, max_moms, base_moms):
                    self._set_momentum(group, high)
                    group["max_momentum"] = high
                    group["base_momentum"] = low
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def _init_scale_fn(self) -> None:
        self._scale_fn_ref: Callable[[float], float]
        if self._scale_fn_custom is not None:
            return
        if self.mode == "triangular":
            self._scale_fn_ref, self.scale_mode = _triangular_scale, "cycle"
        elif self.mode == "triangular2":
            self._scale_fn_ref, self.scale_mode = _triangular2_scale, "cycle"
        else:
            self._scale_fn_ref = functools.partial(_exp_range_scale, self.gamma)
            self.scale_mode = "iterations"

    def scale_fn(self, x: float) -> float:
        """The amplitude policy at ``x`` (the cycle number or the step, per ``scale_mode``)."""
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        return self._scale_fn_ref(x)

    def _set_momentum(self, group: Dict[str, Any], value: float) -> None:
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def get_lr(self) -> List[float]:
        """Return the rates at batch ``last_epoch`` (and set the momenta, when cycled)."""
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle  # position within the cycle
        if x <= self.step_ratio:
            rise = x / self.step_ratio
        else:
            rise = (x - 1) / (self.step_ratio - 1)
        scale = self.scale_fn(cycle if self.scale_mode == "cycle" else self.last_epoch)
        rates = [base + (top - base) * rise * scale
                 for base, top in zip(self.base_lrs, self.max_lrs)]
        if self.cycle_momentum:
            for group, low, high in zip(self.optimizer.param_groups, self.base_momentums,
                                        self.max_momentums):
                self._set_momentum(group, high - (high - low) * rise * scale)
        return rates

    def state_dict(self) -> Dict[str, Any]:
        """Return the state; a custom ``scale_fn`` is stored as None (a function) or as a copy
        of its attributes (a callable object), as torch stores it.
        """
        state = super().state_dict()
        state.pop("_scale_fn_ref", None)
        fn = state.pop("_scale_fn_custom", None)
        state["_scale_fn_custom"] = None
        if fn is not None and not isinstance(fn, types.FunctionType):
            state["_scale_fn_custom"] = dict(vars(fn)) if hasattr(fn, "__dict__") else None
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore the state; saved attributes go back into this scheduler's ``scale_fn``.

        Raises:
            TypeError: ``state_dict`` is not a dict.
        """
        if not isinstance(state_dict, dict):
            raise TypeError(f"load_state_dict() expects the dict that state_dict() returned, "
                            f"got {type(state_dict).__name__}")
        rest = {k: v for k, v in state_dict.items() if k != "_scale_fn_custom"}
        super().load_state_dict(rest)
        saved = state_dict.get("_scale_fn_custom")
        if saved is not None and self._scale_fn_custom is not None:
            self._scale_fn_custom.__dict__.update(saved)
        self._init_scale_fn()


# ---- schedules made of schedules --------------------------------------------------------------

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
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
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

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore the state and every part's.

        Raises:
            TypeError: ``state_dict`` is not a dict.
        """
        if not isinstance(state_dict, dict):
            raise TypeError(f"load_state_dict() expects the dict that state_dict() returned, "
                            f"got {type(state_dict).__name__}")
        vars(self).update({k: v for k, v in state_dict.items() if k != "_schedulers"})
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
    load_state_dict = SequentialLR.load_state_dict
