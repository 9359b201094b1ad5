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
import numbers
import warnings
from typing import Any, Optional

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor, rand, randn

__all__ = [
    "calculate_gain", "constant_", "eye_", "kaiming_normal_", "kaiming_uniform_", "normal_",
    "ones_", "trunc_normal_", "uniform_", "xavier_normal_", "xavier_uniform_", "zeros_",
]

# Layers that are linear in their input leave the variance alone, and so does a sigmoid
# near 0; each of these needs no correction of the weight scale.
_NO_CORRECTION = frozenset({
    "linear", "sigmoid", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
})
_FIXED_GAIN = {"tanh": 5.0 / 3, "relu": math.sqrt(2.0), "selu": 0.75}
_LEAKY_RELU_DEFAULT_SLOPE = 0.01
# in the order _calculate_fan_in_and_fan_out returns them
_FAN_MODES = ("fan_in", "fan_out")
# Rejection sampling for trunc_normal_ gives up after this many rounds of redrawing.
_MAX_REDRAWS = 1000


# --------------------------------------------------------------------------------------------
# Shared steps


def _float_storage(tensor: Any, fname: str) -> Any:
    """The array behind ``tensor``; it is written in place, which keeps autograd out."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{fname}() takes a mpitensor Tensor, got {type(tensor).__name__}")
    data = tensor._data
    if not _dt.is_floating_dtype(data.dtype):
        raise TypeError(
            f"{fname}() needs a floating point tensor, got dtype {data.dtype}; convert it "
            f"first, e.g. t.float()"
        )
    return data


def _fill_scaled(tensor: Tensor, fname: str, law: str, scale: float, shift: float,
                 generator: Any) -> Tensor:
    """Write ``scale * z + shift`` into ``tensor``, z standard uniform [0, 1) or normal."""
    data = _float_storage(tensor, fname)
    draw = rand if law == "uniform" else randn
    # drawn with the tensor's dtype and device, so no copy crosses devices or widens
    z = draw(*data.shape, generator=generator, dtype=data.dtype,
             device=_backend.device_of(data))._data
    z *= scale
    z += shift
    data[...] = z
    return tensor


def _nothing_to_fill(tensor: Tensor, fname: str) -> bool:
    """Warn and answer True when ``tensor`` has no elements."""
    shape = tuple(tensor.shape)
    if 0 not in shape:
        return False
    warnings.warn(f"{fname} on a zero-element tensor of shape {shape} does nothing",
                  stacklevel=3)
    return True


# --------------------------------------------------------------------------------------------
# Gains and fans


def calculate_gain(nonlinearity: str, param: Optional[float] = None) -> float:
    """Return the factor that keeps activations' variance steady through ``nonlinearity``.

    Args:
        nonlinearity: "linear", "conv1d/2d/3d", "conv_transpose1d/2d/3d", "sigmoid", "tanh",
            "relu", "leaky_relu" or "selu".
        param: the negative slope of "leaky_relu" (default 0.01); ignored otherwise.

    Returns:
        1 for the linear layers and sigmoid, 5/3 for tanh, √2 for relu,
        √(2 / (1 + slope²)) for leaky_relu, 3/4 for selu.

    Raises:
        ValueError: an unknown nonlinearity or a slope that is not a number.

    Example:
        >>> calculate_gain("relu") == 2 ** 0.5
        True
    """
    if nonlinearity in _NO_CORRECTION:
        return 1
    if nonlinearity in _FIXED_GAIN:
        return _FIXED_GAIN[nonlinearity]
    if nonlinearity != "leaky_relu":
        raise ValueError(
            f"Unsupported nonlinearity {nonlinearity}: calculate_gain knows "
            f"{', '.join(sorted(_NO_CORRECTION | set(_FIXED_GAIN) | {'leaky_relu'}))}"
        )
    slope = _LEAKY_RELU_DEFAULT_SLOPE if param is None else param
    if isinstance(slope, bool) or not isinstance(slope, numbers.Real):
        raise ValueError(f"leaky_relu's negative_slope must be a real number, got {param!r}")
    return math.sqrt(2.0 / (1 + slope**2))


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple:
    """Return ``(fan_in, fan_out)`` of a weight shaped ``(out, in, *kernel)``.

    Each fan is the channel count on its side times the number of kernel positions, i.e. how
    many inputs feed one output and how many outputs one input feeds. (The name is torch's,
    kept for code that calls ``nn.init._calculate_fan_in_and_fan_out`` directly.)

    Raises:
        ValueError: the tensor has fewer than 2 dimensions.
    """
    shape = tuple(tensor.shape)
    if len(shape) < 2:
        raise ValueError(
            f"fan_in/fan_out need a weight shaped (out, in, *kernel), but shape {shape} has "
            f"fewer than 2 dimensions"
        )
    n_out, n_in, *kernel = shape
    taps = math.prod(kernel)
    return n_in * taps, n_out * taps


def _fan_for_mode(tensor: Tensor, mode: str) -> int:
    chosen = mode.lower()
    if chosen not in _FAN_MODES:
        raise ValueError(f"Mode {chosen} not supported: pass mode='fan_in' or mode='fan_out'")
    return dict(zip(_FAN_MODES, _calculate_fan_in_and_fan_out(tensor)))[chosen]


# --------------------------------------------------------------------------------------------
# Plain distributions and constants


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
    if a > b:
        raise ValueError(f"uniform_ needs a <= b, got a={a} and b={b}; swap them")
    return _fill_scaled(tensor, "uniform_", "uniform", b - a, a, generator)


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
    if std < 0:
        raise ValueError(f"normal_ needs a standard deviation >= 0, got std={std}")
    return _fill_scaled(tensor, "normal_", "normal", std, mean, generator)


def _redraw_outside(flat: Any, mean: float, std: float, a: float, b: float,
                    generator: Any) -> bool:
    """Replace the entries of ``flat`` outside ``[a, b]`` until none is left; False if stuck."""
    outside = ((flat < a) | (flat > b)).nonzero()[0]
    for _ in range(_MAX_REDRAWS):
        if outside.size == 0:
            return True
        fresh = randn(outside.size, generator=generator, dtype=flat.dtype,
                      device=_backend.device_of(flat))._data * std + mean
        flat[outside] = fresh
        outside = outside[(fresh < a) | (fresh > b)]
    return outside.size == 0


def trunc_normal_(
    tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
    generator: Any = None,
) -> Tensor:
    """Fill ``tensor`` from N(mean, std²) restricted to ``[a, b]``; returns it.

    Values are drawn from the full normal and those that fall outside are drawn again, which
    gives exactly the truncated law.

    Raises:
        ValueError: ``a >= b``, ``std <= 0``, or an interval so far in the tail that redrawing
            does not converge (use a wider one).

    Example:
        >>> import mpitensor as mt
        >>> bool((trunc_normal_(mt.empty(1000), a=-1.0, b=1.0).abs() <= 1).all())
        True
    """
    data = _float_storage(tensor, "trunc_normal_")
    if not a < b or std <= 0:
        raise ValueError(f"trunc_normal_ needs a < b and std > 0, got a={a}, b={b}, std={std}")
    samples = randn(data.size, generator=generator, dtype=data.dtype,
                    device=_backend.device_of(data))._data * std + mean
    if not _redraw_outside(samples, mean, std, a, b, generator):
        raise ValueError(
            f"trunc_normal_: [a, b] = [{a}, {b}] holds too little of N({mean}, {std}**2) to "
            f"sample by redrawing; widen the interval or move the mean into it"
        )
    data[...] = samples.reshape(data.shape)
    return tensor


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill ``tensor`` with ``val``; returns it.

    Example:
        >>> import mpitensor as mt
        >>> constant_(mt.empty(2), 0.5)
        tensor([0.5000, 0.5000])
    """
    _float_storage(tensor, "constant_").fill(val)
    return tensor


