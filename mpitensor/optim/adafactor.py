"""``Adafactor``: adaptive steps from a factored second moment (Shazeer & Stern, 2018).

The update is ``torch.optim.Adafactor``'s documented algorithm, per parameter (``t`` counts
its steps; ``eps1`` defaults to the machine epsilon of the parameter's dtype)::

    g = -grad if maximize else grad
    beta2_t = 1 - t ** beta2_decay
    rho_t = min(lr, 1 / sqrt(t))
    alpha_t = max(eps2, RMS(p)) * rho_t                    RMS(x) = |x|_2 / sqrt(numel)
    p = p * (1 - lr * weight_decay)                        decoupled weight decay
    if p.dim() > 1 (factored over the last two axes):
        R = lerp(R, mean(g*g, last axis), 1 - beta2_t)     'row_var', shape (..., n, 1)
        C = lerp(C, mean(g*g, axis -2), 1 - beta2_t)       'col_var', shape (..., 1, m)
        V = R C / max(mean(R, axis -2), eps1)
    else:
        V = lerp(V, g*g, 1 - beta2_t)                      'variance'
    U = g / max(sqrt(V), eps1)
    p = p - alpha_t / max(1, RMS(U) / d) * U

The row and column statistics of a matrix take ``n + m`` numbers instead of ``n * m``: that is
the memory Adafactor saves.
"""

from __future__ import annotations

import math
from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np

from mpitensor import backend as _backend
from mpitensor.tensor import Tensor

from . import _adaptive as _a

__all__ = ["Adafactor"]


class _Settings(NamedTuple):
    lr: float
    beta2_decay: float
    eps1: Optional[float]
    eps2: float
    d: float
    weight_decay: float
    maximize: bool


def _nonpositive(owner: str, name: str, value: Any) -> None:
    if not _a._number(owner, name, value) <= 0.0:
        raise ValueError(f"{owner}: invalid {name} {value!r}; it must be a number <= 0")


def _eps_pair(owner: str, name: str, value: Any) -> None:
    _a.require_pair(owner, name, value, "(eps1 or None, eps2)")
    if value[0] is not None:
        _a.nonneg(owner, f"{name}[0] (eps1)", value[0])
    _a.nonneg(owner, f"{name}[1] (eps2)", value[1])


def _clip_threshold(owner: str, name: str, value: Any) -> None:
    if not _a._number(owner, name, value) >= 1.0:
        raise ValueError(f"{owner}: invalid {name} {value!r}; the clipping threshold must be "
                         f">= 1")


def _rms(xp: Any, x: Any) -> float:
    return float(xp.linalg.norm(x.reshape(-1))) / math.sqrt(max(x.size, 1))


class Adafactor(_a.AdaptiveOptimizer):
    """Adafactor, as ``torch.optim.Adafactor`` (real floating-point parameters).

    Per-parameter state (torch's keys): ``step`` (a 0-d float Tensor), and ``row_var`` and
    ``col_var`` for parameters of two or more dimensions, ``variance`` for the others.

    Args:
        params: Tensors to optimise, or dicts defining parameter groups.
        lr: the largest relative step size, and the weight decay's scale (default 1e-2).
        beta2_decay: the exponent of the second-moment decay ``1 - t ** beta2_decay``
            (default -0.8; must be <= 0).
        eps: ``(eps1, eps2)``: eps1 bounds the variance estimate from below (None: the dtype's
            machine epsilon), eps2 the parameter scale (default (None, 1e-3)).
        d: the update clipping threshold (default 1; must be >= 1).
        weight_decay: decoupled weight decay factor (default 0).
        foreach: accepted for torch compatibility.
        maximize: maximise the objective instead of minimising it.

    Raises:
        ValueError: a hyper-parameter is out of range or NaN.
        TypeError: a hyper-parameter is not a number; at ``step()``, a parameter that is not
            real floating point.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
        >>> opt = Adafactor([w], lr=0.01)
        >>> w.grad = mt.tensor([[0.1, -0.2], [0.3, 0.4]])
        >>> opt.step()
        >>> sorted(opt.state[w])
        ['col_var', 'row_var', 'step']
    """

    _checks = {"lr": _a.nonneg, "beta2_decay": _nonpositive, "eps": _eps_pair,
               "d": _clip_threshold, "weight_decay": _a.nonneg}

    def __init__(self, params: Any, lr: float = 1e-2, beta2_decay: float = -0.8,
                 eps: Tuple[Optional[float], float] = (None, 1e-3), d: float = 1.0,
                 weight_decay: float = 0.0, *, foreach: Optional[bool] = None,
                 maximize: bool = False) -> None:
        defaults = dict(lr=lr, beta2_decay=beta2_decay, eps=eps, d=d,
                        weight_decay=weight_decay, foreach=foreach, maximize=bool(maximize))
        super().__init__(params, defaults)

    def _group_settings(self, group: Dict[str, Any]) -> _Settings:
        eps1, eps2 = group["eps"]
        return _Settings(float(group["lr"]), float(group["beta2_decay"]),
                         None if eps1 is None else float(eps1), float(eps2), float(group["d"]),
                         float(group["weight_decay"]), bool(group["maximize"]))

    def _update(self, param: Any, grad: Any, state: Dict[str, Any], s: _Settings) -> None:
        if param.dtype.kind != "f":
            raise TypeError(f"Adafactor: parameters must be real floating point, got "
                            f"{param.dtype}")
        xp = _backend.array_module(param)
        factored = param.ndim > 1
        if not state:
            state["step"] = _a.new_step()
            if factored:
                state["row_var"] = Tensor._wrap(xp.zeros(param.shape[:-1] + (1,),
                                                             param.dtype))
                state["col_var"] = Tensor._wrap(xp.zeros(param.shape[:-2] + (1,)
                                                             + param.shape[-1:], param.dtype))
            else:
                state["variance"] = _a.zeros_state(param)
        step = _a.advance_step(state)
        eps1 = s.eps1 if s.eps1 is not None else float(np.finfo(param.dtype).eps)
        g = -grad if s.maximize else grad
        beta2 = 1.0 - step ** s.beta2_decay
        rho = min(s.lr, 1.0 / math.sqrt(step))
        alpha = max(s.eps2, _rms(xp, param)) * rho
        if s.weight_decay != 0:
            param *= 1.0 - s.lr * s.weight_decay
        sq = g * g
        if factored:
            row = state["row_var"]._data
            col = state["col_var"]._data
            _a.lerp_(row, sq.mean(axis=-1, keepdims=True), 1.0 - beta2, xp.empty_like(row))
            _a.lerp_(col, sq.mean(axis=-2, keepdims=True), 1.0 - beta2, xp.empty_like(col))
            var = xp.matmul(row, col)
            var /= xp.maximum(row.mean(axis=-2, keepdims=True), eps1)
        else:
            v = state["variance"]._data
            _a.lerp_(v, sq, 1.0 - beta2, xp.empty_like(v))
            var = v.copy()
        xp.maximum(var, eps1 * eps1, out=var)
        xp.sqrt(var, out=var)
        update = xp.divide(g, var, out=var)
        scale = -alpha / max(1.0, _rms(xp, update) / s.d)
        update *= scale
        param += update
