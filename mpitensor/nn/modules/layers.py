"""Layers and containers with ``torch.nn``'s names, arguments and reprs.

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
from itertools import groupby
from typing import Any, Optional, Union

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor, empty

from .. import functional as F  # noqa: N812 - torch's spelling
from .. import init
from .module import Module
from ..parameter import Parameter

__all__ = [
    "Identity",
    "Linear",
    "MaxPool2d",
    "AvgPool2d",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "ReLU",
    "Dropout",
    "Dropout2d",
    "Flatten",
    "LogSoftmax",
    "Softmax",
    "Sequential",
    "ModuleList",
    "ModuleDict",
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


class AdaptiveAvgPool2d(Module):
    """2-D adaptive average pooling to a fixed output size, as ``torch.nn.AdaptiveAvgPool2d``.

    Args:
        output_size: an int (square output) or a pair of ints or None (None keeps the
            input's size along that dimension). Bins follow torch's rule (see
            :func:`~mpitensor.nn.functional.adaptive_avg_pool2d`).

    Raises:
        ValueError: a negative size or a tuple of the wrong length.
        TypeError: an entry that is neither an int nor None.

    Example:
        >>> import mpitensor as mt
        >>> AdaptiveAvgPool2d((1, 1))(mt.randn(2, 8, 7, 7)).shape
        mpitensor.Size([2, 8, 1, 1])
    """

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        F._adaptive_size(output_size, 2, "AdaptiveAvgPool2d")
        self.output_size = output_size

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.adaptive_avg_pool2d(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(Module):
    """1-D adaptive average pooling of (N, C, L) inputs to ``output_size`` positions.

    Raises:
        ValueError, TypeError: a negative or non-integer size.

    Example:
        >>> import mpitensor as mt
        >>> AdaptiveAvgPool1d(3)(mt.randn(2, 4, 10)).shape
        mpitensor.Size([2, 4, 3])
    """

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        (size,) = F._adaptive_size(output_size, 1, "AdaptiveAvgPool1d")
        if size is None:
            raise TypeError("AdaptiveAvgPool1d: output_size must be an int, got None")
        self.output_size = output_size

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.adaptive_avg_pool1d(input, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


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


class Dropout2d(Module):
    """Zero whole channels with probability ``p`` in training, scaling the rest by 1/(1-p).

    Each (sample, channel) plane of an (N, C, H, W) input is kept or dropped as a whole
    (see :func:`~mpitensor.nn.functional.dropout2d`); in evaluation mode it is the identity.
    The draws come from mpitensor's global generator (``mpitensor.manual_seed``).

    Args:
        p: probability of zeroing a channel, in [0, 1].
        inplace: overwrite the input.

    Raises:
        ValueError: ``p`` outside [0, 1].

    Example:
        >>> import mpitensor as mt
        >>> Dropout2d(0.5).eval()(mt.ones(1, 2, 1, 1)).flatten()
        tensor([1., 1.])
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float, np.floating, np.integer)) \
                or not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p!r}")
        self.p = float(p)
        self.inplace = bool(inplace)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.dropout2d(input, self.p, self.training, self.inplace)

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
        dim = self.dim if self.dim is not None else F._softmax_dim(self._fname, input.ndim)
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
# Containers
#
# A container keeps its children in the registry that Module itself walks (``_modules``), so
# parameters(), state_dict(), to() and the repr see them with no extra work. They are read
# through ``_slots`` alone: ``named_children()`` cannot stand in, since it shows a module
# registered twice only once, and ``Sequential(relu, relu)`` must still have two positions.
# Every write goes through ``add_module`` / ``delattr`` so that Module's own checks apply.


def _slots(owner: Module) -> Any:
    """The ordered ``name -> child`` registry of ``owner``, a child registered twice included."""
    return owner._modules


def _indent_tail(text: str) -> str:
    """``text`` with every line but the first pushed right by two spaces, for nested reprs."""
    return text.replace("\n", "\n  ")


