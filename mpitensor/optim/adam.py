"""``Adam`` and ``AdamW``: adaptive moment estimation, with L2 or decoupled weight decay.

The update is ``torch.optim.Adam``'s (the single-tensor form torch runs on CPU), per parameter::

    t += 1
    g = -grad if maximize else grad
    if weight_decay != 0:
        p = p * (1 - lr * weight_decay)      decoupled (AdamW)
        g = g + weight_decay * p             otherwise (L2, Adam)
    m = lerp(m, g, 1 - beta1)                first moment, 'exp_avg'
    v = beta2 * v + (1 - beta2) * g * g      second moment, 'exp_avg_sq'
    v_hat = max(v_max, v) if amsgrad else v  'max_exp_avg_sq' keeps the running maximum
    p = p - lr / (1 - beta1**t) * m / (sqrt(v_hat) / sqrt(1 - beta2**t) + eps)

on the raw arrays in place, with one or two scratch arrays per parameter (recycled between
steps on NumPy), on whichever array module (NumPy or CuPy) holds the parameter.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from . import _adaptive as _a

__all__ = ["Adam", "AdamW"]


class Adam(_a.AdaptiveOptimizer):
    """Adam (Kingma & Ba), optionally AMSGrad, as ``torch.optim.Adam``.

    Per-parameter state (torch's keys): ``step`` (a 0-d float Tensor), ``exp_avg``,
    ``exp_avg_sq`` and, with ``amsgrad``, ``max_exp_avg_sq``.

    Args:
        params: Tensors to optimise, or dicts defining parameter groups.
        lr: learning rate (default 1e-3).
        betas: decay rates ``(beta1, beta2)`` of the first and second moment (default
            (0.9, 0.999)).
        eps: added to the denominator for numerical stability (default 1e-8).
        weight_decay: weight decay factor (default 0); an L2 term added to the gradient, or,
            with ``decoupled_weight_decay``, a shrinking of the weights (AdamW).
        amsgrad: normalise by the running maximum of the second moment (default False).
        foreach: accepted for torch compatibility; each parameter is one in-place pass.
        maximize: maximise the objective instead of minimising it.
        capturable: accepted for torch compatibility (CUDA-graph capture); the step counter
            stays a host Tensor either way.
        differentiable: must be False (the step is not recorded by autograd).
        fused: accepted for torch compatibility; the update is in-place array operations.
        decoupled_weight_decay: apply weight decay to the weights directly (AdamW).

    Raises:
        ValueError: ``lr``, ``eps`` or ``weight_decay`` is negative or NaN, a beta is outside
            [0, 1), ``betas`` is not a pair, or ``differentiable`` is True.
        TypeError: a hyper-parameter is not a number.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([1.0, -2.0], requires_grad=True)
        >>> opt = Adam([w], lr=0.1)
        >>> w.grad = mt.tensor([0.5, -3.0])
        >>> opt.step()
        >>> w  # the first step moves each weight by about lr against its gradient's sign
        tensor([ 0.9000, -1.9000], requires_grad=True)
    """

    _checks = _a.ADAM_CHECKS
    _settings = _a.Settings("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize",
                            "decoupled_weight_decay")

    def __init__(self, params: Any, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, amsgrad: bool = False, *,
                 foreach: Optional[bool] = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused: Optional[bool] = None,
                 decoupled_weight_decay: bool = False) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        amsgrad=bool(amsgrad), maximize=bool(maximize), foreach=foreach,
                        capturable=bool(capturable), differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=bool(decoupled_weight_decay))
        super().__init__(params, defaults)

    def _update(self, param: Any, grad: Any, state: Dict[str, Any], s: Any) -> None:
        step, (m, v) = _a.start_step(state, param, "exp_avg", "exp_avg_sq")
        if s.amsgrad:  # made here on the first step, after the moments (torch's layout)
            vmax = _a.real(_a.state_array(state, "max_exp_avg_sq", param))
        xp, p, g = _a.real_arrays(param, grad)

        d = _a.decayed_direction(p, g, s.lr, s.weight_decay, s.decoupled, s.maximize)
        t = _a.scratch(p)
        _a.adam_moments(m, v, d, s.beta1, s.beta2, t)
        del d  # a scratch buffer: hand it back before the next one is taken

        step_size = s.lr / (1.0 - s.beta1 ** step)
        root_bc2 = (1.0 - s.beta2 ** step) ** 0.5
        if s.amsgrad:
            xp.maximum(vmax, v, out=vmax)
            v = vmax
        xp.sqrt(v, out=t)
        t /= root_bc2
        t += s.eps
        xp.divide(m, t, out=t)
        t *= -step_size
        p += t


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as ``torch.optim.AdamW``.

    The same as ``Adam(..., decoupled_weight_decay=True)``, with a default ``weight_decay`` of
    1e-2: the weights shrink by ``lr * weight_decay`` of themselves each step, outside the
    moment estimates.

    Args:
        params: Tensors to optimise, or dicts defining parameter groups.
        lr: learning rate (default 1e-3).
        betas: ``(beta1, beta2)`` (default (0.9, 0.999)).
        eps: denominator term (default 1e-8).
        weight_decay: decoupled weight decay factor (default 1e-2).
        amsgrad: use the running maximum of the second moment (default False).
        maximize, foreach, capturable, differentiable, fused: as in :class:`Adam`.

    Raises:
        ValueError: as :class:`Adam`.
        TypeError: a hyper-parameter is not a number.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([1.0], requires_grad=True)
        >>> opt = AdamW([w], lr=0.1, weight_decay=0.5)
        >>> w.grad = mt.tensor([0.0])
        >>> opt.step()
        >>> w  # no gradient: only the decay, 1 - 0.1 * 0.5
        tensor([0.9500], requires_grad=True)
    """

    def __init__(self, params: Any, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: Optional[bool] = None, capturable: bool = False,
                 differentiable: bool = False, fused: Optional[bool] = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore a state dict; the weight decay stays decoupled whatever the dict says.

        Args:
            state_dict: as returned by :meth:`state_dict` (of an Adam or AdamW).

        Raises:
            ValueError: the state dict does not fit these parameters (see
                :meth:`Optimizer.load_state_dict`).
        """
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True
