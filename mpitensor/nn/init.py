"""Weight initialisation with ``torch.nn.init``'s names, formulas and in-place semantics.

Every function fills its tensor in place (NumPy or CuPy storage, any float dtype), outside
autograd, and returns it. Random numbers come from mpitensor's global generator (or the
``generator`` argument), so ``mpitensor.manual_seed(s)`` makes model initialisation
reproducible; on a GPU tensor they are drawn on the GPU.

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.nn import init
    >>> w = mt.empty(3, 5)
    >>> _ = mt.manual_seed(0)
    >>> _ = init.kaiming_uniform_(w, a=5 ** 0.5)
    >>> bool((w.abs() <= 1 / 5 ** 0.5).all())
    True
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Optional

from mpitensor import backend as _backend
from mpitensor.tensor import Tensor, rand, randn

__all__ = [
    "calculate_gain",
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "eye_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
]

_LINEAR_FNS = (
    "linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d",
)


def _check_tensor(tensor: Any, fname: str) -> Any:
    """The array of ``tensor``, which must be a floating point mpitensor Tensor."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{fname}() takes a mpitensor Tensor, got {type(tensor).__name__}")
    x = tensor._data
    if x.dtype.kind != "f":
        raise TypeError(
            f"{fname}() needs a floating point tensor, got dtype {x.dtype}; convert it first, "
            f"e.g. t.float()"
        )
    return x


def _draw(kind: str, x: Any, generator: Any) -> Any:
    """Standard uniform [0, 1) or normal numbers shaped and typed like ``x``, on its device."""
    dev = _backend.device_of(x)
    fn = rand if kind == "rand" else randn
    return fn(*x.shape, generator=generator, dtype=x.dtype, device=dev)._data


def calculate_gain(nonlinearity: str, param: Optional[float] = None) -> float:
    """Return the recommended gain for a nonlinearity (torch's table).

    Args:
        nonlinearity: "linear", "conv1d/2d/3d", "conv_transpose1d/2d/3d", "sigmoid", "tanh",
            "relu", "leaky_relu" or "selu".
        param: the negative slope of "leaky_relu" (default 0.01).

    Returns:
        The gain: 1 for linear/conv/sigmoid, 5/3 for tanh, sqrt(2) for relu,
        sqrt(2 / (1 + slope**2)) for leaky_relu, 3/4 for selu.

    Raises:
        ValueError: an unknown nonlinearity or a non-numeric slope.

    Example:
        >>> calculate_gain("relu") == 2 ** 0.5
        True
    """
    if nonlinearity in _LINEAR_FNS or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            negative_slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            negative_slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + negative_slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(
        f"Unsupported nonlinearity {nonlinearity}; use one of linear, conv1d, conv2d, conv3d, "
        f"conv_transpose1d/2d/3d, sigmoid, tanh, relu, leaky_relu, selu"
    )


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple:
    """Return ``(fan_in, fan_out)`` of a weight: in/out features times the kernel size.

    Raises:
        ValueError: the tensor has fewer than 2 dimensions.
    """
    shape = tuple(tensor.shape)
    if len(shape) < 2:
        raise ValueError(
            "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions"
        )
    receptive = 1
    for n in shape[2:]:
        receptive *= n
    return shape[1] * receptive, shape[0] * receptive


def _calculate_correct_fan(tensor: Tensor, mode: str) -> int:
    mode = mode.lower()
    valid = ["fan_in", "fan_out"]
    if mode not in valid:
        raise ValueError(f"Mode {mode} not supported, please use one of {valid}")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def _empty_warn(tensor: Tensor, fname: str) -> bool:
    if 0 in tuple(tensor.shape):
        warnings.warn(f"Initializing zero-element tensors is a no-op ({fname})", stacklevel=3)
        return True
    return False


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Tensor:
    """Fill ``tensor`` with numbers drawn uniformly from ``[a, b)``; returns it.

    Args:
        tensor: a floating point Tensor (filled in place).
        a, b: the bounds.
        generator: a :class:`mpitensor.Generator` (default: the global one).

    Raises:
        TypeError: not a floating point Tensor.
        ValueError: ``a > b``.

    Example:
        >>> import mpitensor as mt
        >>> bool((uniform_(mt.empty(100), -1, 1).abs() <= 1).all())
        True
    """
    x = _check_tensor(tensor, "uniform_")
    if a > b:
        raise ValueError(f"uniform_ expects to return a [from, to) range, but found from={a} > "
                         f"to={b}")
    u = _draw("rand", x, generator)
    u *= b - a
    u += a
    x[...] = u
    return tensor


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Tensor:
    """Fill ``tensor`` with numbers drawn from N(mean, std²); returns it.

    Raises:
        TypeError: not a floating point Tensor.
        ValueError: ``std < 0``.

    Example:
        >>> import mpitensor as mt
        >>> normal_(mt.empty(2, 3), 0.0, 0.02).shape
        mpitensor.Size([2, 3])
    """
    x = _check_tensor(tensor, "normal_")
    if std < 0:
        raise ValueError(f"normal_ expects std >= 0.0, but found std {std}")
    z = _draw("randn", x, generator)
    z *= std
    z += mean
    x[...] = z
    return tensor


