"""Schedules given by user functions of the epoch: ``LambdaLR`` scales the initial rates,
``MultiplicativeLR`` compounds the current ones.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Union

from ..optimizer import Optimizer
from ._base import LRScheduler, _callable_state, _check_optimizer


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
        state["lr_lambdas"] = [_callable_state(fn) for fn in self.lr_lambdas]
        return state

    _restored_apart = ("lr_lambdas",)

    def _restore_apart(self, state_dict: Dict[str, Any]) -> None:
        """Saved attributes go back into this scheduler's callable objects."""
        for fn, saved in zip(self.lr_lambdas, state_dict.get("lr_lambdas") or []):
            if saved is not None:
                fn.__dict__.update(saved)


class MultiplicativeLR(LambdaLR):
    """Multiply every group's current rate by a function of the epoch, at every epoch.

    Unlike :class:`LambdaLR` (``base_lr * f(epoch)``), the factors compound:
    ``lr_t = lr_{t-1} * f(t)``. It takes :class:`LambdaLR`'s arguments, checked the same way.

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
