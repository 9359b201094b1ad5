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
from mpitensor._ops.create import BadValueError, UnsupportedDtypeError
from mpitensor.tensor import Tensor, rand, randn, randperm

__all__ = [
    "calculate_gain", "constant_", "dirac_", "eye_", "kaiming_normal_", "kaiming_uniform_",
    "normal_", "ones_", "orthogonal_", "sparse_", "trunc_normal_", "uniform_",
    "xavier_normal_", "xavier_uniform_", "zeros_",
    # the old spellings without the underscore: they warn, then do the same
    "constant", "dirac", "eye", "kaiming_normal", "kaiming_uniform", "normal", "orthogonal",
    "sparse", "uniform", "xavier_normal", "xavier_uniform",
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
# trunc_normal_'s rejection rounds keep a third of the draws or more each; this bound is
# only a guard against a bug.
_MAX_REDRAWS = 1000


# --------------------------------------------------------------------------------------------
# Shared steps


def _storage(tensor: Any, fname: str) -> Any:
    """The array behind ``tensor`` (any dtype); it is written in place, which keeps autograd
    out."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{fname}() takes a mpitensor Tensor, got {type(tensor).__name__}")
    return tensor._data


def _float_storage(tensor: Any, fname: str) -> Any:
    """The array behind a floating point ``tensor`` (see :func:`_storage`).

    Raises:
        UnsupportedDtypeError: (a ``TypeError`` and ``NotImplementedError``) another dtype.
    """
    data = _storage(tensor, fname)
    if not _dt.is_floating_dtype(data.dtype):
        raise UnsupportedDtypeError(
            f"{fname}() needs a floating point tensor, got dtype {data.dtype}; convert it "
            f"first, e.g. t.float()"
        )
    return data


def _fill_scaled(tensor: Tensor, fname: str, law: str, scale: float, shift: float,
                 generator: Any) -> Tensor:
    """Write ``scale * z + shift`` into ``tensor``, z standard uniform [0, 1) or normal."""
    data = _float_storage(tensor, fname)
    if _backend.device_of(data).type == "meta":
        return tensor  # nothing to fill and, as in torch, no numbers drawn
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
        UnsupportedDtypeError: (a ``TypeError`` and ``NotImplementedError``) not a floating
            point Tensor.
        BadValueError: (a ``ValueError`` and ``RuntimeError``) ``a > b``.

    Example:
        >>> import mpitensor as mt
        >>> bool((uniform_(mt.empty(100), -1, 1).abs() <= 1).all())
        True
    """
    _float_storage(tensor, "uniform_")
    if a > b:
        raise BadValueError(f"uniform_ needs a <= b, got a={a} and b={b}; swap them")
    return _fill_scaled(tensor, "uniform_", "uniform", b - a, a, generator)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Tensor:
    """Fill ``tensor`` with numbers drawn from N(mean, std²); returns it.

    Raises:
        UnsupportedDtypeError: (a ``TypeError`` and ``NotImplementedError``) not a floating
            point Tensor.
        BadValueError: (a ``ValueError`` and ``RuntimeError``) ``std < 0``.

    Example:
        >>> import mpitensor as mt
        >>> normal_(mt.empty(2, 3), 0.0, 0.02).shape
        mpitensor.Size([2, 3])
    """
    _float_storage(tensor, "normal_")
    if std < 0:
        raise BadValueError(f"normal_ needs a standard deviation >= 0, got std={std}")
    return _fill_scaled(tensor, "normal_", "normal", std, mean, generator)


def _truncated_standard(n: int, lo: float, hi: float, generator: Any, device: Any) -> Any:
    """``n`` float64 draws from N(0, 1) restricted to ``[lo, hi]``, exactly, by rejection from
    a proposal chosen so that a good share of draws is kept wherever the interval lies:

    - an interval across 0 and at least 1 wide: the normal itself (keeps >= 34 %);
    - one across 0 and narrower: a uniform on it, kept with probability exp(-z²/2) (>= 60 %);
    - one on a side of 0, say ``lo >= 0``: a uniform on it, kept with probability
      exp((lo² - z²)/2), when ``lo·(hi - lo) < 1``; otherwise ``lo`` plus an exponential of
      rate λ = (lo + √(lo² + 4))/2, kept with probability exp(-(z - λ)²/2) (Robert 1995).
      ``hi <= 0`` is the mirror image.
    """
    m = _backend.array_module(rand(1, device=device)._data)
    flip = hi <= 0 and lo < 0
    if flip:
        lo, hi = -hi, -lo
    out = m.empty(n, dtype=_dt.float64)
    todo = m.arange(n)

    def uniform(k: int) -> Any:
        return rand(k, generator=generator, dtype=_dt.float64, device=device)._data

    lam = (lo + math.sqrt(lo * lo + 4.0)) / 2 if lo >= 0 else 0.0
    for _ in range(_MAX_REDRAWS):
        k = int(todo.size)
        if k == 0:
            break
        if lo < 0 and hi - lo >= 1.0:
            z = randn(k, generator=generator, dtype=_dt.float64, device=device)._data
            keep = (z >= lo) & (z <= hi)
        elif lo < 0:
            z = lo + (hi - lo) * uniform(k)
            keep = uniform(k) < m.exp(-z * z / 2)
        elif lo * (hi - lo) < 1.0:
            z = lo + (hi - lo) * uniform(k)
            keep = uniform(k) < m.exp((lo * lo - z * z) / 2)
        else:
            z = lo - m.log1p(-uniform(k)) / lam
            keep = (uniform(k) < m.exp(-((z - lam) ** 2) / 2)) & (z <= hi)
        out[todo[keep]] = z[keep]
        todo = todo[~keep]
    if todo.size:  # each round keeps a third or more, so this is never reached in practice
        raise RuntimeError(f"trunc_normal_: sampling [{lo}, {hi}] did not converge")
    return -out if flip else out


def trunc_normal_(
    tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
    generator: Any = None,
) -> Tensor:
    """Fill ``tensor`` from N(mean, std²) restricted to ``[a, b]``; returns it.

    Sampling is exact wherever ``[a, b]`` lies, far tails included (rejection from a
    proposal fitted to the interval, see :func:`_truncated_standard`), so unlike torch there
    is no warning when ``mean`` is far from ``[a, b]``. A negative ``std`` acts as ``|std|``
    (the law depends on its square), as in torch.

    Raises:
        UnsupportedDtypeError: (a ``TypeError`` and ``NotImplementedError``) not a floating
            point Tensor.
        BadValueError: (a ``ValueError`` and ``RuntimeError``) ``a > b``.
        ZeroDivisionError: ``std == 0`` (as in torch).

    Example:
        >>> import mpitensor as mt
        >>> bool((trunc_normal_(mt.empty(1000), a=-1.0, b=1.0).abs() <= 1).all())
        True
    """
    data = _float_storage(tensor, "trunc_normal_")
    if a > b:
        raise BadValueError(f"trunc_normal_ needs a <= b, got a={a}, b={b}")
    if std == 0:
        raise ZeroDivisionError("trunc_normal_ needs std != 0")
    if _backend.is_meta_array(data):
        return tensor  # nothing to fill and, as in torch, no numbers drawn
    std = abs(std)
    lo, hi = (a - mean) / std, (b - mean) / std
    z = _truncated_standard(data.size, lo, hi, generator, _backend.device_of(data))
    m = _backend.array_module(z)
    data[...] = m.clip(mean + std * z, a, b).reshape(data.shape)
    return tensor


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill ``tensor`` (any dtype) with ``val`` (a number or a one-element tensor); returns
    it.

    Example:
        >>> import mpitensor as mt
        >>> constant_(mt.empty(2), 0.5)
        tensor([0.5000, 0.5000])
    """
    if isinstance(val, Tensor):
        val = val.item()
    _storage(tensor, "constant_")[...] = val
    return tensor


def ones_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with ones; returns it."""
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with zeros; returns it."""
    return constant_(tensor, 0.0)


def eye_(tensor: Tensor) -> Tensor:
    """Fill a 2-D ``tensor`` (any dtype) with ones on the main diagonal and zeros elsewhere;
    returns it.

    Raises:
        ValueError: the tensor is not 2-D.
    """
    data = _storage(tensor, "eye_")
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


# --------------------------------------------------------------------------------------------
# Structured initialisations (Saxe et al. 2013; Martens 2010; identity kernels)


def orthogonal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Fill ``tensor`` with a (semi-)orthogonal matrix times ``gain``; returns it.

    The tensor is seen as a matrix of ``shape[0]`` rows and the rest flattened into columns.
    A Gaussian matrix is factored ``Q·R``, and ``Q`` with each column's sign set by the sign of
    ``R``'s diagonal (which makes the law uniform over orthogonal matrices) is written: its
    rows are orthonormal when there are fewer rows than columns, its columns otherwise.

    Args:
        tensor: a floating point Tensor with at least 2 dimensions (filled in place).
        gain: the factor applied to the matrix.
        generator: a :class:`mpitensor.Generator` (default: the global one).

    Raises:
        ValueError: fewer than 2 dimensions.
        UnsupportedDtypeError: (a ``TypeError`` and ``NotImplementedError``) not a floating
            point Tensor.

    Example:
        >>> import mpitensor as mt
        >>> w = orthogonal_(mt.empty(3, 5))
        >>> bool(((w @ w.T) - mt.eye(3)).abs().max() < 1e-5)
        True
    """
    data = _float_storage(tensor, "orthogonal_")
    if data.ndim < 2:
        raise ValueError(f"orthogonal_ needs a tensor with at least 2 dimensions, got shape "
                         f"{tuple(data.shape)}")
    if data.size == 0 or _backend.is_meta_array(data):
        return tensor
    rows = data.shape[0]
    cols = data.size // rows
    work = _dt.float64 if data.dtype == _dt.float64 else _dt.float32
    a = randn(rows, cols, generator=generator, dtype=work, device=_backend.device_of(data))._data
    m = _backend.array_module(a)
    wide = rows < cols
    q, r = m.linalg.qr(a.T if wide else a)
    # the sign fix: without it Q's law leans on the QR routine's sign convention
    signs = m.sign(m.diagonal(r))
    signs[signs == 0] = 1
    q = q * signs
    if wide:
        q = q.T
    data[...] = (gain * q).reshape(data.shape)
    return tensor


def sparse_(tensor: Tensor, sparsity: float, std: float = 0.01,
            generator: Any = None) -> Tensor:
    """Fill a 2-D ``tensor`` from N(0, std²), then zero ``ceil(sparsity · rows)`` entries of
    each column, at rows chosen at random per column (Martens 2010); returns it.

    Args:
        tensor: a floating point 2-D Tensor (filled in place).
        sparsity: the fraction of each column set to zero.
        std: the standard deviation of the non-zero entries.
        generator: a :class:`mpitensor.Generator` (default: the global one).

    Raises:
        ValueError: the tensor is not 2-D.
        UnsupportedDtypeError: (a ``TypeError`` and ``NotImplementedError``) not a floating
            point Tensor.

    Example:
        >>> import mpitensor as mt
        >>> w = sparse_(mt.empty(10, 4), sparsity=0.3)
        >>> (w == 0).sum(0).tolist()
        [3, 3, 3, 3]
    """
    data = _float_storage(tensor, "sparse_")
    if data.ndim != 2:
        raise ValueError(f"sparse_ fills a matrix, but got a {data.ndim}-D tensor of shape "
                         f"{tuple(data.shape)}")
    rows, cols = data.shape
    zeros_per_col = math.ceil(sparsity * rows)
    normal_(tensor, 0.0, std, generator)
    dev = _backend.device_of(data)
    for col in range(cols):
        # sliced like a Python list, so a negative count keeps that many rows, as torch does
        picked = randperm(rows, generator=generator, device=dev)._data[:zeros_per_col]
        data[picked, col] = 0
    return tensor


def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
    """Fill a 3-, 4- or 5-D convolution weight (any dtype) so that the convolution passes its
    input through: in each of ``groups`` groups of output channels, output channel ``d`` takes
    input channel ``d`` at the kernel's centre (as many as there are channels on both sides);
    everything else is 0. Returns it.

    Args:
        tensor: a weight shaped ``(out_channels, in_channels / groups, *kernel)``.
        groups: the convolution's groups; must divide ``out_channels``.

    Raises:
        ValueError: not 3-5 dimensions, or ``groups`` does not divide ``out_channels``.
        ZeroDivisionError: ``groups`` is 0 (as in torch).

    Example:
        >>> import mpitensor as mt
        >>> dirac_(mt.empty(2, 2, 3))[:, :, 1].tolist()
        [[1.0, 0.0], [0.0, 1.0]]
    """
    data = _storage(tensor, "dirac_")
    if data.ndim not in (3, 4, 5):
        raise ValueError(f"dirac_ fills a 3-, 4- or 5-D convolution weight, got shape "
                         f"{tuple(data.shape)}")
    out_ch = data.shape[0]
    if out_ch % groups != 0:
        raise ValueError(f"dirac_: groups={groups} does not divide the {out_ch} output "
                         f"channels")
    per_group = out_ch // groups
    n = min(per_group, data.shape[1])
    data[...] = 0
    centre = tuple(k // 2 for k in data.shape[2:])
    for g in range(groups):
        for d in range(n):
            data[(g * per_group + d, d, *centre)] = 1
    return tensor


# --------------------------------------------------------------------------------------------
# The old names, without the trailing underscore


def _deprecated(new: Any) -> Any:
    old_name = new.__name__[:-1]

    def old(*args: Any, **kwargs: Any) -> Tensor:
        warnings.warn(f"nn.init.{old_name} is deprecated; use nn.init.{new.__name__}, which "
                      f"it calls", FutureWarning, stacklevel=2)
        return new(*args, **kwargs)

    old.__name__ = old.__qualname__ = old_name
    old.__doc__ = (f"Deprecated spelling of :func:`{new.__name__}`: warns (FutureWarning), "
                   f"then calls it with the same arguments.")
    return old


uniform = _deprecated(uniform_)
normal = _deprecated(normal_)
constant = _deprecated(constant_)
eye = _deprecated(eye_)
dirac = _deprecated(dirac_)
xavier_uniform = _deprecated(xavier_uniform_)
xavier_normal = _deprecated(xavier_normal_)
kaiming_uniform = _deprecated(kaiming_uniform_)
kaiming_normal = _deprecated(kaiming_normal_)
orthogonal = _deprecated(orthogonal_)
sparse = _deprecated(sparse_)
