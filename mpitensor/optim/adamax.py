"""``Adamax``: Adam with the infinity norm in place of the second moment.

The update is ``torch.optim.Adamax``'s, per parameter::

    t += 1
    g = -grad if maximize else grad
    if weight_decay != 0:  g = g + weight_decay * p
    m = lerp(m, g, 1 - beta1)                      'exp_avg'
    u = max(beta2 * u, |g| + eps)                  'exp_inf'
    p = p - lr / (1 - beta1**t) * m / u

on the raw arrays in place (NumPy or CuPy), with one scratch array per parameter.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from . import _adaptive as _a

__all__ = ["Adamax"]


class Adamax(_a.AdaptiveOptimizer):
    """Adamax (Kingma & Ba, section 7), as ``torch.optim.Adamax``.

    Per-parameter state (torch's keys): ``step`` (a 0-d float Tensor), ``exp_avg`` and
    ``exp_inf`` (the exponentially weighted infinity norm).

    Args:
        params: Tensors to optimise, or dicts defining parameter groups.
        lr: learning rate (default 2e-3).
        betas: decay rates ``(beta1, beta2)`` of the first moment and the infinity norm
            (default (0.9, 0.999)).
        eps: added to ``|g|`` before the maximum (default 1e-8).
        weight_decay: L2 penalty added to the gradient (default 0).
        foreach, maximize, differentiable, capturable: as in :class:`~mpitensor.optim.Adam`.

    Raises:
        ValueError, TypeError: as :class:`~mpitensor.optim.Adam` (the same checks).

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([1.0], requires_grad=True)
        >>> opt = Adamax([w], lr=0.1)
        >>> for g in (4.0, 1.0):
        ...     w.grad = mt.tensor([g])
        ...     opt.step()
        >>> opt.state[w]["exp_inf"]  # the large first gradient, decayed once: 0.999 * 4
        tensor([3.9960])
    """

    _checks = _a.ADAM_CHECKS
    _settings = _a.Settings("lr", "betas", "eps", "weight_decay", "maximize")

    def __init__(self, params: Any, lr: float = 2e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, foreach: Optional[bool] = None, *,
                 maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      foreach=foreach, maximize=bool(maximize),
                                      differentiable=differentiable, capturable=bool(capturable)))

    def _update(self, param: Any, grad: Any, state: Dict[str, Any], s: Any) -> None:
        step, (m, u) = _a.start_step(state, param, "exp_avg", "exp_inf")
        xp, p, g = _a.real_arrays(param, grad)
        d, _ = _a.direction(p, g, s.weight_decay, s.maximize)
        t = _a.scratch(p)
        _a.lerp_(m, d, 1.0 - s.beta1, t)
        u *= s.beta2
        xp.abs(d, out=t)
        t += s.eps
        xp.maximum(u, t, out=u)
        del d
        xp.multiply(m, -(s.lr / (1.0 - s.beta1 ** step)), out=t)
        t /= u
        p += t
