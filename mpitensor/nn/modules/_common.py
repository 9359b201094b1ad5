"""What several layer families share: constructor argument checks (sizes, dtypes, the
loss ``reduction`` keyword, padding modes) and the creation and default initialisation of
weights, biases and affine parameters; and what ``Module`` and its state-dict loading share
(naming a value's type in messages, reading arrays out of a state dict)."""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, Optional, Union

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor, _move, empty

from .. import init
from ..parameter import Parameter

_IntOrPair = Union[int, tuple]


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _positive_int(v: Any, cls: str, name: str, allow_zero: bool = False) -> int:
    low = 0 if allow_zero else 1
    if not _is_int(v) or v < low:
        what = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{cls}: {name} must be {what} integer, got {v!r}")
    return int(v)


def _pair(v: Any, cls: str, name: str, low: int) -> tuple:
    """``v`` as a pair of ints >= low (an int is used for both)."""
    if _is_int(v):
        v = (v, v)
    if not isinstance(v, (tuple, list)) or len(v) != 2 or not all(_is_int(e) for e in v):
        raise ValueError(f"{cls}: {name} must be an int or a pair of ints, got {v!r}")
    if any(e < low for e in v):
        bound = "positive" if low == 1 else "non-negative"
        raise ValueError(f"{cls}: {name} must be {bound}, got {v!r}")
    return (int(v[0]), int(v[1]))


def _factory(dtype: Any, cls: str) -> Any:
    """A floating dtype for new parameters (the default dtype when None)."""
    dt = _dt.get_default_dtype() if dtype is None else _dt.to_dtype(dtype)
    if not _dt.is_floating_dtype(dt):
        raise TypeError(f"{cls}: parameters need a floating point dtype, got {_dt.dt_repr(dt)}")
    return dt


def _reduction(size_average: Any, reduce: Any, reduction: str, cls: str) -> str:
    """torch's legacy ``size_average``/``reduce`` flags folded into ``reduction``."""
    if size_average is not None or reduce is not None:
        warnings.warn(
            "size_average and reduce args will be deprecated, please use reduction instead",
            stacklevel=3,
        )
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        if size_average and reduce:
            return "mean"
        return "sum" if reduce else "none"
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(
            f"{cls}: {reduction!r} is not a valid value for reduction; use 'none', 'mean' or 'sum'"
        )
    return reduction


_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _reset_default(weight: Parameter, bias: Optional[Parameter]) -> None:
    """torch's default init of Linear and Conv: kaiming-uniform(a=√5), bias in ±1/√fan_in.

    fan_in is never 0 here: the constructors reject empty feature and channel counts.
    """
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = init._calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in)
        init.uniform_(bias, -bound, bound)


def _add_weight_and_bias(module: Any, wshape: tuple, bias: bool, dtype: Any,
                         device: Any, bias_size: Optional[int] = None) -> None:
    """Register ``weight`` (``wshape``) and ``bias`` (``bias_size``, by default ``wshape[0]``,
    or None) on ``module``, uninitialised, then draw them with ``module.reset_parameters()``."""
    module.weight = Parameter(empty(*wshape, dtype=dtype, device=device))
    if bias:
        n = wshape[0] if bias_size is None else bias_size
        module.bias = Parameter(empty(n, dtype=dtype, device=device))
    else:
        module.register_parameter("bias", None)
    module.reset_parameters()


def _repr_fields(module: Any, positional: tuple, **defaults: Any) -> str:
    """An ``extra_repr`` in torch's style: the ``positional`` attributes' values, then
    ``name=value`` for each attribute in ``defaults`` whose value is not its default.

    A default of None or a bool is compared by identity (``bias=1`` still shows), any other
    by value (``dropout=0.0`` against 0 does not).
    """
    parts = [str(getattr(module, name)) for name in positional]
    for name, default in defaults.items():
        value = getattr(module, name)
        differs = (value is not default if default is None or isinstance(default, bool)
                   else value != default)
        if differs:
            parts.append(f"{name}={value}")
    return ", ".join(parts)


class _ReprFields:
    """Mixin for a module whose ``extra_repr`` is ``name=value`` for each attribute named in
    ``_repr``, in order (torch's repr of pooling, folding, shuffling and flattening layers)."""

    _repr: tuple = ()

    def _keep(self, *values: Any) -> None:
        """Store the constructor's ``values`` under the names in ``_repr``, in that order."""
        assert len(values) == len(self._repr), (type(self).__name__, self._repr)
        for name, value in zip(self._repr, values):
            setattr(self, name, value)

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)}" for name in self._repr)


def _check_eps(cls: str, eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0:
        raise ValueError(f"{cls}: eps must be a non-negative number, got {eps!r}")
    return float(eps)


def _affine_params(module: Any, shape: tuple, weight: bool, bias: bool, dtype: Any,
                   device: Any) -> None:
    """Register ``weight`` and ``bias`` of ``shape`` (or None), then set them to 1 and 0."""
    for name, wanted in (("weight", weight), ("bias", bias)):
        if wanted:
            module.register_parameter(name, Parameter(empty(*shape, dtype=dtype, device=device)))
        else:
            module.register_parameter(name, None)


def _reset_affine(module: Any) -> None:
    if module.weight is not None:
        init.ones_(module.weight)
    if module.bias is not None:
        init.zeros_(module.bias)


# what Module and its load plan share: messages naming a value's type, arrays from a state dict
def _qualified_type(value: Any) -> str:
    """``int`` for builtins, ``package.module.Class`` otherwise (unambiguous in errors)."""
    cls = type(value)
    if cls.__module__ == "builtins":
        return cls.__name__
    return f"{cls.__module__}.{cls.__qualname__}"


def _as_array(value: Any, key: str) -> Any:
    """The array (NumPy or CuPy) behind a ``load_state_dict`` value, without copying."""
    if isinstance(value, Tensor):
        return value._data
    if _backend.is_array(value):
        return value
    if hasattr(value, "__array__") or hasattr(value, "__array_interface__"):
        if hasattr(value, "detach"):  # torch.Tensor: through NumPy, a view when possible
            return value.detach().cpu().numpy()
        return np.asarray(value)
    raise TypeError(
        f'cannot load "{key}" from a {type(value)}: expected mpitensor.Tensor or Tensor-like '
        f"value (a NumPy/CuPy array or a torch.Tensor)"
    )


def _on_device_of(arr: Any, like: Any) -> Any:
    """``arr`` moved to ``like``'s device and cast to its dtype (``arr`` itself if it fits)."""
    out = _move(arr, _backend.device_of(like))
    return out if out.dtype == like.dtype else out.astype(like.dtype)
