"""Layers, containers and loss modules with ``torch.nn``'s names, arguments and reprs.

Each layer holds its parameters and configuration and calls :mod:`mpitensor.nn.functional` for
the math (and so for the gradients). Constructors check their arguments up front and raise
``ValueError`` naming the bad value, rather than failing later inside ``forward``.

Example:
    >>> import mpitensor as mt
    >>> import mpitensor.nn as nn
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> net
    Sequential(
      (0): Linear(in_features=4, out_features=8, bias=True)
      (1): ReLU()
      (2): Linear(in_features=8, out_features=2, bias=True)
    )
"""

from __future__ import annotations

import math
import operator
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Any, Optional, Union

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor.autograd import Function
from mpitensor.tensor import Tensor, empty

from . import functional as F  # noqa: N812 - torch's spelling
from . import init
from .module import Module, _addindent
from .parameter import Parameter

__all__ = [
    "Identity",
    "Linear",
    "Conv2d",
    "MaxPool2d",
    "AvgPool2d",
    "ReLU",
    "Dropout",
    "Flatten",
    "LogSoftmax",
    "Softmax",
    "Sequential",
    "ModuleList",
    "ModuleDict",
    "NLLLoss",
    "CrossEntropyLoss",
    "MSELoss",
]

_IntOrPair = Union[int, tuple]


# --------------------------------------------------------------------------------------------
# Argument checks


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
    if dt.kind != "f":
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


def _softmax_dim(name: str, ndim: int) -> int:
    warnings.warn(
        f"Implicit dimension choice for {name} has been deprecated. Change the call to include "
        f"dim=X as an argument.",
        stacklevel=3,
    )
    return 0 if ndim in (0, 1, 3) else 1


# --------------------------------------------------------------------------------------------
# Simple layers


class Identity(Module):
    """Return the input unchanged (arguments are accepted and ignored, as in torch).

    Example:
        >>> Identity(54, unused="x")(3)
        3
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, input: Any) -> Any:  # noqa: A002 - torch's name
        return input


def _reset_default(weight: Parameter, bias: Optional[Parameter]) -> None:
    """torch's default init of Linear and Conv: kaiming-uniform(a=√5), bias in ±1/√fan_in.

    fan_in is never 0 here: the constructors reject empty feature and channel counts.
    """
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = init._calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in)
        init.uniform_(bias, -bound, bound)


def _add_weight_and_bias(module: Module, wshape: tuple, bias: bool, dtype: Any,
                         device: Any) -> None:
    """Register ``weight`` (``wshape``) and ``bias`` (``wshape[0]``, or None) on ``module``,
    uninitialised, then draw them with ``module.reset_parameters()``."""
    module.weight = Parameter(empty(*wshape, dtype=dtype, device=device))
    if bias:
        module.bias = Parameter(empty(wshape[0], dtype=dtype, device=device))
    else:
        module.register_parameter("bias", None)
    module.reset_parameters()


class Linear(Module):
    """``y = x Wᵀ + b``, with ``W`` of shape (out_features, in_features).

    Args:
        in_features: size of each input sample (> 0).
        out_features: size of each output sample (> 0).
        bias: whether to learn an additive bias.
        device, dtype: where and in which float dtype to create the parameters.

    Raises:
        ValueError: a non-positive or non-integer feature count.

    Example:
        >>> import mpitensor as mt
        >>> Linear(20, 30)(mt.randn(128, 20)).shape
        mpitensor.Size([128, 30])
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True,
        device: Any = None, dtype: Any = None,
    ) -> None:
        super().__init__()
        self.in_features = _positive_int(in_features, "Linear", "in_features")
        self.out_features = _positive_int(out_features, "Linear", "out_features")
        _add_weight_and_bias(self, (self.out_features, self.in_features), bias,
                             _factory(dtype, "Linear"), device)

    def reset_parameters(self) -> None:
        """Re-draw the parameters as torch does: kaiming-uniform(a=√5), bias ±1/√fan_in."""
        _reset_default(self.weight, self.bias)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _pad_index(n: int, before: int, after: int, mode: str) -> np.ndarray:
    """For each padded position along one axis, the input position it copies."""
    if mode == "reflect" and (before >= n or after >= n):
        raise ValueError(
            f"Conv2d: padding_mode='reflect' needs padding smaller than the input size; got "
            f"padding ({before}, {after}) on a dimension of size {n}"
        )
    if mode == "circular" and (before > n or after > n):
        raise ValueError(
            f"Conv2d: padding_mode='circular' needs padding at most the input size; got "
            f"padding ({before}, {after}) on a dimension of size {n}"
        )
    idx = np.arange(-before, n + after)
    if mode == "replicate":
        return np.clip(idx, 0, n - 1)
    if mode == "circular":
        return idx % n
    period = 2 * (n - 1)
    m = idx % period if period else np.zeros_like(idx)
    return np.where(m >= n, period - m, m)


