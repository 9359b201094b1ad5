"""``Muon``: momentum orthogonalised by Newton-Schulz iterations, for 2-D weights.

The update is ``torch.optim.Muon``'s documented algorithm, per parameter::

    B = lerp(B, g, 1 - momentum)                         'momentum_buffer'
    U = lerp(g, B, momentum) if nesterov else B
    O = NS_k(U)                                          k = ns_steps, in bfloat16
    p = p * (1 - lr * weight_decay)
    p = p - adjusted_lr * O

``NS_k`` runs ``k`` Newton-Schulz steps on ``X = U / max(|U|_F, eps)`` (on the transpose when
``U`` has more rows than columns): ``A = X X^T``, ``B = b A + c A A``, ``X = a X + B X``, with
``(a, b, c) = ns_coefficients``. torch computes it in bfloat16 (each product accumulated in
float32 and rounded once), and so does this: float32 arithmetic rounded to bfloat16 after every
operation (the rounding is done on the bits, so it is the same on NumPy and CuPy; a product
summed in another order by the BLAS can still land on the neighbouring bfloat16 now and then).
``adjusted_lr`` is ``lr * sqrt(max(1, rows / cols))`` ("original", Keller Jordan's) or
``0.2 * lr * sqrt(max(rows, cols))`` ("match_rms_adamw", Moonshot's).
"""

from __future__ import annotations

import math
from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np

from mpitensor import backend as _backend
from mpitensor.tensor import Tensor

from . import _adaptive as _a

__all__ = ["Muon"]

_ADJUST = (None, "original", "match_rms_adamw")


class _Settings(NamedTuple):
    lr: float
    weight_decay: float
    momentum: float
    nesterov: bool
    coefficients: Tuple[float, float, float]
    eps: float
    ns_steps: int
    adjust_lr_fn: Optional[str]


def _adjust_fn(owner: str, name: str, value: Any) -> None:
    if value not in _ADJUST:
        raise ValueError(f"{owner}: adjust_lr_fn must be None, 'original' or 'match_rms_adamw', "
                         f"got {value!r}")


def _bf16(x: Any) -> Any:
    """Round a float32 array to the nearest bfloat16 (ties to even), in place; returns it."""
    xp = _backend.array_module(x)
    bits = x.view(xp.uint32)
    finite = xp.isfinite(x)
    bits += (xp.uint32(0x7FFF) + ((bits >> 16) & xp.uint32(1))) * finite
    bits &= xp.uint32(0xFFFF0000)
    return x


def _orthogonalise(u: Any, coefficients: Tuple[float, float, float], steps: int,
                   eps: float) -> Any:
    """The Newton-Schulz iteration of the module's text, in bfloat16 arithmetic (float32 out)."""
    xp = _backend.array_module(u)
    a, b, c = (np.float32(v) for v in coefficients)
    x = _bf16(u.astype(xp.float32, copy=True))
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = xp.ascontiguousarray(x.T)
    norm = _bf16(xp.sqrt(xp.sum(x * x, dtype=xp.float32)).reshape(1))
    x = _bf16(x / xp.maximum(norm, np.float32(eps)))
    for _ in range(steps):
        gram = _bf16(x @ x.T)
        poly = _bf16(b * gram + c * (gram @ gram))
        x = _bf16(a * x + poly @ x)
    return x.T if tall else x


class Muon(_a.AdaptiveOptimizer):
    """Muon (Keller Jordan, 2024), as ``torch.optim.Muon``: for the 2-D weights of hidden layers.

    Biases, embeddings and other parameters belong to another optimiser (AdamW, say). State
    (torch's key): ``momentum_buffer``.

    Args:
        params: 2-D Tensors to optimise, or dicts defining parameter groups.
        lr: learning rate (default 1e-3).
        weight_decay: decoupled weight decay (default 0.1).
        momentum: momentum factor (default 0.95).
        nesterov: use Nesterov momentum (default True).
        ns_coefficients: ``(a, b, c)`` of the Newton-Schulz polynomial (default
            (3.4445, -4.775, 2.0315)).
        eps: lower bound of the norm the update is divided by (default 1e-7).
        ns_steps: Newton-Schulz steps (default 5).
        adjust_lr_fn: None or "original" (Keller's scaling), or "match_rms_adamw".

    Raises:
        ValueError: a parameter that is not 2-D, ``lr``, ``weight_decay`` or ``momentum``
            negative or NaN, or an unknown ``adjust_lr_fn``.
        TypeError: a hyper-parameter is not a number.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.zeros(2, 2, requires_grad=True)
        >>> opt = Muon([w], lr=0.1, weight_decay=0.0)
        >>> w.grad = mt.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> opt.step()
        >>> sorted(opt.state[w])
        ['momentum_buffer']
    """

    _checks = {"lr": _a.nonneg, "weight_decay": _a.nonneg, "momentum": _a.nonneg,
               "adjust_lr_fn": _adjust_fn}

    def __init__(self, params: Any, lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: Tuple[float, float, float] = (3.4445, -4.775, 2.0315),
                 eps: float = 1e-7, ns_steps: int = 5, adjust_lr_fn: Optional[str] = None) -> None:
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                        nesterov=bool(nesterov), ns_coefficients=ns_coefficients, eps=eps,
                        ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Add a group of 2-D parameters, checked like the constructor's.

        Raises:
            ValueError: a parameter is not 2-D, or a hyper-parameter is out of range.
        """
        if isinstance(param_group, dict):
            params = param_group.get("params", [])
            for p in [params] if isinstance(params, Tensor) else list(params):
                if isinstance(p, Tensor) and p.ndim != 2:
                    raise ValueError(f"Muon: only 2-D parameters are supported, got one of "
                                     f"shape {tuple(p.shape)}; give the others to another "
                                     f"optimizer (AdamW, say)")
        super().add_param_group(param_group)

    def _group_settings(self, group: Dict[str, Any]) -> _Settings:
        a, b, c = group["ns_coefficients"]
        return _Settings(float(group["lr"]), float(group["weight_decay"]),
                         float(group["momentum"]), bool(group["nesterov"]),
                         (float(a), float(b), float(c)), float(group["eps"]),
                         int(group["ns_steps"]), group["adjust_lr_fn"])

    def _update(self, param: Any, grad: Any, state: Dict[str, Any], s: _Settings) -> None:
        if param.dtype.kind != "f":
            raise TypeError(f"Muon: parameters must be real floating point, got {param.dtype}")
        buf = _a.state_array(state, "momentum_buffer", param)
        t = _a.scratch(param)
        _a.lerp_(buf, grad, 1.0 - s.momentum, t)
        if s.nesterov:
            u = grad.copy()
            _a.lerp_(u, buf, s.momentum, t)
        else:
            u = buf
        ortho = _orthogonalise(u, s.coefficients, s.ns_steps, s.eps)
        rows, cols = param.shape[:2]
        if s.adjust_lr_fn == "match_rms_adamw":
            lr = 0.2 * math.sqrt(max(rows, cols)) * s.lr
        else:
            lr = s.lr * math.sqrt(max(1, rows / cols))
        param *= 1.0 - s.lr * s.weight_decay
        t[...] = ortho  # exact: bfloat16 values, now in the parameter's dtype
        t *= -lr
        param += t
