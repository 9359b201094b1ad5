"""``SparseAdam``: the lazy Adam of ``torch.optim.SparseAdam``.

torch's SparseAdam takes sparse gradients (``nn.Embedding(sparse=True)``) and updates only the
entries a gradient holds: their moments and their weights; every other entry, moments included,
is left as it is. A sparse gradient here (from ``nn.Embedding(sparse=True)``, or set by hand)
holds the entries it lists, as in torch. A dense gradient is also taken: the entries it "holds"
are its **nonzero** entries, the ones ``grad.to_sparse()`` would keep in torch. Either way the
update is torch's, element for element::

    t += 1                                         'step', a Python int as torch keeps it
    for each entry i with g_i != 0  (g = -grad if maximize):
        m_i = m_i + (g_i - m_i) * (1 - beta1)      'exp_avg'
        v_i = v_i + (g_i**2 - v_i) * (1 - beta2)   'exp_avg_sq'
        p_i = p_i - lr * sqrt(1 - beta2**t) / (1 - beta1**t) * m_i / (sqrt(v_i) + eps)

Where it differs from torch, and why:

* torch raises on a dense gradient; here it is read as above. An entry that torch's sparse
  gradient lists with an explicit zero value (an embedding row looked up whose gradient came
  out exactly 0.0) moves its moments in torch; in a dense gradient here it does not (a sparse
  gradient, as ``nn.Embedding(sparse=True)`` gives, moves it as torch does).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Tuple

from mpitensor import backend as _backend
from mpitensor._ops.sparse import held_entries, sparse_of

from . import _adaptive as _a

__all__ = ["SparseAdam"]


def _real_floats(owner: str, param: Any) -> None:
    if param.dtype.kind != "f":
        raise TypeError(f"{owner}: parameters must be real floating point, got "
                        f"{param.dtype}; use Adam for complex parameters")


class SparseAdam(_a.AdaptiveOptimizer):
    """Lazy Adam for embedding-like parameters, as ``torch.optim.SparseAdam`` (dense gradients).

    Only the entries whose gradient is nonzero are updated, moments included (see the module's
    text for how this reads torch's sparse gradients). Per-parameter state (torch's keys):
    ``step`` (a Python int, as torch stores it), ``exp_avg`` and ``exp_avg_sq``.

    Args:
        params: Tensors to optimise, or dicts defining parameter groups.
        lr: learning rate (default 1e-3).
        betas: ``(beta1, beta2)`` (default (0.9, 0.999)).
        eps: added to the denominator (default 1e-8).
        maximize: maximise the objective instead of minimising it.

    Raises:
        ValueError: ``lr`` or ``eps`` is negative or NaN, or a beta is outside [0, 1).
        TypeError: a hyper-parameter is not a number; at ``step()``, a parameter that is not
            real floating point.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([1.0, 1.0], requires_grad=True)
        >>> opt = SparseAdam([w], lr=0.1)
        >>> w.grad = mt.tensor([2.0, 0.0])  # the second entry is not in this "sparse" gradient
        >>> opt.step()
        >>> w
        tensor([0.9000, 1.0000], requires_grad=True)
    """

    _checks = {"lr": _a.nonneg, "betas": _a.betas_pair, "eps": _a.nonneg}
    _settings = _a.Settings("lr", "betas", "eps", "maximize")

    def __init__(self, params: Any, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, maximize: bool = False) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, maximize=bool(maximize))
        super().__init__(params, defaults)

    def _update(self, param: Any, grad: Any, state: Dict[str, Any], s: Any) -> None:
        _real_floats("SparseAdam", param)
        if not state:
            state["step"] = 0
            state["exp_avg"] = _a.zeros_state(param)
            state["exp_avg_sq"] = _a.zeros_state(param)
        step = int(state.get("step", 0)) + 1
        state["step"] = step
        xp = _backend.array_module(param)
        m = _a.state_array(state, "exp_avg", param)
        v = _a.state_array(state, "exp_avg_sq", param)
        sparse = sparse_of(grad)
        if sparse is None:
            held = grad != 0
        else:  # a sparse gradient (nn.Embedding(sparse=True)): its entries, as in torch
            grad, held = held_entries(param, sparse)
        g = grad[held]
        if s.maximize:
            g = -g
        m_old, v_old = m[held], v[held]
        du = g - m_old
        du *= 1.0 - s.beta1
        m[held] = m_old + du
        numer = du + m_old
        dv = g * g
        dv -= v_old
        dv *= 1.0 - s.beta2
        v[held] = v_old + dv
        dv += v_old
        denom = xp.sqrt(dv, out=dv)
        denom += s.eps
        step_size = s.lr * math.sqrt(1.0 - s.beta2 ** step) / (1.0 - s.beta1 ** step)
        numer /= denom
        numer *= -step_size
        param[held] += numer
