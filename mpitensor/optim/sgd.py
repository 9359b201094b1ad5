"""``SGD``: stochastic gradient descent with momentum, dampening, weight decay and Nesterov.

The update is PyTorch's, operation for operation (``torch.optim.SGD``)::

    d = -g if maximize else g
    if weight_decay != 0:  d = d + weight_decay * p
    if momentum != 0:
        buf = clone(d)                       on the first step
        buf = momentum * buf + (1 - dampening) * d   afterwards
        d = d + momentum * buf if nesterov else buf
    p = p - lr * d

It runs on the raw arrays (``p._data``, ``p.grad._data``) in place, outside autograd: on NumPy with
in-place ufuncs and at most one scratch array per parameter; on CuPy with one fused elementwise
kernel per parameter (one launch instead of five or six).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor._ops.sparse import add_sparse_
from mpitensor.tensor import Tensor

from . import _adaptive as _a
from .optimizer import Optimizer, required

__all__ = ["SGD", "sgd"]


class SGD(Optimizer):
    """Stochastic gradient descent (optionally with momentum), exactly as ``torch.optim.SGD``.

    Args:
        params: Tensors to optimise, or dicts defining parameter groups.
        lr: learning rate (default 1e-3).
        momentum: momentum factor (default 0).
        dampening: dampening of the momentum (default 0).
        weight_decay: L2 penalty added to the gradient (default 0).
        nesterov: use Nesterov momentum (needs ``momentum > 0`` and ``dampening == 0``).
        maximize: maximise the objective instead of minimising it.
        foreach: accepted for torch compatibility; the update is already one in-place pass per
            parameter.
        differentiable: must be False (the step is not recorded by autograd).
        fused: on CuPy parameters, False turns off the fused one-kernel update (default on);
            ignored on NumPy, where the update is in-place ufuncs.

    Raises:
        ValueError: a hyper-parameter is negative or NaN, or Nesterov is asked without momentum
            or with dampening.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([1.0, 2.0], requires_grad=True)
        >>> opt = SGD([w], lr=0.1, momentum=0.9)
        >>> w.grad = mt.tensor([2.0, 4.0])  # what (w * w).sum().backward() gives
        >>> opt.step()
        >>> w
        tensor([0.8000, 1.6000], requires_grad=True)
    """

    def __init__(self, params: Any, lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: Optional[bool] = None, differentiable: bool = False,
                 fused: Optional[bool] = None) -> None:
        if lr is not required:
            _check_nonneg("learning rate", lr)
        _check_nonneg("momentum value", momentum)
        _check_nonneg("dampening value", dampening)
        _check_nonneg("weight_decay value", weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(f"Nesterov momentum requires a momentum and zero dampening "
                             f"(got momentum={momentum}, dampening={dampening})")
        if differentiable:
            raise ValueError("differentiable=True is not supported: the SGD step runs outside "
                             "autograd; leave it False")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=bool(nesterov), maximize=bool(maximize), foreach=foreach,
                        differentiable=False, fused=fused)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        """Add a parameter group, checking its hyper-parameters like the constructor does."""
        for key in ("lr", "momentum", "dampening", "weight_decay"):
            if key in param_group and param_group[key] is not required:
                _check_nonneg("learning rate" if key == "lr" else f"{key} value",
                              param_group[key])
        super().add_param_group(param_group)
        g = self.param_groups[-1]
        if g["nesterov"] and (g["momentum"] <= 0 or g["dampening"] != 0):
            self.param_groups.pop()
            raise ValueError(f"Nesterov momentum requires a momentum and zero dampening "
                             f"(got momentum={g['momentum']}, dampening={g['dampening']})")

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One SGD update of each parameter with a gradient (a sparse one entry by entry).

        Parameters whose ``grad`` is None are left as they are.

        Args:
            closure: optional; re-evaluates the model and returns the loss, and runs with
                gradients enabled.

        Returns:
            What ``closure`` returned (None without one).

        Example:
            >>> import mpitensor as mt
            >>> w = mt.tensor([1.0], requires_grad=True)
            >>> opt = SGD([w], lr=0.5)
            >>> (w * w).sum().backward()  # w.grad = 2 w = 2
            >>> opt.step()
            >>> w
            tensor([0.], requires_grad=True)
        """
        loss = self._closure_loss(closure)
        state = self.state
        for group in self.param_groups:
            lr = group["lr"]
            momentum = group["momentum"]
            dampening = group["dampening"]
            wd = group["weight_decay"]
            nesterov = group["nesterov"]
            maximize = group["maximize"]
            fused = group.get("fused") is not False
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if g.is_sparse:  # nn.Embedding(sparse=True): added in entry by entry, as torch
                    if momentum != 0 or wd != 0:
                        raise NotImplementedError(
                            "SGD: momentum and weight_decay are not supported with a sparse "
                            "gradient here; use them with a dense one, or SparseAdam")
                    add_sparse_(p._data, g, lr if maximize else -lr)
                    _autograd.bump_version(p)
                    continue
                if momentum != 0:
                    st = state[p]
                    buf = st.get("momentum_buffer")
                    new = sgd(p._data, g._data, None if buf is None else buf._data, lr=lr,
                              momentum=momentum, dampening=dampening, weight_decay=wd,
                              nesterov=nesterov, maximize=maximize, fused=fused)
                    if buf is None:
                        st["momentum_buffer"] = Tensor._wrap(new)
                else:
                    sgd(p._data, g._data, None, lr=lr, momentum=0, dampening=dampening,
                        weight_decay=wd, nesterov=nesterov, maximize=maximize, fused=fused)
                # an in-place write: a graph that saved p (a forward before this step) must
                # not run its backward on the new values, as in torch
                _autograd.bump_version(p)
        return loss


