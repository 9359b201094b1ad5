"""``RMSprop``: steps scaled by a running root-mean-square of the gradients.

The update is ``torch.optim.RMSprop``'s, per parameter::

    g = -grad if maximize else grad
    if weight_decay != 0:  g = g + weight_decay * p
    s = alpha * s + (1 - alpha) * g * g                'square_avg'
    if centered:
        a = lerp(a, g, 1 - alpha)                      'grad_avg'
        avg = sqrt(s - a * a) + eps
    else:
        avg = sqrt(s) + eps
    if momentum > 0:
        b = momentum * b + g / avg                     'momentum_buffer'
        p = p - lr * b
    else:
        p = p - lr * g / avg

on the raw arrays in place (NumPy or CuPy), with one or two scratch arrays per parameter.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from mpitensor import backend as _backend

from . import _adaptive as _a

__all__ = ["RMSprop"]


class RMSprop(_a.AdaptiveOptimizer):
    """RMSprop (Hinton's lecture notes; centred form after Graves), as ``torch.optim.RMSprop``.

    Per-parameter state (torch's keys): ``step`` (a 0-d float Tensor), ``square_avg``, plus
    ``momentum_buffer`` when ``momentum > 0`` and ``grad_avg`` when ``centered``.

    Args:
        params: Tensors to optimise, or dicts defining parameter groups.
        lr: learning rate (default 1e-2).
        alpha: smoothing constant of the running averages (default 0.99).
        eps: added to the denominator (default 1e-8).
        weight_decay: L2 penalty added to the gradient (default 0).
        momentum: momentum factor (default 0).
        centered: normalise by an estimate of the gradient's variance instead of its second
            moment (default False).
        capturable: accepted for torch compatibility (CUDA-graph capture).
        foreach: accepted for torch compatibility; each parameter is one in-place pass.
        maximize: maximise the objective instead of minimising it.
        differentiable: must be False (the step is not recorded by autograd).

    Raises:
        ValueError: ``lr``, ``eps``, ``momentum``, ``weight_decay`` or ``alpha`` is negative or
            NaN, or ``differentiable`` is True.
        TypeError: a hyper-parameter is not a number.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([1.0], requires_grad=True)
        >>> opt = RMSprop([w], lr=0.1, alpha=0.0, eps=0.0)
        >>> w.grad = mt.tensor([3.0])
        >>> opt.step()
        >>> w  # alpha=0: avg = |g|, so the step is lr * sign(g)
        tensor([0.9000], requires_grad=True)
    """

    _checks = {"lr": _a.nonneg, "eps": _a.nonneg, "momentum": _a.nonneg,
               "weight_decay": _a.nonneg, "alpha": _a.nonneg,
               "differentiable": _a.not_differentiable}
    _settings = _a.Settings("lr", "alpha", "eps", "weight_decay", "momentum", "centered",
                            "maximize")

    def __init__(self, params: Any, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False,
                 capturable: bool = False, foreach: Optional[bool] = None, maximize: bool = False,
                 differentiable: bool = False) -> None:
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=bool(centered),
                        weight_decay=weight_decay, capturable=bool(capturable), foreach=foreach,
                        maximize=bool(maximize), differentiable=differentiable)
        super().__init__(params, defaults)

    def _update(self, param: Any, grad: Any, state: Dict[str, Any], s: Any) -> None:
        if not state:
            state["step"] = _a.new_step()
            state["square_avg"] = _a.zeros_state(param)
            if s.momentum > 0:
                state["momentum_buffer"] = _a.zeros_state(param)
            if s.centered:
                state["grad_avg"] = _a.zeros_state(param)
        _a.advance_step(state)
        xp = _backend.array_module(param)
        sq = _a.real(_a.state_array(state, "square_avg", param))
        p, g = _a.real(param), _a.real(grad)
        d, _ = _a.direction(p, g, s.weight_decay, s.maximize)

        avg = _a.scratch(p)
        sq *= s.alpha
        _a.add_square_(sq, d, 1.0 - s.alpha, avg)
        if s.centered:
            ga = _a.real(_a.state_array(state, "grad_avg", param))
            _a.lerp_(ga, d, 1.0 - s.alpha, avg)
            xp.multiply(ga, ga, out=avg)
            xp.subtract(sq, avg, out=avg)
            xp.sqrt(avg, out=avg)
        else:
            xp.sqrt(sq, out=avg)
        avg += s.eps
        if s.momentum > 0:
            buf = _a.real(_a.state_array(state, "momentum_buffer", param))
            buf *= s.momentum
            xp.divide(d, avg, out=avg)
            buf += avg
            xp.multiply(buf, -s.lr, out=avg)
        else:
            xp.divide(d, avg, out=avg)
            avg *= -s.lr
        p += avg