class _PositionalContainer(Module):
    """Shared machinery of Sequential and ModuleList: children addressed by position.

    Keys are the positions "0", "1", ... (a Sequential built from an OrderedDict keeps its
    own names until an insertion or deletion); any change in the middle relabels every child
    so that key and position agree again.
    """

    def _position(self, idx: Any) -> int:
        """``idx`` (negative counts from the end) as a position in ``range(len(self))``."""
        size = len(self)
        pos = operator.index(idx)
        if pos < -size or pos >= size:
            raise IndexError(
                f"{type(self).__name__} index {pos} is out of range: it holds {size} "
                f"module(s), so use an index from {-size} to {size - 1}"
            )
        return pos + size if pos < 0 else pos

    def _sliced(self, idx: slice) -> Any:
        raise NotImplementedError

    def __getitem__(self, idx: Union[int, slice]) -> Any:
        if isinstance(idx, slice):
            return self._sliced(idx)
        return list(self)[self._position(idx)]

    def _relabel(self, members: list) -> None:
        """Make ``members`` the children, keyed by their positions."""
        for key in list(_slots(self)):
            delattr(self, key)
        for pos, module in enumerate(members):
            self.add_module(str(pos), module)

    def __len__(self) -> int:
        return len(_slots(self))

    def __iter__(self) -> Iterator[Module]:
        return iter(list(_slots(self).values()))

    def __setitem__(self, idx: int, module: Module) -> None:
        self.add_module(list(_slots(self))[self._position(idx)], module)

    def __delitem__(self, idx: Union[int, slice]) -> None:
        members = list(self)
        doomed = set(range(len(members))[idx]) if isinstance(idx, slice) else {self._position(idx)}
        self._relabel([m for pos, m in enumerate(members) if pos not in doomed])

    def __dir__(self) -> list:
        return [name for name in super().__dir__() if not name.isdecimal()]

    def append(self, module: Module) -> Any:
        """Add ``module`` after the last one; returns the container."""
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> Any:
        """Append each module of ``modules`` in turn; returns the container.

        Raises:
            TypeError: ``modules`` is not iterable, or holds something that is not a Module.
        """
        if not isinstance(modules, Iterable):
            raise TypeError(
                f"{type(self).__name__}.extend takes an iterable of modules, got "
                f"{type(modules).__name__}; wrap a single module in a list or use append"
            )
        for module in list(modules):  # a snapshot, so that c.extend(c) terminates
            self.append(module)
        return self

    def pop(self, key: Union[int, slice]) -> Any:
        """Remove the module (or, for a slice, the modules) at ``key`` and return it."""
        taken = self[key]
        del self[key]
        return taken


