"""``Adagrad``: per-coordinate step sizes from the sum of all squared gradients so far.

The update is ``torch.optim.Adagrad``'s, per parameter::

    t += 1
    g = -grad if maximize else grad
    if weight_decay != 0:  g = g + weight_decay * p
    clr = lr / (1 + (t - 1) * lr_decay)
    s = s + g * g                                      'sum', from initial_accumulator_value
    p = p - clr * g / (sqrt(s) + eps)

on the raw arrays in place (NumPy or CuPy), with one or two scratch arrays per parameter. As in
torch, every parameter's state exists from construction on (a fresh optimiser's state dict
already lists them).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from mpitensor import backend as _backend

from . import _adaptive as _a

__all__ = ["Adagrad"]


class Adagrad(_a.AdaptiveOptimizer):
    """Adagrad (Duchi, Hazan & Singer), as ``torch.optim.Adagrad``.

    Per-parameter state (torch's keys): ``step`` (a 0-d float Tensor) and ``sum``.

    Args:
        params: Tensors to optimise, or dicts defining parameter groups.
        lr: learning rate (default 1e-2).
        lr_decay: the rate at step ``t`` is ``lr / (1 + (t - 1) * lr_decay)`` (default 0).
        weight_decay: L2 penalty added to the gradient (default 0).
        initial_accumulator_value: starting value of ``sum`` (default 0). As in torch, the
            optimiser-wide value is used for every group.
        eps: added to the denominator (default 1e-10).
        foreach: accepted for torch compatibility; each parameter is one in-place pass.
        maximize: maximise the objective instead of minimising it.
        differentiable: must be False (the step is not recorded by autograd).
        fused: accepted for torch compatibility; the update is in-place array operations.

    Raises:
        ValueError: ``lr``, ``lr_decay``, ``weight_decay``, ``initial_accumulator_value`` or
            ``eps`` is negative or NaN, or ``differentiable`` is True.
        TypeError: a hyper-parameter is not a number.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([1.0], requires_grad=True)
        >>> opt = Adagrad([w], lr=0.5)
        >>> for _ in range(2):  # one gradient twice: the sum of squares grows, the step shrinks
        ...     w.grad = mt.tensor([4.0])
        ...     opt.step()
        >>> opt.state[w]["sum"], w  # 1 - 0.5 * 4 / sqrt(16) - 0.5 * 4 / sqrt(32)
        (tensor([32.]), tensor([0.1464], requires_grad=True))
    """

    _checks = {"lr": _a.nonneg, "lr_decay": _a.nonneg, "weight_decay": _a.nonneg,
               "initial_accumulator_value": _a.nonneg, "eps": _a.nonneg,
               "differentiable": _a.not_differentiable}
    _settings = _a.Settings("lr", "lr_decay", "eps", "weight_decay", "maximize")

    def __init__(self, params: Any, lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10,
                 foreach: Optional[bool] = None, *, maximize: bool = False,
                 differentiable: bool = False, fused: Optional[bool] = None) -> None:
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach,
                        maximize=bool(maximize), differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self._init_state(p._data, self.state[p])

    def _init_state(self, param: Any, state: Dict[str, Any]) -> None:
        state["step"] = _a.new_step()
        state["sum"] = _a.zeros_state(param, float(self.defaults["initial_accumulator_value"]))

    def _update(self, param: Any, grad: Any, state: Dict[str, Any], s: Any) -> None:
        if not state:  # a group added after construction
            self._init_state(param, state)
        step = _a.advance_step(state)
        xp = _backend.array_module(param)
        acc = _a.real(_a.state_array(state, "sum", param,
                                     float(self.defaults["initial_accumulator_value"])))
        p, g = _a.real(param), _a.real(grad)
        d, _ = _a.direction(p, g, s.weight_decay, s.maximize)

        clr = s.lr / (1 + (step - 1) * s.lr_decay)
        std = _a.scratch(p)
        _a.add_square_(acc, d, 1.0, std)
        xp.sqrt(acc, out=std)
        std += s.eps
        xp.divide(d, std, out=std)
        std *= -clr
        p += std
