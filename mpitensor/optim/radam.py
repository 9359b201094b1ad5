"""``RAdam``: Adam whose adaptive step is switched on only once its variance is tractable.

The update is ``torch.optim.RAdam``'s (Liu et al., 2019), per parameter::

    t += 1
    g = -grad if maximize else grad
    if weight_decay != 0:
        p = p * (1 - lr * weight_decay)            decoupled_weight_decay
        g = g + weight_decay * p                   otherwise (L2)
    m = lerp(m, g, 1 - beta1)                      'exp_avg'
    v = beta2 * v + (1 - beta2) * g * g            'exp_avg_sq'
    m_hat = m / (1 - beta1**t)
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 t beta2**t / (1 - beta2**t)
    if rho_t > 5:
        r = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))
        p = p - m_hat * lr * (sqrt(1 - beta2**t) / (sqrt(v) + eps)) * r
    else:
        p = p - m_hat * lr                         (plain momentum SGD in the first steps)
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from . import _adaptive as _a

__all__ = ["RAdam"]


class RAdam(_a.AdaptiveOptimizer):
    """Rectified Adam, optionally with decoupled weight decay, as ``torch.optim.RAdam``.

    Per-parameter state (torch's keys): ``step`` (a 0-d float Tensor), ``exp_avg`` and
    ``exp_avg_sq``.

    Args:
        params, lr, betas, eps, weight_decay: as in :class:`~mpitensor.optim.Adam` (same
            defaults).
        decoupled_weight_decay: shrink the weights directly (as AdamW) instead of adding an L2
            term to the gradient (default False).
        foreach, capturable, maximize, differentiable: as in :class:`~mpitensor.optim.Adam`.

    Raises:
        ValueError: as :class:`~mpitensor.optim.Adam`, whose checks it shares.
        TypeError: a hyper-parameter is not a number.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([1.0], requires_grad=True)
        >>> opt = RAdam([w], lr=0.1)
        >>> path = []
        >>> for _ in range(6):
        ...     w.grad = mt.tensor([2.0])
        ...     opt.step()
        ...     path.append(round(w.item(), 4))
        >>> path  # five momentum steps of lr (too early for the variance term), then rectified
        [0.8, 0.6, 0.4, 0.2, 0.0, -0.0026]
    """

    _checks = _a.ADAM_CHECKS
    _settings = _a.Settings("lr", "betas", "eps", "weight_decay", "decoupled_weight_decay",
                            "maximize")

    def __init__(self, params: Any, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, decoupled_weight_decay: bool = False,
                 *, foreach: Optional[bool] = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        maximize=bool(maximize), foreach=foreach, capturable=bool(capturable),
                        decoupled_weight_decay=bool(decoupled_weight_decay),
                        differentiable=differentiable)
        super().__init__(params, defaults)

    def _update(self, param: Any, grad: Any, state: Dict[str, Any], s: Any) -> None:
        step, (m, v) = _a.start_step(state, param, "exp_avg", "exp_avg_sq")
        xp, p, g = _a.real_arrays(param, grad)
        d = _a.decayed_direction(p, g, s.lr, s.weight_decay, s.decoupled, s.maximize)
        t = _a.scratch(p)
        _a.adam_moments(m, v, d, s.beta1, s.beta2, t)
        del d
        bc1 = 1.0 - s.beta1 ** step
        bc2 = 1.0 - s.beta2 ** step
        rho_inf = 2.0 / (1.0 - s.beta2) - 1.0
        rho_t = rho_inf - 2.0 * step * (s.beta2 ** step) / bc2
        u = _a.scratch(p)
        xp.divide(m, bc1, out=u)  # the bias-corrected first moment
        u *= s.lr
        if rho_t > 5.0:
            rect = ((rho_t - 4.0) * (rho_t - 2.0) * rho_inf
                    / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t)) ** 0.5
            xp.sqrt(v, out=t)
            t += s.eps
            xp.divide(bc2 ** 0.5, t, out=t)
            u *= t
            u *= rect
        p -= u
