"""Stochastic weight averaging and EMA (``torch.optim.swa_utils``).

``AveragedModel`` keeps a copy of a model whose parameters (and, with ``use_buffers``, buffers)
are running averages of the model's: equal weights by default (SWA, Izmailov et al., 2018),
``avg + (new - avg) / (n + 1)``, or exponential weights with :func:`get_ema_avg_fn` /
:func:`get_ema_multi_avg_fn`, ``decay * avg + (1 - decay) * new``. ``SWALR`` anneals the
learning rates to a constant ``swa_lr``; :func:`update_bn` recomputes batch-norm statistics for
the averaged weights with one pass over the data. The averaged model's state dict has torch's
keys (``n_averaged``, ``module.<name>``), so it loads into torch's ``AveragedModel``.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Iterable, List, Optional, Union

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor.nn.modules.batchnorm import _BatchNorm
from mpitensor.nn.modules.module import Module
from mpitensor.tensor import Tensor

from .lr_scheduler._base import LRScheduler, _check_optimizer, _per_group, _real
from .optimizer import Optimizer

__all__ = ["AveragedModel", "update_bn", "SWALR", "get_ema_multi_avg_fn",
           "get_swa_multi_avg_fn", "get_ema_avg_fn", "get_swa_avg_fn"]


def _check_decay(decay: float) -> None:
    if not 0.0 <= _real("get_ema_avg_fn", "decay", decay) <= 1.0:
        raise ValueError(f"EMA decay must lie in [0, 1], got {decay!r}")


def get_ema_multi_avg_fn(decay: float = 0.999) -> Callable[[List[Tensor], List[Tensor], Any],
                                                               None]:
    """Return an in-place EMA over lists of Tensors: ``avg = decay * avg + (1 - decay) * new``.

    Args:
        decay: weight of the running average, in [0, 1] (default 0.999).

    Returns:
        ``fn(averaged, current, num_averaged)`` that updates ``averaged`` in place.

    Raises:
        ValueError: ``decay`` is outside [0, 1].

    Example:
        >>> import mpitensor as mt
        >>> avg, new = mt.tensor([1.0]), mt.tensor([3.0])
        >>> get_ema_multi_avg_fn(0.5)([avg], [new], 1); avg
        tensor([2.])
    """
    _check_decay(decay)

    def ema_update(ema_param_list: List[Tensor], current_param_list: List[Tensor],
                   _num_averaged: Any) -> None:
        for a, c in zip(ema_param_list, current_param_list):
            _lerp_into(a, c, 1.0 - decay)

    return ema_update


def get_swa_multi_avg_fn() -> Callable[[List[Tensor], List[Tensor], Any], None]:
    """Return an in-place equal-weight average over lists of Tensors.

    Returns:
        ``fn(averaged, current, num_averaged)``: ``avg += (new - avg) / (num_averaged + 1)``.

    Example:
        >>> import mpitensor as mt
        >>> avg, new = mt.tensor([1.0]), mt.tensor([4.0])
        >>> get_swa_multi_avg_fn()([avg], [new], 2); avg
        tensor([2.])
    """

    def swa_update(averaged_param_list: List[Tensor], current_param_list: List[Tensor],
                   num_averaged: Any) -> None:
        n = _count(num_averaged)
        # a lerp by 1 / (n + 1); torch divides a count Tensor into the default float dtype, so
        # with a Tensor count the weight is rounded to float32 (its rounding shows in float64)
        if isinstance(num_averaged, Tensor) and _dt.get_default_dtype() != np.float64:
            weight = float(np.float32(1.0) / np.float32(n + 1))
        else:
            weight = 1.0 / (n + 1)
        for a, c in zip(averaged_param_list, current_param_list):
            _lerp_into(a, c, weight)

    return swa_update


def get_ema_avg_fn(decay: float = 0.999) -> Callable[[Tensor, Tensor, Any], Tensor]:
    """Return the EMA of one Tensor: ``decay * averaged + (1 - decay) * current``.

    Args:
        decay: weight of the running average, in [0, 1] (default 0.999).

    Raises:
        ValueError: ``decay`` is outside [0, 1].

    Example:
        >>> import mpitensor as mt
        >>> get_ema_avg_fn(0.75)(mt.tensor([4.0]), mt.tensor([0.0]), 1)
        tensor([3.])
    """
    _check_decay(decay)

    def ema_update(ema_param: Tensor, current_param: Tensor, num_averaged: Any) -> Tensor:
        return decay * ema_param + (1 - decay) * current_param

    return ema_update


def get_swa_avg_fn() -> Callable[[Tensor, Tensor, Any], Tensor]:
    """Return the equal-weight running average of one Tensor.

    Returns:
        ``fn(averaged, current, num_averaged) = averaged + (current - averaged) /
        (num_averaged + 1)``.

    Example:
        >>> import mpitensor as mt
        >>> get_swa_avg_fn()(mt.tensor([1.0]), mt.tensor([4.0]), 2)
        tensor([2.])
    """

    def swa_update(averaged_param: Tensor, current_param: Tensor, num_averaged: Any) -> Tensor:
        return averaged_param + (current_param - averaged_param) / (_count(num_averaged) + 1)

    return swa_update


def _count(n: Any) -> int:
    return int(_backend.to_numpy(n._data)) if isinstance(n, Tensor) else int(n)


def _lerp_into(a: Tensor, c: Tensor, weight: float) -> None:
    arr = a._data
    from ._adaptive import lerp_  # noqa: PLC0415 - the optimisers' two-sided lerp

    lerp_(arr, c._data.astype(arr.dtype, copy=False), weight, np.empty_like(arr)
          if isinstance(arr, np.ndarray) else _backend.array_module(arr).empty_like(arr))
    _autograd.bump_version(a)


class AveragedModel(Module):
    """A copy of ``model`` whose weights are running averages of ``model``'s (SWA or EMA).

    Call :meth:`update_parameters` (typically once per epoch after some start) with the trained
    model; the first call copies its weights, later ones average them in. Calling the averaged
    model runs the copy (``forward``). Without ``use_buffers`` its buffers are copied from the
    model at every update (re-estimate batch-norm statistics with :func:`update_bn`).

    Args:
        model: the module to average.
        device: where to keep the copy (default: where the model is).
        avg_fn: ``fn(averaged, current, num_averaged) -> Tensor`` for each parameter
            (default: the equal-weight average).
        multi_avg_fn: ``fn(averaged_list, current_list, num_averaged)`` updating the lists in
            place (used instead of ``avg_fn`` when given).
        use_buffers: average the buffers as well as the parameters (default False).

    Example:
        >>> import mpitensor as mt
        >>> lin = mt.nn.Linear(1, 1, bias=False)
        >>> swa = AveragedModel(lin)
        >>> with mt.no_grad():
        ...     for w in (1.0, 2.0, 6.0):
        ...         _ = lin.weight.fill_(w)
        ...         swa.update_parameters(lin)
        >>> float(swa.module.weight), int(swa.n_averaged)
        (3.0, 3)
    """

    def __init__(self, model: Module, device: Any = None,
                 avg_fn: Optional[Callable[[Tensor, Tensor, Any], Tensor]] = None,
                 multi_avg_fn: Optional[Callable[[List[Tensor], List[Tensor], Any], None]] = None,
                 use_buffers: bool = False) -> None:
        super().__init__()
        if not isinstance(model, Module):
            raise TypeError(f"AveragedModel averages an mpitensor.nn.Module, got "
                            f"{type(model).__name__}")
        self.module = copy.deepcopy(model)
        if device is not None:
            self.module = self.module.to(device)
        self.register_buffer("n_averaged", Tensor._wrap(np.zeros((), dtype=_dt.int64)))
        self.avg_fn = avg_fn
        self.multi_avg_fn = multi_avg_fn
        self.use_buffers = use_buffers

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the averaged copy of the model."""
        return self.module(*args, **kwargs)

    def _averaged(self, model: Module) -> Any:
        if self.use_buffers:
            return (list(self.module.parameters()) + list(self.module.buffers()),
                    list(model.parameters()) + list(model.buffers()))
        return list(self.module.parameters()), list(model.parameters())

    def update_parameters(self, model: Module) -> None:
        """Average ``model``'s current weights into this copy (the first call copies them).

        Args:
            model: the model being trained (same architecture as the one copied).

        Raises:
            ValueError: ``model`` does not have as many parameters (and buffers) as the copy.
        """
        mine, theirs = self._averaged(model)
        if len(mine) != len(theirs):
            raise ValueError(f"AveragedModel.update_parameters: the model has {len(theirs)} "
                             f"parameters/buffers, the averaged copy {len(mine)}; pass the "
                             f"model that was copied")
        n = _count(self.n_averaged)
        pairs = []
        for a, m in zip(mine, theirs):
            if a is None or m is None:
                continue
            src = m._data
            if _backend.is_cupy_array(a._data) != _backend.is_cupy_array(src):
                xp = _backend.array_module(a._data)
                src = xp.asarray(_backend.to_numpy(src)) if xp is np else xp.asarray(src)
            cur = Tensor._wrap(src)
            if n == 0:
                a._data[...] = src
                _autograd.bump_version(a)
            pairs.append((a, cur))
        if n > 0:
            with _autograd.no_grad():
                if self.multi_avg_fn is not None:
                    self.multi_avg_fn([a for a, _ in pairs], [c for _, c in pairs],
                                      self.n_averaged)
                else:
                    fn = self.avg_fn if self.avg_fn is not None else get_swa_avg_fn()
                    for a, c in pairs:
                        out = fn(Tensor._wrap(a._data), c, self.n_averaged)
                        a._data[...] = out._data if isinstance(out, Tensor) else out
                        _autograd.bump_version(a)
        if not self.use_buffers:
            for b, mb in zip(self.module.buffers(), model.buffers()):
                if b is not None and mb is not None:
                    b._data[...] = _backend.to_numpy(mb._data) if isinstance(b._data, np.ndarray) \
                        else mb._data
        self.n_averaged._data += 1