def sgd(
    param: Any,
    grad: Any,
    momentum_buffer: Any,
    *,
    lr: float,
    momentum: float = 0,
    dampening: float = 0,
    weight_decay: float = 0,
    nesterov: bool = False,
    maximize: bool = False,
    fused: bool = True,
) -> Any:
    """Apply one SGD update to the array ``param`` in place (the functional form).

    Args:
        param: the parameter array (NumPy or CuPy), updated in place.
        grad: its gradient, same shape, dtype and device; never modified.
        momentum_buffer: the momentum array from the previous step (updated in place), or None
            on the first step or when ``momentum == 0``.
        lr, momentum, dampening, weight_decay, nesterov, maximize: as in :class:`SGD`.
        fused: on CuPy floating arrays, do the whole update in one kernel.

    Returns:
        The momentum buffer (a new array on the first step), or None when ``momentum == 0``.

    Raises:
        ValueError: ``grad`` and ``param`` have different shapes.

    Example:
        >>> p = np.array([1.0]); sgd(p, np.array([2.0]), None, lr=0.5); p
        array([0.])
    """
    if grad.shape != param.shape:
        raise ValueError(f"SGD: the gradient has shape {tuple(grad.shape)} but the parameter has "
                         f"shape {tuple(param.shape)}; a gradient must be shaped like its "
                         f"parameter")
    if fused and not isinstance(param, np.ndarray) and param.dtype.kind == "f" \
            and _backend.is_cupy_array(param):
        return _sgd_cupy_fused(param, grad, momentum_buffer, lr, momentum, dampening,
                               weight_decay, nesterov, maximize)
    xp = np if isinstance(param, np.ndarray) else _backend.array_module(param)
    # d: the direction; `owned` says whether it is a scratch array we may overwrite.
    d, owned = _a.direction(param, grad, weight_decay, maximize)
    buf = momentum_buffer
    if momentum != 0:
        if buf is None:
            buf = d.copy()
        else:
            buf *= momentum
            if dampening == 0:
                buf += d
            elif owned and not nesterov:  # d is not needed again: scale it in place
                d *= 1 - dampening
                buf += d
            else:
                buf += xp.multiply(d, 1 - dampening)
        if nesterov:
            t = xp.multiply(buf, momentum)
            t += d
            d, owned = t, True
        else:
            d, owned = buf, False
    if owned:
        d *= -lr
        param += d
    else:
        param += xp.multiply(d, -lr)
    return buf if momentum != 0 else None


_FUSED_SRC = """
C d = maximize ? -(C)g : (C)g;
if (wd != 0) d = d + wd * (C)p;
%s
p = (T)((C)p - lr * d);
"""

_MOMENTUM_SRC = """
C b = first ? d : momentum * (C)buf + (1 - dampening) * d;
buf = (T)b;
b = (C)buf;
d = nesterov ? d + momentum * b : b;
"""


@functools.cache
def _fused_kernel(with_momentum: bool, double: bool) -> Any:
    """The fused update kernel; C (the compute type) is double for float64, else float."""
    cp = _backend.get_cupy()
    c, ctype = ("float64", "double") if double else ("float32", "float")
    src = f"typedef {ctype} C;\n" + _FUSED_SRC % (_MOMENTUM_SRC if with_momentum else "")
    if with_momentum:
        return cp.ElementwiseKernel(
            f"T g, {c} lr, {c} momentum, {c} dampening, {c} wd, bool nesterov, bool maximize, "
            f"bool first", "T p, T buf", src, f"mpitensor_sgd_momentum_{c}")
    return cp.ElementwiseKernel(f"T g, {c} lr, {c} wd, bool maximize", "T p", src,
                                f"mpitensor_sgd_{c}")


def _sgd_cupy_fused(param: Any, grad: Any, buf: Any, lr: float, momentum: float,
                    dampening: float, wd: float, nesterov: bool, maximize: bool) -> Any:
    """One-kernel SGD update for CuPy floating arrays (half precision computes in float32)."""
    cp = _backend.get_cupy()
    double = param.dtype == np.float64
    ct = np.float64 if double else np.float32
    if momentum == 0:
        _fused_kernel(False, double)(grad, ct(lr), ct(wd), bool(maximize), param)
        return None
    first = buf is None
    if first:
        with cp.cuda.Device(param.device.id):
            buf = cp.empty_like(param)
    _fused_kernel(True, double)(grad, ct(lr), ct(momentum), ct(dampening), ct(wd),
                                bool(nesterov), bool(maximize), first, param, buf)
    return buf


def _check_nonneg(what: str, value: Any) -> None:
    try:
        ok = float(value) >= 0.0
    except (TypeError, ValueError):
        raise TypeError(f"Invalid {what}: expected a non-negative number, got "
                        f"{type(value).__name__}") from None
    if not ok:
        raise ValueError(f"Invalid {what}: {value} (it must be a non-negative number)")
