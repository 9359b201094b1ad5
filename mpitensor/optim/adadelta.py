"""``Adadelta``: per-coordinate step sizes from running averages of squared gradients and updates.

The update is ``torch.optim.Adadelta``'s, per parameter::

    g = -grad if maximize else grad
    if weight_decay != 0:  g = g + weight_decay * p
    s = rho * s + (1 - rho) * g * g                    'square_avg'
    delta = sqrt(a + eps) / sqrt(s + eps) * g
    a = rho * a + (1 - rho) * delta * delta            'acc_delta'
    p = p - lr * delta

on the raw arrays in place (NumPy or CuPy), with two scratch arrays per parameter.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from . import _adaptive as _a

__all__ = ["Adadelta"]


class Adadelta(_a.AdaptiveOptimizer):
    """Adadelta (Zeiler, 2012), as ``torch.optim.Adadelta``.

    Per-parameter state (torch's keys): ``step`` (a 0-d float Tensor), ``square_avg`` and
    ``acc_delta``.

    Args:
        params: Tensors to optimise, or dicts defining parameter groups.
        lr: factor applied to the computed update (default 1.0).
        rho: decay rate of both running averages (default 0.9).
        eps: added inside the square roots (default 1e-6).
        weight_decay: L2 penalty added to the gradient (default 0).
        foreach: accepted for torch compatibility; each parameter is one in-place pass.
        capturable: accepted for torch compatibility (CUDA-graph capture).
        maximize: maximise the objective instead of minimising it.
        differentiable: must be False (the step is not recorded by autograd).

    Raises:
        ValueError: ``lr``, ``eps`` or ``weight_decay`` is negative or NaN, ``rho`` is outside
            [0, 1], or ``differentiable`` is True.
        TypeError: a hyper-parameter is not a number.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([1.0, 1.0], requires_grad=True)
        >>> opt = Adadelta([w])  # lr=1.0, rho=0.9, eps=1e-6
        >>> w.grad = mt.tensor([1.0, 100.0])
        >>> opt.step()
        >>> 1 - w.detach()  # the step is unit-free: a 100 times larger gradient moves as far
        tensor([0.0032, 0.0032])
    """

    _checks = {"lr": _a.nonneg, "rho": _a.unit_closed, "eps": _a.nonneg,
               "weight_decay": _a.nonneg, "differentiable": _a.not_differentiable}
    _settings = _a.Settings("lr", "rho", "eps", "weight_decay", "maximize")

    def __init__(self, params: Any, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0, foreach: Optional[bool] = None, *,
                 capturable: bool = False, maximize: bool = False,
                 differentiable: bool = False) -> None:
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                        maximize=bool(maximize), capturable=bool(capturable), foreach=foreach,
                        differentiable=differentiable)
        super().__init__(params, defaults)

    def _update(self, param: Any, grad: Any, state: Dict[str, Any], s: Any) -> None:
        _, (sq, acc) = _a.start_step(state, param, "square_avg", "acc_delta")
        xp, p, g = _a.real_arrays(param, grad)
        d, _ = _a.direction(p, g, s.weight_decay, s.maximize)

        std = _a.scratch(p)
        sq *= s.rho
        _a.add_square_(sq, d, 1.0 - s.rho, std)
        xp.add(sq, s.eps, out=std)
        xp.sqrt(std, out=std)
        delta = _a.scratch(p)
        xp.add(acc, s.eps, out=delta)
        xp.sqrt(delta, out=delta)
        delta /= std
        delta *= d
        acc *= s.rho
        _a.add_square_(acc, delta, 1.0 - s.rho, std)
        delta *= -s.lr
        p += delta
