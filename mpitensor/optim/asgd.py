"""``ASGD``: averaged stochastic gradient descent (Polyak & Juditsky, 1992).

The update is ``torch.optim.ASGD``'s, per parameter::

    t += 1
    g = -grad if maximize else grad
    if weight_decay != 0:  g = g + weight_decay * p
    p = p * (1 - lambd * eta)
    p = p - eta * g
    ax = p if mu == 1 else ax + mu * (p - ax)      'ax', the running average of the iterates
    eta = lr / (1 + lambd * lr * t) ** alpha       'eta', a 0-d float Tensor
    mu = 1 / max(1, t - t0)                        'mu', a 0-d float Tensor

``eta`` and ``mu`` live, as in torch, in 0-d Tensors of the default float dtype (float32 unless
changed), so their rounding is torch's.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from mpitensor import backend as _backend
from mpitensor.tensor import Tensor

from . import _adaptive as _a

__all__ = ["ASGD"]


class ASGD(_a.AdaptiveOptimizer):
    """Averaged SGD, as ``torch.optim.ASGD``; the averaged weights are in ``state[p]["ax"]``.

    Per-parameter state (torch's keys): ``step``, ``eta`` and ``mu`` (0-d float Tensors) and
    ``ax``.

    Args:
        params: Tensors to optimise, or dicts defining parameter groups.
        lr: learning rate (default 1e-2).
        lambd: decay term (default 1e-4).
        alpha: power of the learning-rate decay (default 0.75).
        t0: the step at which averaging starts (default 1e6).
        weight_decay: L2 penalty added to the gradient (default 0).
        foreach, capturable: accepted for torch compatibility.
        maximize: maximise the objective instead of minimising it.
        differentiable: must be False (the step is not recorded by autograd).

    Raises:
        ValueError: ``lr`` or ``weight_decay`` is negative or NaN, or ``differentiable`` is
            True.
        TypeError: a hyper-parameter is not a number.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([1.0], requires_grad=True)
        >>> opt = ASGD([w], lr=0.1, lambd=0.0, t0=0)
        >>> for _ in range(3):
        ...     w.grad = mt.tensor([2.0])
        ...     opt.step()
        >>> w.detach(), opt.state[w]["ax"]  # ax averages the iterates 0.6 and 0.4
        (tensor([0.4000]), tensor([0.5000]))
    """

    _checks = {"lr": _a.nonneg, "weight_decay": _a.nonneg,
               "differentiable": _a.not_differentiable}
    _settings = _a.Settings("lr", "lambd", "alpha", "t0", "weight_decay", "maximize")

    def __init__(self, params: Any, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75,
                 t0: float = 1e6, weight_decay: float = 0, foreach: Optional[bool] = None,
                 maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False) -> None:
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay,
                        foreach=foreach, maximize=bool(maximize), differentiable=differentiable,
                        capturable=bool(capturable))
        super().__init__(params, defaults)

    def _update(self, param: Any, grad: Any, state: Dict[str, Any], s: Any) -> None:
        if not state:
            state["step"] = _a.new_step()
            state["eta"] = _scalar(s.lr)
            state["mu"] = _scalar(1.0)
            state["ax"] = _a.zeros_state(param)
        step = _a.advance_step(state)
        xp = _backend.array_module(param)
        ax = _a.real(_a.state_array(state, "ax", param))
        p, g = _a.real(param), _a.real(grad)
        d, owned = _a.direction(p, g, s.weight_decay, s.maximize)
        eta_t, mu_t = _scalar_state(state, "eta", s.lr), _scalar_state(state, "mu", 1.0)
        eta = float(eta_t)
        p *= 1.0 - s.lambd * eta
        if owned:
            d *= -eta
            p += d
        else:
            t = _a.scratch(p)
            xp.multiply(d, -eta, out=t)
            p += t
        mu = float(mu_t)
        if mu != 1.0:
            t = _a.scratch(p)
            xp.subtract(p, ax, out=t)
            t *= mu
            ax += t
        else:
            ax[...] = p
        # the new values are made in the default dtype and then stored, as torch makes them:
        # a counter cast to float64 by load_state_dict still receives float32-rounded values
        eta_t[...] = _scalar(s.lr / ((1.0 + s.lambd * s.lr * step) ** s.alpha))._data
        mu_t[...] = _scalar(1.0 / max(1.0, step - s.t0))._data


def _scalar(value: float) -> Tensor:
    """A 0-d host Tensor of the default float dtype holding ``value`` (rounded to it)."""
    t = _a.new_step()
    t._data[...] = value
    return t


def _scalar_state(state: Dict[str, Any], key: str, default: float) -> Any:
    """The raw 0-d array of ``state[key]``; a plain number from an old dict becomes a Tensor."""
    v = state.get(key)
    if not isinstance(v, Tensor):
        v = state[key] = _scalar(default if v is None else float(v))
    return v._data