class Sequential(_PositionalContainer):
    """Run modules one after another; built from modules or from an OrderedDict of them.

    Supports indexing (a slice gives a Sequential that keeps the keys), ``len``, iteration,
    ``append``, ``insert``, ``extend``, ``pop``, ``del``, ``+``, ``+=``, ``*`` and ``*=``.

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
        named = len(args) == 1 and isinstance(args[0], OrderedDict)
        pairs = args[0].items() if named else ((str(pos), m) for pos, m in enumerate(args))
        for key, module in pairs:
            self.add_module(key, module)

    def forward(self, input: Any) -> Any:  # noqa: A002 - torch's name
        out = input
        for stage in self:
            out = stage(out)
        return out

    def _sliced(self, idx: slice) -> Sequential:
        return type(self)(OrderedDict(list(_slots(self).items())[idx]))

    def _other_sequential(self, other: Any, op: str) -> Sequential:
        if not isinstance(other, Sequential):
            raise ValueError(
                f"Sequential {op} needs another Sequential on the right, got "
                f"{type(other).__name__}; wrap its modules in nn.Sequential(...) first"
            )
        return other

    def __add__(self, other: Sequential) -> Sequential:
        joined = Sequential()
        joined.extend(self)
        return joined.extend(self._other_sequential(other, "+"))

    def __iadd__(self, other: Sequential) -> Sequential:
        return self.extend(self._other_sequential(other, "+="))

    def _repeats(self, times: Any) -> int:
        if not _is_int(times):
            raise TypeError(
                f"a Sequential can only be repeated an int number of times, got "
                f"{type(times).__name__}"
            )
        if times <= 0:
            raise ValueError(f"a Sequential must be repeated at least once, got {times} times")
        return int(times)

    def __mul__(self, times: int) -> Sequential:
        repeated = Sequential()
        for _ in range(self._repeats(times)):
            repeated.extend(self)
        return repeated

    __rmul__ = __mul__

    def __imul__(self, times: int) -> Sequential:
        once = list(self)
        for _ in range(self._repeats(times) - 1):
            self.extend(once)
        return self

    def insert(self, index: int, module: Module) -> Sequential:
        """Put ``module`` at position ``index`` (negative counts from the end); returns self.

        Raises:
            AssertionError: ``module`` is not a Module (torch's exception type).
            IndexError: ``index`` is outside ``[-len, len]``.
        """
        if not isinstance(module, Module):
            raise AssertionError(
                f"Sequential.insert takes a Module, got {type(module).__name__}"
            )
        size = len(self)
        if not -size <= index <= size:
            raise IndexError(
                f"Sequential.insert index {index} is out of range for {size} module(s); "
                f"use an index from {-size} to {size}"
            )
        members = list(self)
        members.insert(index, module)
        self._relabel(members)
        return self


class ModuleList(_PositionalContainer):
    """A list of modules, registered so that ``parameters()`` and ``to()`` see them.

    Indexing (a slice gives a ModuleList numbered from 0), ``len``, iteration, ``append``,
    ``insert``, ``extend``, ``pop``, ``del``, ``+`` and ``+=`` behave as on a list. The repr
    folds runs of identical modules into one line.

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

    def _sliced(self, idx: slice) -> ModuleList:
        return type(self)(list(self)[idx])

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList(self).extend(other)

    def insert(self, index: int, module: Module) -> None:
        """Put ``module`` before position ``index``, with ``list.insert``'s index rules.

        Raises:
            TypeError: ``module`` is not a Module.
        """
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList.insert takes a Module, got {type(module).__name__}")
        members = list(self)
        members.insert(index, module)
        self._relabel(members)

    def __repr__(self) -> str:
        if not len(self):
            return self._get_name() + "()"
        rows, first = [], 0
        for text, run in groupby(repr(m) for m in self):
            count = sum(1 for _ in run)
            if count == 1:
                head = f"({first}): "
            else:
                head = f"({first}-{first + count - 1}): {count} x "
            rows.append(_indent_tail(head + text))
            first += count
        return self._get_name() + "(" + "".join("\n  " + row for row in rows) + "\n)"


def _module_pairs(source: Any) -> Iterator[tuple]:
    """The ``(key, module)`` pairs of a mapping, a ModuleDict or an iterable of pairs.

    Pairs are checked one at a time as they are consumed, so an update stops at the first
    malformed one having applied those before it, like ``dict.update``.
    """
    if isinstance(source, (Mapping, ModuleDict)):
        yield from source.items()
        return
    if not isinstance(source, Iterable):
        raise TypeError(
            f"ModuleDict.update takes a mapping or an iterable of (key, module) pairs, got "
            f"{type(source).__name__}"
        )
    for pos, pair in enumerate(source):
        if not isinstance(pair, Iterable):
            raise TypeError(
                f"ModuleDict.update: item #{pos} is a {type(pair).__name__}, not a "
                f"(key, module) pair"
            )
        pair = tuple(pair)
        if len(pair) != 2:
            raise ValueError(
                f"ModuleDict.update: item #{pos} has length {len(pair)}, but each item must "
                f"be a (key, module) pair of length 2"
            )
        yield pair


class ModuleDict(Module):
    """An ordered dict of modules, registered so that ``parameters()`` and ``to()`` see them.

    Keys keep their insertion order; assigning to an existing key replaces the module in
    place. ``update`` takes a mapping, another ModuleDict or an iterable of pairs.

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
        return _slots(self)[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        if key not in _slots(self):
            raise KeyError(key)
        delattr(self, key)

    def __len__(self) -> int:
        return len(_slots(self))

    def __iter__(self) -> Iterator[str]:
        return iter(_slots(self))

    def __contains__(self, key: object) -> bool:
        return key in _slots(self)

    def clear(self) -> None:
        """Remove every module."""
        for key in list(_slots(self)):
            delattr(self, key)

    def pop(self, key: str) -> Module:
        """Remove the module under ``key`` and return it.

        Raises:
            KeyError: no module has that key.
        """
        module = self[key]
        del self[key]
        return module

    def keys(self) -> Iterable[str]:
        """The keys, in insertion order."""
        return _slots(self).keys()

    def items(self) -> Iterable[tuple]:
        """The ``(key, module)`` pairs, in insertion order."""
        return _slots(self).items()

    def values(self) -> Iterable[Module]:
        """The modules, in insertion order."""
        return _slots(self).values()

    def update(self, modules: Any) -> None:
        """Add (or replace) modules from a mapping or an iterable of ``(key, module)`` pairs.

        Raises:
            TypeError: ``modules`` is neither, an item is not a pair, or a value is not a
                Module.
            ValueError: an item has a length other than 2.
        """
        for key, module in _module_pairs(modules):
            self[key] = module
