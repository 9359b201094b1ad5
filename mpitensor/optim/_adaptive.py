"""The machinery shared by the adaptive optimisers (Adam, AdamW, Adadelta, Adagrad, RMSprop).

Each of those keeps running statistics per parameter and updates it with a handful of in-place
array operations. What they have in common lives here: checking hyper-parameters up front (in
the constructor and in ``add_param_group``), the per-parameter ``"step"`` counter in torch's
layout (a 0-d float Tensor on the host), state arrays shaped and laid out like their parameter
on its device, scratch arrays recycled between steps, and the real view torch takes of complex
parameters (every update rule here acts on the real and imaginary parts independently).
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import dtypes as _dtypes
from mpitensor._base.workspace import empty_like as _empty_like
from mpitensor.tensor import Tensor

from .optimizer import Optimizer, required

__all__: list = []  # private module

# A check takes (optimizer name, hyper-parameter name, value) and raises on a bad value.
Check = Callable[[str, str, Any], None]


def _number(owner: str, name: str, value: Any) -> float:
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{owner}: {name} must be a real number, got "
                        f"{type(value).__name__} ({value!r})")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{owner}: {name} must be a real number, got "
                        f"{type(value).__name__} ({value!r})") from None


def nonneg(owner: str, name: str, value: Any) -> None:
    """Raise unless ``value`` is a number >= 0 (NaN is rejected too)."""
    if not _number(owner, name, value) >= 0.0:
        raise ValueError(f"{owner}: invalid {name} {value!r}; it must be a number >= 0")


def unit_closed(owner: str, name: str, value: Any) -> None:
    """Raise unless ``0 <= value <= 1``."""
    if not 0.0 <= _number(owner, name, value) <= 1.0:
        raise ValueError(f"{owner}: invalid {name} {value!r}; it must lie in [0, 1]")


def unit_half_open(owner: str, name: str, value: Any) -> None:
    """Raise unless ``0 <= value < 1``."""
    if not 0.0 <= _number(owner, name, value) < 1.0:
        raise ValueError(f"{owner}: invalid {name} {value!r}; it must lie in [0, 1)")


def require_pair(owner: str, name: str, value: Any, what: str) -> None:
    """Raise unless ``value`` has two items; ``what`` says what they are, for the message."""
    try:
        n = len(value)
    except TypeError:
        n = -1
    if n != 2:
        raise ValueError(f"{owner}: {name} must be a pair {what}, got {value!r}")


def betas_pair(owner: str, name: str, value: Any) -> None:
    """Raise unless ``value`` is a pair of numbers, each in [0, 1)."""
    require_pair(owner, name, value, "(beta1, beta2) of numbers in [0, 1)")
    unit_half_open(owner, f"{name}[0] (beta1)", value[0])
    unit_half_open(owner, f"{name}[1] (beta2)", value[1])


def not_differentiable(owner: str, name: str, value: Any) -> None:
    """Raise when ``differentiable`` is asked for: the step runs outside autograd."""
    if value:
        raise ValueError(f"{owner}: differentiable=True is not supported (the update runs on "
                         f"the raw arrays, outside autograd); leave it False")


#: the checks of the Adam family (Adam, AdamW, Adamax, NAdam, RAdam)
ADAM_CHECKS: Dict[str, Check] = {"lr": nonneg, "betas": betas_pair, "eps": nonneg,
                                 "weight_decay": nonneg, "differentiable": not_differentiable}


def decayed_direction(param: Any, grad: Any, lr: float, weight_decay: float, decoupled: bool,
                      maximize: bool) -> Any:
    """:func:`direction` with the weight decay applied either way: as an L2 term in the
    gradient, or (``decoupled``, AdamW's way) by shrinking ``param`` in place by
    ``lr * weight_decay`` of itself first. The caller may overwrite the result only when it is
    not ``grad``."""
    if decoupled and weight_decay != 0:
        param *= 1.0 - lr * weight_decay
        return direction(param, grad, 0.0, maximize)[0]
    return direction(param, grad, weight_decay, maximize)[0]


#: hyper-parameters given as a pair, and the names of their two settings
_PAIRS = {"betas": ("beta1", "beta2"), "etas": ("etaminus", "etaplus"),
          "step_sizes": ("step_min", "step_max")}
#: switches (read as bool, absent meaning False), and the name of the setting where it differs
_FLAGS = {"amsgrad": "amsgrad", "maximize": "maximize", "centered": "centered",
          "decoupled_weight_decay": "decoupled"}


class Settings:
    """The hyper-parameters one update reads, taken from a group once per step.

    Declared with the group's keys in the order the update wants them: a pair (``betas``,
    ``etas``, ``step_sizes``) gives two settings (``beta1``/``beta2``, ...), a switch
    (``maximize``, ``amsgrad``, ``centered``, ``decoupled_weight_decay`` read as
    ``decoupled``) a bool, any other key a float. Calling it on a group gives a named tuple.

    Example:
        >>> read = Settings("lr", "betas", "maximize")
        >>> read({"lr": 0.1, "betas": (0.9, 0.99), "maximize": False})
        Settings(lr=0.1, beta1=0.9, beta2=0.99, maximize=False)
    """

    def __init__(self, *keys: str) -> None:
        names: List[str] = []
        for key in keys:
            names.extend(_PAIRS.get(key, (_FLAGS.get(key, key),)))
        self._keys = keys
        self._type = collections.namedtuple("Settings", names)  # type: ignore[misc]

    def __call__(self, group: Dict[str, Any]) -> Any:
        values: List[Any] = []
        for key in self._keys:
            if key in _PAIRS:
                a, b = group[key]
                values += (float(a), float(b))
            elif key in _FLAGS:
                values.append(bool(group.get(key)))
            else:
                values.append(float(group[key]))
        return self._type._make(values)


class AdaptiveOptimizer(Optimizer):
    """Base of the optimisers with running per-parameter statistics.

    Subclasses list their hyper-parameter checks in ``_checks`` and the settings their update
    reads in ``_settings`` (a :class:`Settings`, applied to each group once per step), and
    implement :meth:`_update` (one parameter's update, on raw arrays, in place).
    """

    _checks: Dict[str, Check] = {}
    _settings: Settings

    def __init__(self, params: Any, defaults: Dict[str, Any]) -> None:
        self._check_hyper(defaults)  # before any group exists
        self._normalize(defaults)
        super().__init__(params, defaults)

    def _normalize(self, defaults: Dict[str, Any]) -> None:
        """Store checked hyper-parameters in their canonical form: ``betas`` as a pair of
        floats, ``differentiable`` as False (the only value the checks let through)."""
        if "betas" in defaults:
            b1, b2 = defaults["betas"]
            defaults["betas"] = (float(b1), float(b2))
        if "differentiable" in defaults:
            defaults["differentiable"] = False

    def _check_hyper(self, values: Dict[str, Any]) -> None:
        owner = type(self).__name__
        for name, check in self._checks.items():
            if name in values and values[name] is not required:
                check(owner, name, values[name])

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Add a parameter group, checking its hyper-parameters like the constructor does.

        Args:
            param_group: a dict with ``"params"`` and optional hyper-parameters.

        Raises:
            ValueError: a hyper-parameter is out of range (see the class's constructor).
            TypeError: a hyper-parameter is not a number.
        """
        if isinstance(param_group, dict):
            self._check_hyper(param_group)
        super().add_param_group(param_group)

    def _group_settings(self, group: Dict[str, Any]) -> Any:
        return self._settings(group)

    def _update(self, param: Any, grad: Any, state: Dict[str, Any], settings: Any) -> None:
        raise NotImplementedError

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Update every parameter that has a gradient; parameters with ``grad is None`` are skipped.

        Args:
            closure: optional callable that re-evaluates the model and returns the loss (run
                with gradients enabled).

        Returns:
            The closure's loss, or None.

        Raises:
            ValueError: a gradient is not shaped like its parameter.
        """
        loss = self._closure_loss(closure)
        state = self.state
        for group in self.param_groups:
            settings = self._group_settings(group)
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                pa, ga = p._data, g._data
                if ga.shape != pa.shape:
                    raise ValueError(f"{type(self).__name__}: a gradient of shape "
                                     f"{tuple(ga.shape)} was found on a parameter of shape "
                                     f"{tuple(pa.shape)}; a gradient must be shaped like its "
                                     f"parameter")
                with on_device(pa):
                    self._update(pa, ga, state[p], settings)
                _autograd.bump_version(p)  # an in-place write, seen by graphs that saved p
        return loss


def on_device(a: Any) -> Any:
    """A context that makes ``a``'s GPU current (CuPy allocates there); a no-op for NumPy."""
    if isinstance(a, np.ndarray) or not _backend.is_cupy_array(a):
        return contextlib.nullcontext()
    return a.device


def new_step() -> Tensor:
    """A fresh step counter: a 0-d host Tensor of the default float dtype, as torch keeps it."""
    dt = np.float64 if _dtypes.get_default_dtype() == np.float64 else np.float32
    return Tensor._wrap(np.zeros((), dtype=dt))


def advance_step(state: Dict[str, Any]) -> float:
    """Add one to ``state["step"]`` and return the new count as a Python float.

    Counters loaded from older checkpoints may be plain numbers; they become Tensors here.
    """
    s = state.get("step")
    if isinstance(s, Tensor) and s._data.ndim == 0 and isinstance(s._data, np.ndarray):
        s._data += 1
        return float(s._data)
    n = (0.0 if s is None else float(_backend.to_numpy(s._data) if isinstance(s, Tensor)
                                      else s)) + 1.0
    counter = new_step()
    counter._data[...] = n
    state["step"] = counter
    return n


def start_step(state: Dict[str, Any], param: Any, *keys: str) -> Tuple[float, List[Any]]:
    """The start of one parameter's update: on its first step, the step counter and zeroed
    arrays under ``keys`` (in that order, torch's state layout); then the counter advanced.

    Returns:
        ``(step, arrays)``: the new step count and the real view (:func:`real`) of each
        ``state[key]`` (made afresh where a loaded state lacks one).
    """
    if not state:
        state["step"] = new_step()
        for key in keys:
            state[key] = zeros_state(param)
    step = advance_step(state)
    return step, [real(state_array(state, key, param)) for key in keys]


def zeros_state(param: Any, fill: float = 0.0) -> Tensor:
    """A state Tensor shaped, typed and laid out like ``param``, on its device, set to ``fill``.

    Complex parameters get ``fill`` in both the real and the imaginary part (torch's rule for
    Adagrad's initial accumulator).
    """
    xp = _backend.array_module(param)
    with on_device(param):
        out = xp.zeros_like(param)
        if fill != 0:
            out.fill(complex(fill, fill) if out.dtype.kind == "c" else fill)
    return Tensor._wrap(out)


def state_array(state: Dict[str, Any], key: str, param: Any, fill: float = 0.0) -> Any:
    """The raw array of ``state[key]``, created (filled with ``fill``) when missing."""
    t = state.get(key)
    if t is None:
        t = state[key] = zeros_state(param, fill)
    return t._data


def real(a: Any) -> Any:
    """``a`` itself when real; for a complex array, a writable real view with a trailing axis of 2.

    Every update rule here works elementwise on the real and imaginary parts separately (torch
    does the same through ``view_as_real``), so the complex case is the real case on this view.
    """
    if a.dtype.kind != "c":
        return a
    xp = _backend.array_module(a)
    r = a.real  # same memory and strides, real dtype
    return xp.lib.stride_tricks.as_strided(r, shape=tuple(a.shape) + (2,),
                                           strides=tuple(a.strides) + (r.itemsize,))


def scratch(a: Any) -> Any:
    """An uninitialised array laid out like ``a`` (NumPy buffers are recycled between steps)."""
    return _empty_like(a)


def direction(param: Any, grad: Any, weight_decay: float, maximize: bool) -> Tuple[Any, bool]:
    """The gradient the rules see: ``-grad`` when maximising, plus ``weight_decay * param``.

    Returns:
        ``(d, owned)``: ``d`` is ``grad`` itself (never written to) when nothing changes it,
        else a scratch array (``owned`` True) that the caller may overwrite.
    """
    xp = _backend.array_module(param)
    if weight_decay != 0:
        d = scratch(param)
        xp.multiply(param, weight_decay, out=d)
        if maximize:
            d -= grad  # equals -g + wd*p bit for bit
        else:
            d += grad
        return d, True
    if maximize:
        d = scratch(param)
        xp.negative(grad, out=d)
        return d, True
    return grad, False


def real_arrays(param: Any, grad: Any) -> Tuple[Any, Any, Any]:
    """``(xp, p, g)``: the array module of ``param`` and the real views (:func:`real`) of the
    parameter and its gradient, which an update rule works on."""
    return _backend.array_module(param), real(param), real(grad)


def adam_moments(m: Any, v: Any, d: Any, beta1: float, beta2: float, tmp: Any) -> None:
    """Adam's running moments of the direction ``d``, in place: ``m = lerp(m, d, 1 - beta1)``,
    ``v = beta2 * v + (1 - beta2) * d * d`` (``tmp`` is scratch)."""
    lerp_(m, d, 1.0 - beta1, tmp)
    v *= beta2
    add_square_(v, d, 1.0 - beta2, tmp)


def lerp_(x: Any, end: Any, weight: float, tmp: Any) -> None:
    """``x += weight * (end - x)`` in place, with torch's two-sided formula (``tmp`` is scratch).

    Near ``weight == 1`` the form ``end - (end - x) * (1 - weight)`` is used, which lands exactly
    on ``end`` at ``weight == 1``; torch switches at 0.5 and so does this.
    """
    xp = _backend.array_module(x)
    xp.subtract(end, x, out=tmp)
    if abs(weight) < 0.5:
        tmp *= weight
        x += tmp
    else:
        tmp *= 1.0 - weight
        xp.subtract(end, tmp, out=x)


def add_square_(acc: Any, x: Any, value: float, tmp: Any) -> None:
    """``acc += value * x * x`` in place (``tmp`` is scratch)."""
    xp = _backend.array_module(acc)
    if value == 1:
        xp.multiply(x, x, out=tmp)
    else:
        xp.multiply(x, value, out=tmp)
        tmp *= x
    acc += tmp