def update_bn(loader: Iterable[Any], model: Module, device: Any = None) -> None:
    """Recompute every batch norm's running statistics with one pass over ``loader``.

    The statistics are reset and then averaged over all batches with equal weights (the
    momentum is set to None for the pass and restored after); the model's train/eval mode is
    restored too.

    Args:
        loader: batches: Tensors, or lists/tuples whose first element is the input.
        model: the model (e.g. an :class:`AveragedModel`).
        device: move each batch there first (default: leave it).

    Example:
        >>> import mpitensor as mt
        >>> net = mt.nn.Sequential(mt.nn.Linear(2, 2), mt.nn.BatchNorm1d(2))
        >>> update_bn([mt.ones(4, 2)], net)
        >>> int(net[1].num_batches_tracked)
        1
    """
    momenta = {}
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            module.reset_running_stats()
            momenta[module] = module.momentum
    if not momenta:
        return
    was_training = model.training
    model.train()
    for module in momenta:
        module.momentum = None
    try:
        for batch in loader:
            if isinstance(batch, (list, tuple)):
                batch = batch[0]
            if device is not None:
                batch = batch.to(device)
            model(batch)
    finally:
        for module, momentum in momenta.items():
            module.momentum = momentum
        model.train(was_training)


class SWALR(LRScheduler):
    """Anneal every group's learning rate to ``swa_lr`` over ``anneal_epochs``, then hold it.

    Args:
        optimizer: the optimiser.
        swa_lr: the final rate, or one per group (stored in each group as ``"swa_lr"``).
        anneal_epochs: epochs of the annealing (an int >= 0, default 10).
        anneal_strategy: ``"cos"`` (default) or ``"linear"``.
        last_epoch: the last epoch index when resuming (default -1).

    Raises:
        ValueError: an unknown strategy, a negative or non-int ``anneal_epochs``, or a list
            of rates of the wrong length.

    Example:
        >>> import mpitensor as mt
        >>> from mpitensor.optim import SGD
        >>> opt = SGD([mt.zeros(1, requires_grad=True)], lr=1.0)
        >>> s = SWALR(opt, swa_lr=0.1, anneal_epochs=2, anneal_strategy="linear")
        >>> [round((s.step(), s.get_last_lr()[0])[1], 6) for _ in range(3)]
        [0.55, 0.1, 0.1]
    """

    def __init__(self, optimizer: Optimizer, swa_lr: Union[float, List[float]],
                 anneal_epochs: int = 10, anneal_strategy: str = "cos",
                 last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        rates = _per_group("SWALR", "swa_lr", optimizer, swa_lr)
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"SWALR: anneal_strategy must be 'cos' or 'linear', got "
                             f"{anneal_strategy!r}")
        if isinstance(anneal_epochs, bool) or not isinstance(anneal_epochs, int) \
                or anneal_epochs < 0:
            raise ValueError(f"SWALR: anneal_epochs must be an int >= 0, got {anneal_epochs!r}")
        for group, rate in zip(optimizer.param_groups, rates):
            group["swa_lr"] = rate
        self._anneal_strategy = anneal_strategy
        self.anneal_epochs = anneal_epochs
        super().__init__(optimizer, last_epoch)

    def _anneal(self, t: float) -> float:
        if self._anneal_strategy == "cos":
            return (1 - math.cos(math.pi * t)) / 2
        return t

    @staticmethod
    def _start_rate(lr: float, swa_lr: float, alpha: float) -> float:
        """The rate annealing started from, given the rate ``lr`` reached at weight ``alpha``."""
        if alpha == 1:
            return swa_lr
        return (lr - alpha * swa_lr) / (1 - alpha)

    def get_lr(self) -> List[float]:
        """Return the next rates, annealed from the current ones toward ``swa_lr``."""
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        span = max(1, self.anneal_epochs)
        prev_alpha = self._anneal(max(0, min(1, (step - 1) / span)))
        groups = self.optimizer.param_groups
        starts = [self._start_rate(g["lr"], g["swa_lr"], prev_alpha) for g in groups]
        alpha = self._anneal(max(0, min(1, step / span)))
        return [g["swa_lr"] * alpha + lr * (1 - alpha) for g, lr in zip(groups, starts)]