def ones_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with ones; returns it."""
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with zeros; returns it."""
    return constant_(tensor, 0.0)


def eye_(tensor: Tensor) -> Tensor:
    """Fill a 2-D ``tensor`` with ones on the main diagonal and zeros elsewhere; returns it.

    Raises:
        ValueError: the tensor is not 2-D.
    """
    data = _float_storage(tensor, "eye_")
    if data.ndim != 2:
        raise ValueError(
            f"eye_ fills a matrix, but got a {data.ndim}-D tensor of shape {tuple(data.shape)}"
        )
    data.fill(0)
    diag = _backend.array_module(data).arange(min(data.shape))
    data[diag, diag] = 1
    return tensor


# --------------------------------------------------------------------------------------------
# Scaled by the fans (Glorot & Bengio 2010; He et al. 2015)


def _glorot_std(tensor: Tensor, gain: float) -> float:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Fill ``tensor`` from U(-a, a) with a = gain·√(6 / (fan_in + fan_out)) (Glorot).

    Example:
        >>> import mpitensor as mt
        >>> bool((xavier_uniform_(mt.empty(3, 5)).abs() <= 0.75 ** 0.5).all())
        True
    """
    # a uniform law on [-a, a] has standard deviation a / √3
    bound = math.sqrt(3.0) * _glorot_std(tensor, gain)
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Fill ``tensor`` from N(0, std²) with std = gain·√(2 / (fan_in + fan_out)) (Glorot)."""
    return normal_(tensor, 0.0, _glorot_std(tensor, gain), generator)


def _he_std(tensor: Tensor, a: float, mode: str, nonlinearity: str) -> float:
    return calculate_gain(nonlinearity, a) / math.sqrt(_fan_for_mode(tensor, mode))


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
        nonlinearity: a name :func:`calculate_gain` knows, usually "relu" or "leaky_relu".
        generator: a :class:`mpitensor.Generator` (default: the global one).

    Raises:
        ValueError: fewer than 2 dimensions, or a bad mode or nonlinearity.

    Example:
        >>> import mpitensor as mt
        >>> w = kaiming_uniform_(mt.empty(6, 1, 5, 5), a=5 ** 0.5)
        >>> bool((w.abs() <= 1 / 5).all())
        True
    """
    _float_storage(tensor, "kaiming_uniform_")
    if _nothing_to_fill(tensor, "kaiming_uniform_"):
        return tensor
    bound = math.sqrt(3.0) * _he_std(tensor, a, mode, nonlinearity)
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
    _float_storage(tensor, "kaiming_normal_")
    if _nothing_to_fill(tensor, "kaiming_normal_"):
        return tensor
    return normal_(tensor, 0.0, _he_std(tensor, a, mode, nonlinearity), generator)
