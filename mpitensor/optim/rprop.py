"""``Rprop``: resilient backpropagation, steps that grow and shrink with the gradient's sign.

The update is ``torch.optim.Rprop``'s, per parameter::

    t += 1
    g = -grad if maximize else grad
    s = sign(g * prev)
    f = etaplus where s > 0, etaminus where s < 0, 1 where s == 0
    step_size = clamp(step_size * f, step_size_min, step_size_max)     'step_size'
    g = 0 where f == etaminus            (a sign change: no step, and forget the gradient)
    p = p - sign(g) * step_size
    prev = g                                                           'prev'

``step_size`` starts at ``lr`` for every element. It runs on the raw arrays (NumPy or CuPy).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from mpitensor import backend as _backend

from . import _adaptive as _a

__all__ = ["Rprop"]


def _etas(owner: str, name: str, value: Any) -> None:
    _a.require_pair(owner, name, value, "(etaminus, etaplus)")
    lo, hi = _a._number(owner, f"{name}[0]", value[0]), _a._number(owner, f"{name}[1]", value[1])
    if not 0.0 < lo < 1.0 < hi:
        raise ValueError(f"{owner}: invalid {name} {tuple(value)!r}; they must satisfy "
                         f"0 < etaminus < 1 < etaplus")


def _step_sizes(owner: str, name: str, value: Any) -> None:
    _a.require_pair(owner, name, value, "(min, max) of step sizes")
    for i in range(2):
        _a._number(owner, f"{name}[{i}]", value[i])


class Rprop(_a.AdaptiveOptimizer):
    """Rprop (Riedmiller & Braun, 1993), as ``torch.optim.Rprop``; meant for full batches.

    Per-parameter state (torch's keys): ``step`` (a 0-d float Tensor), ``prev`` (the last
    gradient used) and ``step_size`` (one step size per element).

    Args:
        params: Tensors to optimise, or dicts defining parameter groups.
        lr: the initial step size of every element (default 1e-2).
        etas: ``(etaminus, etaplus)``, the factors that shrink and grow a step size (default
            (0.5, 1.2)); they must satisfy ``0 < etaminus < 1 < etaplus``.
        step_sizes: ``(min, max)`` bounds of the step sizes (default (1e-6, 50)).
        capturable, foreach: accepted for torch compatibility.
        maximize: maximise the objective instead of minimising it.
        differentiable: must be False (the step is not recorded by autograd).

    Raises:
        ValueError: ``lr`` is negative or NaN, ``etas`` is out of order, a pair is not a pair,
            or ``differentiable`` is True.
        TypeError: a hyper-parameter is not a number.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([1.0, -1.0], requires_grad=True)
        >>> opt = Rprop([w], lr=0.5)
        >>> (w * mt.tensor([3.0, -0.1])).sum().backward()  # w.grad = [3.0, -0.1]
        >>> opt.step()
        >>> w  # each weight moves by the step size against its gradient's sign
        tensor([ 0.5000, -0.5000], requires_grad=True)
    """

    _checks = {"lr": _a.nonneg, "etas": _etas, "step_sizes": _step_sizes,
               "differentiable": _a.not_differentiable}
    _settings = _a.Settings("lr", "etas", "step_sizes", "maximize")

    def __init__(self, params: Any, lr: float = 1e-2, etas: Tuple[float, float] = (0.5, 1.2),
                 step_sizes: Tuple[float, float] = (1e-6, 50), *, capturable: bool = False,
                 foreach: Optional[bool] = None, maximize: bool = False,
                 differentiable: bool = False) -> None:
        defaults = dict(lr=lr, etas=etas, step_sizes=step_sizes, foreach=foreach,
                        maximize=bool(maximize), differentiable=differentiable,
                        capturable=bool(capturable))
        super().__init__(params, defaults)

    def _normalize(self, defaults: Dict[str, Any]) -> None:
        """Also store ``etas`` and ``step_sizes`` as tuples."""
        super()._normalize(defaults)
        defaults["etas"] = tuple(defaults["etas"])
        defaults["step_sizes"] = tuple(defaults["step_sizes"])

    def _update(self, param: Any, grad: Any, state: Dict[str, Any], s: Any) -> None:
        if not state:
            state["step"] = _a.new_step()
            state["prev"] = _a.zeros_state(param)
            # complex parameters: lr in the real and in the imaginary part, as torch starts them
            state["step_size"] = _a.zeros_state(param, s.lr)
        _a.advance_step(state)
        xp = _backend.array_module(param)
        prev = _a.real(_a.state_array(state, "prev", param))
        size = _a.real(_a.state_array(state, "step_size", param, s.lr))
        p, g = _a.real(param), _a.real(grad)
        d = _a.scratch(p)
        if s.maximize:
            xp.negative(g, out=d)
        else:
            d[...] = g
        f = _a.scratch(p)
        xp.multiply(d, prev, out=f)
        xp.sign(f, out=f)
        f[f > 0] = s.etaplus
        f[f < 0] = s.etaminus
        f[f == 0] = 1
        size *= f
        xp.clip(size, s.step_min, s.step_max, out=size)
        d[f == s.etaminus] = 0
        xp.sign(d, out=f)
        f *= size
        p -= f
        prev[...] = d
