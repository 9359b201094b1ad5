"""``ReduceLROnPlateau``: a schedule driven by a metric instead of the epoch count.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Union

from ..optimizer import Optimizer
from ._base import LRScheduler, _check_optimizer, _per_group, _real


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