class _Pad(Function):
    """Reflect / replicate / circular padding of the last two dimensions (Conv2d's modes).

    Forward gathers rows and columns through index maps; backward scatters the gradient back
    with two small one-hot matrix products, so it runs the same on NumPy and CuPy.
    """

    @staticmethod
    def forward(ctx: Any, x: Any, pad: tuple, mode: str) -> Any:
        xp = _backend.array_module(x)
        h, w = x.shape[-2], x.shape[-1]
        rows = _pad_index(h, pad[2], pad[3], mode)
        cols = _pad_index(w, pad[0], pad[1], mode)
        if xp is not np:
            rows, cols = xp.asarray(rows), xp.asarray(cols)
        ctx.maps = (rows, cols, h, w)
        return x[..., rows[:, None], cols[None, :]]

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        rows, cols, h, w = ctx.maps
        xp = _backend.array_module(g)
        sh = (rows[:, None] == xp.arange(h)[None, :]).astype(g.dtype)
        sw = (cols[:, None] == xp.arange(w)[None, :]).astype(g.dtype)
        return (sh.T @ g @ sw, None, None)



class Conv2d(Module):
    """2-D convolution (cross-correlation) over an NCHW input, as ``torch.nn.Conv2d``.

    Args:
        in_channels, out_channels: channel counts (> 0, divisible by ``groups``).
        kernel_size: an int or a pair (> 0).
        stride: an int or a pair (> 0).
        padding: an int or a pair (>= 0), or "valid" / "same".
        dilation: an int or a pair (> 0).
        groups: blocked connections from input to output channels.
        bias: whether to learn an additive bias.
        padding_mode: "zeros", "reflect", "replicate" or "circular".
        device, dtype: where and in which float dtype to create the parameters.

    Raises:
        ValueError: a bad size, an indivisible channel count, an unknown padding or padding
            mode, or padding="same" with a stride other than 1.

    Example:
        >>> import mpitensor as mt
        >>> Conv2d(1, 6, 5, padding=2)(mt.randn(2, 1, 28, 28)).shape
        mpitensor.Size([2, 6, 28, 28])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: _IntOrPair,
        stride: _IntOrPair = 1,
        padding: Union[_IntOrPair, str] = 0,
        dilation: _IntOrPair = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        c = "Conv2d"
        self.in_channels = _positive_int(in_channels, c, "in_channels")
        self.out_channels = _positive_int(out_channels, c, "out_channels")
        self.groups = _positive_int(groups, c, "groups")
        if self.in_channels % self.groups:
            raise ValueError(f"Conv2d: in_channels ({in_channels}) must be divisible by groups "
                             f"({groups})")
        if self.out_channels % self.groups:
            raise ValueError(f"Conv2d: out_channels ({out_channels}) must be divisible by groups "
                             f"({groups})")
        self.kernel_size = _pair(kernel_size, c, "kernel_size", 1)
        self.stride = _pair(stride, c, "stride", 1)
        self.dilation = _pair(dilation, c, "dilation", 1)
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"Conv2d: padding_mode must be one of {list(_PADDING_MODES)}, got "
                             f"{padding_mode!r}")
        self.padding_mode = padding_mode
        self.output_padding = (0, 0)
        self.transposed = False
        # (left, right, top, bottom): torch's order, used when padding_mode is not "zeros"
        if isinstance(padding, str):
            if padding not in ("valid", "same"):
                raise ValueError(f"Conv2d: invalid padding string {padding!r}, should be one of "
                                 f"['valid', 'same']")
            if padding == "same" and self.stride != (1, 1):
                raise ValueError("Conv2d: padding='same' is not supported for strided "
                                 "convolutions; use stride=1 or an explicit padding")
            self.padding: Any = padding
            totals = [0, 0] if padding == "valid" else [
                d * (k - 1) for d, k in zip(self.dilation, self.kernel_size)
            ]
            pad4 = []
            for total in reversed(totals):
                left = total // 2
                pad4 += [left, total - left]
        else:
            self.padding = _pair(padding, c, "padding", 0)
            pad4 = []
            for p in reversed(self.padding):
                pad4 += [p, p]
        self._reversed_padding_repeated_twice = tuple(pad4)
        _add_weight_and_bias(self, (self.out_channels, self.in_channels // self.groups,
                                    *self.kernel_size), bias, _factory(dtype, c), device)

    def reset_parameters(self) -> None:
        """Re-draw the parameters as torch does: kaiming-uniform(a=√5), bias ±1/√fan_in."""
        _reset_default(self.weight, self.bias)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        if self.padding_mode != "zeros":
            input = _Pad.apply(input, self._reversed_padding_repeated_twice, self.padding_mode)
            return F.conv2d(input, self.weight, self.bias, self.stride, 0, self.dilation,
                            self.groups)
        return F.conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0,) * len(self.padding):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class MaxPool2d(Module):
    """2-D max pooling over an NCHW input, as ``torch.nn.MaxPool2d``.

    Args:
        kernel_size: window size, an int or a pair (> 0).
        stride: window step (default ``kernel_size``).
        padding: implicit -inf padding on both sides, at most half the kernel size.
        dilation: spacing between window elements (> 0).
        return_indices: also return the argmax indices (for ``MaxUnpool2d``).
        ceil_mode: use ceil instead of floor for the output size.

    Raises:
        ValueError: a non-positive size, or padding larger than half the kernel.

    Example:
        >>> import mpitensor as mt
        >>> MaxPool2d(2)(mt.randn(1, 1, 28, 28)).shape
        mpitensor.Size([1, 1, 14, 14])
    """

    def __init__(
        self, kernel_size: _IntOrPair, stride: Optional[_IntOrPair] = None,
        padding: _IntOrPair = 0, dilation: _IntOrPair = 1, return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__()
        c = "MaxPool2d"
        ks = _pair(kernel_size, c, "kernel_size", 1)
        if stride is not None:
            _pair(stride, c, "stride", 1)
        pad = _pair(padding, c, "padding", 0)
        dil = _pair(dilation, c, "dilation", 1)
        if any(2 * p > (k - 1) * d + 1 for p, k, d in zip(pad, ks, dil)):
            raise ValueError(f"MaxPool2d: pad should be at most half of effective kernel size, "
                             f"but got pad={padding}, kernel_size={kernel_size} and "
                             f"dilation={dilation}")
        # torch keeps the arguments as given (an int stays an int) and prints them so
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = bool(return_indices)
        self.ceil_mode = bool(ceil_mode)

    def forward(self, input: Tensor) -> Any:  # noqa: A002 - torch's name
        return F.max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                            ceil_mode=self.ceil_mode, return_indices=self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """2-D average pooling over an NCHW input, as ``torch.nn.AvgPool2d``.

    Args:
        kernel_size: window size, an int or a pair (> 0).
        stride: window step (default ``kernel_size``).
        padding: implicit zero padding on both sides, at most half the kernel size.
        ceil_mode: use ceil instead of floor for the output size.
        count_include_pad: count the padding zeros in the average.
        divisor_override: divide by this instead of the window size.

    Raises:
        ValueError: a non-positive size, padding larger than half the kernel, or a
            non-positive divisor_override.

    Example:
        >>> import mpitensor as mt
        >>> AvgPool2d(2)(mt.ones(1, 1, 4, 4)).shape
        mpitensor.Size([1, 1, 2, 2])
    """

    def __init__(
        self, kernel_size: _IntOrPair, stride: Optional[_IntOrPair] = None,
        padding: _IntOrPair = 0, ceil_mode: bool = False, count_include_pad: bool = True,
        divisor_override: Optional[int] = None,
    ) -> None:
        super().__init__()
        c = "AvgPool2d"
        ks = _pair(kernel_size, c, "kernel_size", 1)
        if stride is not None:
            _pair(stride, c, "stride", 1)
        pad = _pair(padding, c, "padding", 0)
        if any(2 * p > k for p, k in zip(pad, ks)):
            raise ValueError(f"AvgPool2d: pad should be at most half of kernel size, but got "
                             f"pad={padding} and kernel_size={kernel_size}")
        if divisor_override is not None:
            _positive_int(divisor_override, c, "divisor_override")
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.ceil_mode = bool(ceil_mode)
        self.count_include_pad = bool(count_include_pad)
        self.divisor_override = divisor_override

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class ReLU(Module):
    """``max(0, x)`` elementwise.

    Args:
        inplace: overwrite the input (saves memory).

    Example:
        >>> import mpitensor as mt
        >>> ReLU()(mt.tensor([-1.0, 2.0]))
        tensor([0., 2.])
    """

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = bool(inplace)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.relu(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Dropout(Module):
    """Zero each element with probability ``p`` in training, scaling the rest by 1/(1-p).

    In evaluation mode (``model.eval()``) it is the identity. The mask is drawn from
    mpitensor's global generator (``mpitensor.manual_seed``).

    Args:
        p: probability of zeroing an element, in [0, 1].
        inplace: overwrite the input.

    Raises:
        ValueError: ``p`` outside [0, 1].

    Example:
        >>> import mpitensor as mt
        >>> d = Dropout(0.5).eval()
        >>> d(mt.ones(3))
        tensor([1., 1., 1.])
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float, np.floating, np.integer)) \
                or not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p!r}")
        self.p = float(p)
        self.inplace = bool(inplace)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.dropout(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Flatten(Module):
    """Flatten dimensions ``start_dim`` to ``end_dim`` into one (default: all but the batch).

    Raises:
        ValueError: a non-integer dimension.

    Example:
        >>> import mpitensor as mt
        >>> Flatten()(mt.zeros(2, 16, 5, 5)).shape
        mpitensor.Size([2, 400])
    """

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        if not _is_int(start_dim) or not _is_int(end_dim):
            raise ValueError(f"Flatten: start_dim and end_dim must be ints, got {start_dim!r} "
                             f"and {end_dim!r}")
        self.start_dim = int(start_dim)
        self.end_dim = int(end_dim)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.flatten(input, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class _SoftmaxLike(Module):
    """Shared body of :class:`LogSoftmax` and :class:`Softmax`: ``_fname`` names the F op."""

    _fname = ""

    def __init__(self, dim: Optional[int] = None) -> None:
        super().__init__()
        if dim is not None and not _is_int(dim):
            raise ValueError(f"{type(self).__name__}: dim must be an int or None, got {dim!r}")
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        dim = self.dim if self.dim is not None else _softmax_dim(self._fname, input.ndim)
        return getattr(F, self._fname)(input, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(_SoftmaxLike):
    """``log(softmax(x))`` along ``dim``, computed stably.

    Example:
        >>> import mpitensor as mt
        >>> LogSoftmax(dim=1)(mt.zeros(1, 2)).exp()
        tensor([[0.5000, 0.5000]])
    """

    _fname = "log_softmax"


class Softmax(_SoftmaxLike):
    """``exp(x) / sum(exp(x))`` along ``dim``.

    Example:
        >>> import mpitensor as mt
        >>> Softmax(dim=0)(mt.zeros(2))
        tensor([0.5000, 0.5000])
    """

    _fname = "softmax"


# --------------------------------------------------------------------------------------------
# Losses


class _Loss(Module):
    def __init__(
        self, size_average: Any = None, reduce: Any = None, reduction: str = "mean"
    ) -> None:
        super().__init__()
        self.reduction = _reduction(size_average, reduce, reduction, type(self).__name__)


class _WeightedLoss(_Loss):
    def __init__(
        self, weight: Optional[Tensor] = None, size_average: Any = None, reduce: Any = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        if weight is not None:
            if not isinstance(weight, Tensor):
                raise TypeError(f"{type(self).__name__}: weight must be a 1-D Tensor of class "
                                f"weights, got {type(weight).__name__}")
            if weight.ndim != 1:
                raise ValueError(f"{type(self).__name__}: weight must be 1-D (one weight per "
                                 f"class), got shape {tuple(weight.shape)}")
        self.register_buffer("weight", weight)


class NLLLoss(_WeightedLoss):
    """Negative log-likelihood of class ``target`` under log-probabilities ``input``.

    Args:
        weight: a 1-D tensor of per-class weights.
        ignore_index: a target value that contributes neither loss nor gradient.
        reduction: "mean" (weighted mean), "sum" or "none".
        size_average, reduce: torch's deprecated flags, folded into ``reduction``.

    Raises:
        ValueError: an unknown reduction or a weight that is not 1-D.

    Example:
        >>> import mpitensor as mt
        >>> NLLLoss()(mt.tensor([[-0.5, -1.0]]), mt.tensor([1]))
        tensor(1.)
    """

    def __init__(
        self, weight: Optional[Tensor] = None, size_average: Any = None, ignore_index: int = -100,
        reduce: Any = None, reduction: str = "mean",
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        if not _is_int(ignore_index):
            raise ValueError(f"NLLLoss: ignore_index must be an int, got {ignore_index!r}")
        self.ignore_index = int(ignore_index)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index,
                          reduction=self.reduction)


class CrossEntropyLoss(_WeightedLoss):
    """``nll_loss(log_softmax(input, 1), target)`` with optional label smoothing.

    Args:
        weight: a 1-D tensor of per-class weights.
        ignore_index: a target value that contributes neither loss nor gradient.
        reduction: "mean", "sum" or "none".
        label_smoothing: in [0, 1]; mixes the target with the uniform distribution.
        size_average, reduce: torch's deprecated flags, folded into ``reduction``.

    Raises:
        ValueError: an unknown reduction, a weight that is not 1-D, or label_smoothing outside
            [0, 1].

    Example:
        >>> import mpitensor as mt
        >>> round(float(CrossEntropyLoss()(mt.zeros(1, 2), mt.tensor([0]))), 4)
        0.6931
    """

    def __init__(
        self, weight: Optional[Tensor] = None, size_average: Any = None, ignore_index: int = -100,
        reduce: Any = None, reduction: str = "mean", label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        if not _is_int(ignore_index):
            raise ValueError(f"CrossEntropyLoss: ignore_index must be an int, got "
                             f"{ignore_index!r}")
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
                or not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be between 0.0 and 1.0, "
                             f"got {label_smoothing!r}")
        self.ignore_index = int(ignore_index)
        self.label_smoothing = float(label_smoothing)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        if self.label_smoothing:
            return F.cross_entropy(input, target, weight=self.weight,
                                   ignore_index=self.ignore_index, reduction=self.reduction,
                                   label_smoothing=self.label_smoothing)
        return F.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction)


class MSELoss(_Loss):
    """Mean (or summed) squared error between ``input`` and ``target``.

    Args:
        reduction: "mean", "sum" or "none".
        size_average, reduce: torch's deprecated flags, folded into ``reduction``.

    Raises:
        ValueError: an unknown reduction.

    Example:
        >>> import mpitensor as mt
        >>> MSELoss()(mt.tensor([1.0, 3.0]), mt.tensor([0.0, 0.0]))
        tensor(5.)
    """

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.mse_loss(input, target, reduction=self.reduction)


# --------------------------------------------------------------------------------------------
# Containers


def _index(idx: Any, size: int, cls: str) -> int:
    i = operator.index(idx)
    if not -size <= i < size:
        raise IndexError(f"index {i} is out of range for a {cls} of length {size}")
    return i % size


class Sequential(Module):
    """Run modules one after another; built from modules or from an OrderedDict of them.

    Supports indexing (a slice gives a Sequential), ``len``, iteration, ``append``,
    ``insert``, ``extend``, ``pop``, ``del`` and ``+``.

    Raises:
        TypeError: an element is not a Module.

    Example:
        >>> from collections import OrderedDict
        >>> net = Sequential(OrderedDict([("fc", Linear(2, 2)), ("act", ReLU())]))
        >>> [n for n, _ in net.named_children()], len(net[:1])
        (['fc', 'act'], 1)
    """

    def __init__(self, *args: Any) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for idx, module in enumerate(args):
                self.add_module(str(idx), module)

    def forward(self, input: Any) -> Any:  # noqa: A002 - torch's name
        for module in self._modules.values():
            input = module(input)
        return input

    def __getitem__(self, idx: Union[int, slice]) -> Any:
        if isinstance(idx, slice):
            return type(self)(OrderedDict(list(self._modules.items())[idx]))
        i = _index(idx, len(self._modules), "Sequential")
        return next(islice(iter(self._modules.values()), i, None))

    def __setitem__(self, idx: int, module: Module) -> None:
        i = _index(idx, len(self._modules), "Sequential")
        key = next(islice(iter(self._modules), i, None))
        setattr(self, key, module)

    def __delitem__(self, idx: Union[int, slice]) -> None:
        keys = list(self._modules)
        if isinstance(idx, slice):
            for key in keys[idx]:
                del self._modules[key]
        else:
            del self._modules[keys[_index(idx, len(keys), "Sequential")]]
        # torch renumbers so that indexing keeps working after a deletion
        self._renumber()

    def _renumber(self) -> None:
        items = list(self._modules.values())
        self._modules.clear()
        for i, m in enumerate(items):
            self._modules[str(i)] = m

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __add__(self, other: Sequential) -> Sequential:
        if not isinstance(other, Sequential):
            raise ValueError(f"add operator supports only objects of Sequential class, but "
                             f"{type(other)} is given.")
        ret = Sequential()
        for layer in self:
            ret.append(layer)
        for layer in other:
            ret.append(layer)
        return ret

    def __iadd__(self, other: Sequential) -> Sequential:
        if not isinstance(other, Sequential):
            raise ValueError(f"add operator supports only objects of Sequential class, but "
                             f"{type(other)} is given.")
        for layer in list(other):
            self.append(layer)
        return self

    def append(self, module: Module) -> Sequential:
        """Add ``module`` at the end; returns self."""
        self.add_module(str(len(self)), module)
        return self

    def insert(self, index: int, module: Module) -> Sequential:
        """Insert ``module`` before position ``index``; returns self."""
        if not isinstance(module, Module):
            raise AssertionError(f"module should be of type: {Module}")
        n = len(self._modules)
        if not -n <= index <= n:
            raise IndexError(f"Index out of range: {index}")
        if index < 0:
            index += n
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(items):
            self._modules[str(i)] = m
        return self

    def extend(self, sequential: Iterable[Module]) -> Sequential:
        """Append every module of ``sequential``; returns self."""
        for layer in sequential:
            self.append(layer)
        return self

    def pop(self, key: Union[int, slice]) -> Module:
        """Remove and return the module at ``key``."""
        v = self[key]
        del self[key]
        return v

    def __dir__(self) -> list:
        return [k for k in super().__dir__() if not k.isdigit()]


class ModuleList(Module):
    """A list of modules, registered so that ``parameters()`` and ``to()`` see them.

    Raises:
        TypeError: an element is not a Module.

    Example:
        >>> layers = ModuleList([Linear(2, 2) for _ in range(3)])
        >>> len(list(layers.parameters()))
        6
    """

    def __init__(self, modules: Optional[Iterable[Module]] = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, idx: Union[int, slice]) -> Any:
        if isinstance(idx, slice):
            return type(self)(list(self._modules.values())[idx])
        return self._modules[str(_index(idx, len(self), "ModuleList"))]

    def __setitem__(self, idx: int, module: Module) -> None:
        setattr(self, str(_index(idx, len(self), "ModuleList")), module)

    def __delitem__(self, idx: Union[int, slice]) -> None:
        if isinstance(idx, slice):
            for k in range(len(self._modules))[idx]:
                delattr(self, str(k))
        else:
            delattr(self, str(_index(idx, len(self), "ModuleList")))
        items = list(self._modules.values())
        self._modules.clear()
        for i, m in enumerate(items):
            self._modules[str(i)] = m

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        combined = ModuleList()
        for m in self:
            combined.append(m)
        for m in other:
            combined.append(m)
        return combined

    def insert(self, index: int, module: Module) -> None:
        """Insert ``module`` before position ``index``."""
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList.insert: {type(module).__name__} is not a Module")
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(items):
            self._modules[str(i)] = m

    def append(self, module: Module) -> ModuleList:
        """Add ``module`` at the end; returns self."""
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        """Append every module of ``modules``; returns self.

        Raises:
            TypeError: ``modules`` is not iterable.
        """
        if not isinstance(modules, Iterable):
            raise TypeError("ModuleList.extend should be called with an iterable, but got "
                            + type(modules).__name__)
        offset = len(self)
        for i, module in enumerate(modules):
            self.add_module(str(offset + i), module)
        return self

    def pop(self, key: Union[int, slice]) -> Module:
        """Remove and return the module at ``key``."""
        v = self[key]
        del self[key]
        return v

    def __repr__(self) -> str:
        reprs = [repr(m) for m in self]
        if not reprs:
            return self._get_name() + "()"
        spans = [[0, 0]]
        blocks = [reprs[0]]
        for i, r in enumerate(reprs[1:], 1):
            if r == blocks[-1]:
                spans[-1][1] += 1
                continue
            spans.append([i, i])
            blocks.append(r)
        lines = []
        for (start, end), b in zip(spans, blocks):
            line = f"({start}): {b}"
            if start != end:
                line = f"({start}-{end}): {end - start + 1} x {b}"
            lines.append(_addindent(line, 2))
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"

    def __dir__(self) -> list:
        return [k for k in super().__dir__() if not k.isdigit()]


class ModuleDict(Module):
    """An ordered dict of modules, registered so that ``parameters()`` and ``to()`` see them.

    Raises:
        TypeError: a value is not a Module.

    Example:
        >>> d = ModuleDict({"enc": Linear(2, 2), "act": ReLU()})
        >>> list(d.keys())
        ['enc', 'act']
    """

    def __init__(self, modules: Optional[Any] = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def clear(self) -> None:
        """Remove every module."""
        self._modules.clear()

    def pop(self, key: str) -> Module:
        """Remove and return the module under ``key``."""
        v = self[key]
        del self[key]
        return v

    def keys(self) -> Iterable[str]:
        """The keys, in insertion order."""
        return self._modules.keys()

    def items(self) -> Iterable[tuple]:
        """The ``(key, module)`` pairs, in insertion order."""
        return self._modules.items()

    def values(self) -> Iterable[Module]:
        """The modules, in insertion order."""
        return self._modules.values()

    def update(self, modules: Any) -> None:
        """Add modules from a mapping or an iterable of ``(key, module)`` pairs.

        Raises:
            TypeError: ``modules`` is neither, or a pair is malformed.
        """
        if isinstance(modules, (OrderedDict, ModuleDict, Mapping)):
            for key, module in modules.items():
                self[key] = module
            return
        if not isinstance(modules, Iterable):
            raise TypeError("ModuleDict.update should be called with an iterable of key/value "
                            "pairs, but got " + type(modules).__name__)
        for j, m in enumerate(modules):
            if not isinstance(m, Iterable):
                raise TypeError(f"ModuleDict update sequence element #{j} should be Iterable; "
                                f"is {type(m).__name__}")
            m = list(m)
            if len(m) != 2:
                raise ValueError(f"ModuleDict update sequence element #{j} has length {len(m)}; "
                                 f"2 is required")
            self[m[0]] = m[1]
