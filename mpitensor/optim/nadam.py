"""``NAdam``: Adam with Nesterov momentum and a momentum schedule (Dozat, 2016).

The update is ``torch.optim.NAdam``'s, per parameter::

    t += 1
    g = -grad if maximize else grad
    if weight_decay != 0:
        p = p * (1 - lr * weight_decay)            decoupled_weight_decay
        g = g + weight_decay * p                   otherwise (L2)
    mu_t   = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))
    mu_t1  = beta1 * (1 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
    P = P * mu_t                                   'mu_product', a 0-d float Tensor
    m = lerp(m, g, 1 - beta1)                      'exp_avg'
    v = beta2 * v + (1 - beta2) * g * g            'exp_avg_sq'
    denom = sqrt(v / (1 - beta2**t)) + eps
    p = p - lr * (1 - mu_t) / (1 - P) * g / denom
    p = p - lr * mu_t1 / (1 - P * mu_t1) * m / denom

The running product ``P`` is kept, as torch keeps it, in a 0-d Tensor of the default float dtype
(float32 unless changed): its rounding is part of the update, so it is reproduced.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from mpitensor.tensor import Tensor

from . import _adaptive as _a

__all__ = ["NAdam"]


class NAdam(_a.AdaptiveOptimizer):
    """NAdam (Adam with Nesterov momentum), optionally with decoupled weight decay (NAdamW).

    Per-parameter state (torch's keys): ``step`` and ``mu_product`` (0-d float Tensors),
    ``exp_avg`` and ``exp_avg_sq``.

    Args:
        lr: learning rate (default 2e-3).
        params, betas, eps, weight_decay: as in :class:`~mpitensor.optim.Adam` (same defaults).
        momentum_decay: the ``psi`` of the momentum schedule (default 4e-3).
        decoupled_weight_decay: shrink the weights directly instead of adding an L2 term to
            the gradient (default False).
        foreach, capturable, maximize, differentiable: as in :class:`~mpitensor.optim.Adam`.

    Raises:
        ValueError: ``lr``, ``eps``, ``weight_decay`` or ``momentum_decay`` is negative or NaN,
            a beta is outside [0, 1), or ``differentiable`` is True.
        TypeError: a hyper-parameter is not a number.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([1.0], requires_grad=True)
        >>> opt = NAdam([w], lr=0.1)
        >>> w.grad = mt.tensor([2.0])
        >>> opt.step()
        >>> round(float(w), 4)  # torch.optim.NAdam gives the same
        0.8944
    """

    _checks = {"lr": _a.nonneg, "betas": _a.betas_pair, "eps": _a.nonneg,
               "weight_decay": _a.nonneg, "momentum_decay": _a.nonneg,
               "differentiable": _a.not_differentiable}
    _settings = _a.Settings("lr", "betas", "eps", "weight_decay", "momentum_decay",
                            "decoupled_weight_decay", "maximize")

    def __init__(self, params: Any, lr: float = 2e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, foreach: Optional[bool] = None,
                 maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        momentum_decay=momentum_decay,
                        decoupled_weight_decay=bool(decoupled_weight_decay),
                        maximize=bool(maximize), foreach=foreach, capturable=bool(capturable),
                        differentiable=differentiable)
        super().__init__(params, defaults)

    def _update(self, param: Any, grad: Any, state: Dict[str, Any], s: Any) -> None:
        if not state:  # torch's layout: the product of the momenta comes before the moments
            state["step"] = _a.new_step()
            mu_product = _a.new_step()
            mu_product._data[...] = 1.0
            state["mu_product"] = mu_product
        step, (m, v) = _a.start_step(state, param, "exp_avg", "exp_avg_sq")
        xp, p, g = _a.real_arrays(param, grad)
        d = _a.decayed_direction(p, g, s.lr, s.weight_decay, s.decoupled, s.maximize)
        mu = s.beta1 * (1.0 - 0.5 * 0.96 ** (step * s.momentum_decay))
        mu_next = s.beta1 * (1.0 - 0.5 * 0.96 ** ((step + 1) * s.momentum_decay))
        prod = _mu_product(state)
        prod *= mu  # in the counter's own dtype, as torch rounds it
        mu_prod = float(prod)
        t = _a.scratch(p)
        _a.adam_moments(m, v, d, s.beta1, s.beta2, t)
        denom = t
        xp.divide(v, 1.0 - s.beta2 ** step, out=denom)
        xp.sqrt(denom, out=denom)
        denom += s.eps
        u = _a.scratch(p)
        xp.multiply(d, -s.lr * (1.0 - mu) / (1.0 - mu_prod), out=u)
        u /= denom
        p += u
        del d
        xp.multiply(m, (-s.lr * mu_next) / (1.0 - mu_prod * mu_next), out=u)
        u /= denom
        p += u


def _mu_product(state: Dict[str, Any]) -> Any:
    """The raw 0-d array of ``state["mu_product"]``; a plain number from an old dict becomes one.

    After ``load_state_dict`` it is in the parameter's dtype and on its device, as torch casts it.
    """
    mp = state.get("mu_product")
    if not isinstance(mp, Tensor):
        value = 1.0 if mp is None else float(mp)
        mp = _a.new_step()
        mp._data[...] = value
        state["mu_product"] = mp
    return mp._data
