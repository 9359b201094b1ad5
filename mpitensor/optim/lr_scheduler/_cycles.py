"""Schedules that anneal along a curve and may start over: ``CosineAnnealingLR``,
``CosineAnnealingWarmRestarts``, ``OneCycleLR`` and ``CyclicLR`` (the last two stepped per
batch, and cycling the momentum the other way).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from ..optimizer import Optimizer
from ._base import (
    LRScheduler,
    _callable_state,
    _check_optimizer,
    _per_group,
    _positive_int,
    _real,
)


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
        _positive_int(owner, "T_0", T_0)  # epochs of the first period
        _positive_int(owner, "T_mult", T_mult)  # growth of the periods
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


def _cycle_length(total_steps: Any, epochs: Any, steps_per_epoch: Any) -> int:
    """OneCycleLR's number of steps: ``total_steps``, or ``epochs * steps_per_epoch``."""
    owner = "OneCycleLR"
    if total_steps is not None:
        return _positive_int(owner, "total_steps", total_steps)
    if epochs is not None and steps_per_epoch is not None:
        return (_positive_int(owner, "epochs", epochs)
                * _positive_int(owner, "steps_per_epoch", steps_per_epoch))
    raise ValueError(f"{owner}: the length of the cycle is missing; pass total_steps, or "
                     f"both epochs and steps_per_epoch")


def _one_cycle_phases(total: int, pct_start: float, three_phase: bool) -> List[Dict[str, Any]]:
    """The phases of a one-cycle schedule: where each ends, and which group keys (rates and
    momenta) it anneals from and to."""
    owner = "OneCycleLR"
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
    return phases


class _MomentumCycle(LRScheduler):
    """What OneCycleLR and CyclicLR share: with ``cycle_momentum``, SGD's ``momentum`` (or
    Adam's ``beta1``) moves the opposite way to the rate, between each group's
    ``base_momentum`` and ``max_momentum``."""

    use_beta1: bool

    @staticmethod
    def _require_momentum(owner: str, optimizer: Optimizer) -> None:
        if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
            raise ValueError(f"{owner}: cycle_momentum=True needs an optimiser with a "
                             f"'momentum' or 'betas' hyper-parameter "
                             f"({type(optimizer).__name__} has neither); pass "
                             f"cycle_momentum=False")

    def _start_momenta(self, optimizer: Optimizer, last_epoch: int, max_moms: List[float],
                       base_moms: List[float]) -> None:
        """On a fresh start, record each group's momentum range and start at its top."""
        self.use_beta1 = "betas" in optimizer.defaults
        if last_epoch == -1:
            for group, high, low in zip(optimizer.param_groups, max_moms, base_moms):
                self._set_momentum(group, high)
                group["max_momentum"] = high
                group["base_momentum"] = low

    def _set_momentum(self, group: Dict[str, Any], value: float) -> None:
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value


class OneCycleLR(_MomentumCycle):
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
        total = _cycle_length(total_steps, epochs, steps_per_epoch)
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
            self._require_momentum(owner, optimizer)
            max_moms = _per_group(owner, "max_momentum", optimizer, max_momentum)
            base_moms = _per_group(owner, "base_momentum", optimizer, base_momentum)
            for v in max_moms + base_moms:
                if _real(owner, "momentum", v) < 0:
                    raise ValueError(f"{owner}: momenta must be >= 0, got {v!r}")
        phases = _one_cycle_phases(total, pct_start, three_phase)
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
            self._start_momenta(optimizer, last_epoch, max_moms, base_moms)
        super().__init__(optimizer, last_epoch)

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


def _triangular_scale(x: float) -> float:
    return 1.0


def _triangular2_scale(x: float) -> float:
    return 1 / (2.0 ** (x - 1))


def _exp_range_scale(gamma: float, x: float) -> float:
    return gamma ** x


class CyclicLR(_MomentumCycle):
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
            self._require_momentum(owner, optimizer)
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
            self.base_momentums = base_moms
            self.max_momentums = max_moms
            self._start_momenta(optimizer, last_epoch, max_moms, base_moms)
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
        state["_scale_fn_custom"] = _callable_state(state.pop("_scale_fn_custom", None))
        return state

    _restored_apart = ("_scale_fn_custom",)

    def _restore_apart(self, state_dict: Dict[str, Any]) -> None:
        """Saved attributes go back into this scheduler's ``scale_fn``."""
        saved = state_dict.get("_scale_fn_custom")
        if saved is not None and self._scale_fn_custom is not None:
            self._scale_fn_custom.__dict__.update(saved)
        self._init_scale_fn()