def trunc_normal_(
    tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
    generator: Any = None,
) -> Tensor:
    """Fill ``tensor`` with N(mean, std²) numbers, redrawing those outside ``[a, b]``.

    Raises:
        ValueError: ``a >= b``, ``std <= 0``, or an interval so far in the tail that redrawing
            does not converge (use a wider one).

    Example:
        >>> import mpitensor as mt
        >>> bool((trunc_normal_(mt.empty(1000), a=-1.0, b=1.0).abs() <= 1).all())
        True
    """
    x = _check_tensor(tensor, "trunc_normal_")
    if not a < b or std <= 0:
        raise ValueError(f"trunc_normal_ needs a < b and std > 0, got a={a}, b={b}, std={std}")
    z = _draw("randn", x, generator) * std + mean
    flat = z.reshape(-1)
    bad = ((flat < a) | (flat > b)).nonzero()[0]
    for _ in range(1000):
        if bad.size == 0:
            break
        fresh = _draw("randn", flat[: bad.size], generator) * std + mean
        flat[bad] = fresh
        keep = (fresh < a) | (fresh > b)
        bad = bad[keep]
    else:
        raise ValueError(
            f"trunc_normal_: [a, b] = [{a}, {b}] holds too little of N({mean}, {std}**2) to "
            f"sample by redrawing; widen the interval or move the mean into it"
        )
    x[...] = flat.reshape(x.shape)
    return tensor


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill ``tensor`` with ``val``; returns it.

    Example:
        >>> import mpitensor as mt
        >>> constant_(mt.empty(2), 0.5)
        tensor([0.5000, 0.5000])
    """
    x = _check_tensor(tensor, "constant_")
    x.fill(val)
    return tensor


def ones_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with ones; returns it."""
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with zeros; returns it."""
    return constant_(tensor, 0.0)


def eye_(tensor: Tensor) -> Tensor:
    """Fill a 2-D ``tensor`` with the identity matrix; returns it.

    Raises:
        ValueError: the tensor is not 2-D.
    """
    x = _check_tensor(tensor, "eye_")
    if x.ndim != 2:
        raise ValueError(f"Only tensors with 2 dimensions are supported, got {x.ndim}")
    x.fill(0)
    i = _backend.array_module(x).arange(min(x.shape))
    x[i, i] = 1
    return tensor


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Fill ``tensor`` from U(-a, a) with a = gain·√(6 / (fan_in + fan_out)) (Glorot).

    Example:
        >>> import mpitensor as mt
        >>> bool((xavier_uniform_(mt.empty(3, 5)).abs() <= 0.75 ** 0.5).all())
        True
    """
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Fill ``tensor`` from N(0, std²) with std = gain·√(2 / (fan_in + fan_out)) (Glorot)."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def kaiming_uniform_(
    tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
    generator: Any = None,
) -> Tensor:
    """Fill ``tensor`` from U(-bound, bound), bound = gain·√(3 / fan) (He et al.).

    ``Linear`` and ``Conv2d`` use ``a=√5``, which gives bound = 1/√fan_in, as in torch.

    Args:
        tensor: a floating point Tensor with at least 2 dimensions.
        a: the negative slope of the leaky ReLU that follows.
        mode: "fan_in" (keeps forward variance) or "fan_out" (keeps backward variance).
        nonlinearity: "relu" or "leaky_relu" (see :func:`calculate_gain`).
        generator: a :class:`mpitensor.Generator` (default: the global one).

    Raises:
        ValueError: fewer than 2 dimensions, or a bad mode or nonlinearity.

    Example:
        >>> import mpitensor as mt
        >>> w = kaiming_uniform_(mt.empty(6, 1, 5, 5), a=5 ** 0.5)
        >>> bool((w.abs() <= 1 / 5).all())
        True
    """
    _check_tensor(tensor, "kaiming_uniform_")
    if _empty_warn(tensor, "kaiming_uniform_"):
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    bound = math.sqrt(3.0) * gain / math.sqrt(fan)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(
    tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
    generator: Any = None,
) -> Tensor:
    """Fill ``tensor`` from N(0, std²), std = gain/√fan (He et al.); arguments as above.

    Example:
        >>> import mpitensor as mt
        >>> kaiming_normal_(mt.empty(4, 3), nonlinearity="relu").shape
        mpitensor.Size([4, 3])
    """
    _check_tensor(tensor, "kaiming_normal_")
    if _empty_warn(tensor, "kaiming_normal_"):
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    std = calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return normal_(tensor, 0.0, std, generator)
