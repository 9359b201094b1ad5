"""The convolution layers ``Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d``, as ``torch.nn``'s.

One base class holds what they share (arguments, parameters, init, repr); each calls
:mod:`mpitensor.nn.functional` for the math, whose N-d kernels (:mod:`mpitensor.nn._kernels.convnd`)
make a transposed convolution the adjoint of a convolution. Constructors check their arguments
up front and raise ``ValueError`` naming the bad value, as torch's do.

Example:
    >>> import mpitensor as mt
    >>> import mpitensor.nn as nn
    >>> up = nn.ConvTranspose2d(8, 3, 4, stride=2, padding=1)
    >>> up(mt.randn(1, 8, 16, 16)).shape
    mpitensor.Size([1, 3, 32, 32])
"""

from __future__ import annotations

from typing import Any, Optional, Union

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from .._functional.conv import _pad_mode
from ._common import (
    _PADDING_MODES,
    _add_weight_and_bias,
    _factory,
    _is_int,
    _positive_int,
    _reset_default,
)
from .lazy import _lazy_conv
from .module import Module

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
           "LazyConv1d", "LazyConv2d", "LazyConv3d", "LazyConvTranspose1d", "LazyConvTranspose2d",
           "LazyConvTranspose3d"]

_Size = Union[int, tuple]


def _tuple(v: Any, nd: int, cls: str, name: str, low: int) -> tuple:
    """``v`` as ``nd`` ints >= low (an int is used for every dimension)."""
    if _is_int(v):
        v = (v,) * nd
    if not isinstance(v, (tuple, list)) or len(v) != nd or not all(_is_int(e) for e in v):
        many = "a pair of ints" if nd == 2 else f"a tuple of {nd} ints"
        raise ValueError(f"{cls}: {name} must be an int or {many}, got {v!r}")
    if any(e < low for e in v):
        bound = "positive" if low == 1 else "non-negative"
        raise ValueError(f"{cls}: {name} must be {bound}, got {v!r}")
    return tuple(int(e) for e in v)


class _ConvNd(Module):
    """What the convolution layers share: arguments, parameters, default init and repr."""

    _nd = 0
    _transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _Size, stride: _Size,
                 padding: Union[_Size, str], dilation: _Size, groups: int, bias: bool,
                 padding_mode: str, output_padding: _Size, device: Any, dtype: Any) -> None:
        super().__init__()
        c, nd = type(self).__name__, self._nd
        self.in_channels = _positive_int(in_channels, c, "in_channels")
        self.out_channels = _positive_int(out_channels, c, "out_channels")
        if isinstance(groups, bool) or not _is_int(groups) or groups < 1:
            raise ValueError(f"{c}: groups must be a positive integer, got {groups!r}")
        self.groups = int(groups)
        if self.in_channels % self.groups:
            raise ValueError(f"{c}: in_channels ({in_channels}) must be divisible by groups "
                             f"({groups})")
        if self.out_channels % self.groups:
            raise ValueError(f"{c}: out_channels ({out_channels}) must be divisible by groups "
                             f"({groups})")
        self.kernel_size = _tuple(kernel_size, nd, c, "kernel_size", 1)
        self.stride = _tuple(stride, nd, c, "stride", 1)
        self.dilation = _tuple(dilation, nd, c, "dilation", 1)
        self.output_padding = _tuple(output_padding, nd, c, "output_padding", 0)
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"{c}: padding_mode must be one of {list(_PADDING_MODES)}, got "
                             f"{padding_mode!r}")
        if self._transposed and padding_mode != "zeros":
            raise ValueError(f"{c}: only padding_mode='zeros' is supported for transposed "
                             f"convolutions, got {padding_mode!r}")
        self.padding_mode = padding_mode
        self.transposed = self._transposed
        if isinstance(padding, str):
            if padding not in ("valid", "same"):
                raise ValueError(f"{c}: invalid padding string {padding!r}, should be one of "
                                 f"['valid', 'same']")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError(f"{c}: padding='same' is not supported for strided "
                                 f"convolutions; use stride=1 or an explicit padding")
            self.padding: Any = padding
            totals = [0] * nd if padding == "valid" else [
                d * (k - 1) for d, k in zip(self.dilation, self.kernel_size)]
            pads = [(t // 2, t - t // 2) for t in totals]
        else:
            self.padding = _tuple(padding, nd, c, "padding", 0)
            pads = [(p, p) for p in self.padding]
        # torch's attribute: (before, after) pairs, last dimension first
        # (a list for string paddings, a tuple otherwise, as torch keeps it)
        rev = [e for pair in reversed(pads) for e in pair]
        self._reversed_padding_repeated_twice: Any = rev if isinstance(padding, str) else tuple(rev)
        if self._transposed:
            wshape = (self.in_channels, self.out_channels // self.groups, *self.kernel_size)
        else:
            wshape = (self.out_channels, self.in_channels // self.groups, *self.kernel_size)
        _add_weight_and_bias(self, wshape, bias, _factory(dtype, c), device, self.out_channels)

    def reset_parameters(self) -> None:
        """Re-draw the parameters as torch does: kaiming-uniform(a=√5), bias ±1/√fan_in
        (fan_in read off the weight's second dimension and kernel, as torch reads it)."""
        _reset_default(self.weight, self.bias)

    def extra_repr(self) -> str:
        nd = self._nd
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0,) * nd:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * nd:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * nd:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += f", padding_mode={self.padding_mode}"
        return s


class _Conv(_ConvNd):
    _fn: Any = None

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _Size,
                 stride: _Size = 1, padding: Union[_Size, str] = 0, dilation: _Size = 1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, 0, device, dtype)

    def _conv_forward(self, input: Tensor, weight: Tensor,  # noqa: A002 - torch's name
                      bias: Optional[Tensor]) -> Tensor:
        fn = type(self)._fn
        if self.padding_mode != "zeros":
            # read off torch's attribute (last dimension first), which a module unpickled from
            # torch's objects has too
            rev = self._reversed_padding_repeated_twice
            pads = tuple((rev[i], rev[i + 1]) for i in range(len(rev) - 2, -1, -2))
            padded = _pad_mode(input, pads, self.padding_mode)
            return fn(padded, weight, bias, self.stride, 0, self.dilation, self.groups)
        return fn(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return self._conv_forward(input, self.weight, self.bias)


class Conv1d(_Conv):
    """1-D convolution (cross-correlation) over an (N, C, L) input, as ``torch.nn.Conv1d``.

    Arguments and errors as :class:`Conv2d`'s, with an int or a 1-tuple for each size.

    Example:
        >>> import mpitensor as mt
        >>> Conv1d(4, 8, 3, padding=1)(mt.randn(2, 4, 50)).shape
        mpitensor.Size([2, 8, 50])
    """

    _nd = 1
    _fn = staticmethod(F.conv1d)


class Conv2d(_Conv):
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

    _nd = 2
    _fn = staticmethod(F.conv2d)


class Conv3d(_Conv):
    """3-D convolution (cross-correlation) over an (N, C, D, H, W) input, as ``torch.nn.Conv3d``.

    Args:
        in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
        padding_mode, device, dtype: as :class:`Conv1d`, with ints or 3-tuples.

    Raises:
        ValueError: as :class:`Conv1d`.

    Example:
        >>> import mpitensor as mt
        >>> Conv3d(2, 4, 3, padding="same")(mt.randn(1, 2, 5, 6, 7)).shape
        mpitensor.Size([1, 4, 5, 6, 7])
    """

    _nd = 3
    _fn = staticmethod(F.conv3d)


class _ConvTransposeNd(_ConvNd):
    _transposed = True
    _fn: Any = None

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _Size,
                 stride: _Size = 1, padding: _Size = 0, output_padding: _Size = 0,
                 groups: int = 1, bias: bool = True, dilation: _Size = 1,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, output_padding, device, dtype)

    def _output_padding(self, input: Tensor, output_size: Any) -> tuple:  # noqa: A002
        """The output padding that gives ``output_size`` (the constructor's when None)."""
        if output_size is None:
            return self.output_padding
        nd, c = self._nd, type(self).__name__
        size = [int(s) for s in output_size]
        lead = 2 if input.dim() == nd + 2 else 1
        if len(size) == nd + lead:
            size = size[lead:]
        if len(size) != nd:
            raise ValueError(f"{c}: for {input.dim()}D input, output_size must have {nd} or "
                             f"{nd + lead} elements, got {len(size)}")
        if isinstance(self.padding, str):
            raise ValueError(f"{c}: output_size needs a numeric padding, got {self.padding!r}")
        spatial = tuple(input.shape[-nd:])
        low = [(n - 1) * s - 2 * p + d * (k - 1) + 1 for n, s, p, d, k in
               zip(spatial, self.stride, self.padding, self.dilation, self.kernel_size)]
        high = [lo + s - 1 for lo, s in zip(low, self.stride)]
        for want, lo, hi in zip(size, low, high):
            if not lo <= want <= hi:
                raise ValueError(f"{c}: requested an output size of {size}, but the sizes an "
                                 f"input of size {list(input.shape)} can give range from {low} "
                                 f"to {high}")
        return tuple(want - lo for want, lo in zip(size, low))

    def forward(self, input: Tensor,  # noqa: A002 - torch's name
                output_size: Optional[list] = None) -> Tensor:
        output_padding = self._output_padding(input, output_size)
        return type(self)._fn(input, self.weight, self.bias, self.stride, self.padding,
                              output_padding, self.groups, self.dilation)


class ConvTranspose1d(_ConvTransposeNd):
    """1-D transposed convolution over an (N, C, L) input, as ``torch.nn.ConvTranspose1d``:
    the gradient of :class:`Conv1d` with respect to its input.

    Args:
        in_channels, out_channels: channel counts (> 0, divisible by ``groups``).
        kernel_size, stride, dilation: an int or a 1-tuple (> 0).
        padding: an int or a 1-tuple (>= 0): positions cut from each end of the output (the
            padding of the convolution this layer is the gradient of).
        output_padding: an int or a 1-tuple added to one side of the output (smaller than the
            stride or the dilation).
        groups: blocked connections from input to output channels.
        bias: whether to learn an additive bias.
        padding_mode: "zeros" only.
        device, dtype: where and in which float dtype to create the parameters.

    ``forward(input, output_size=None)``: ``output_size`` picks one of the output sizes a
    strided layer can give (it sets the output padding).

    Raises:
        ValueError: a bad size, an indivisible channel count, a padding mode other than
            "zeros", or an ``output_size`` out of reach.

    Example:
        >>> import mpitensor as mt
        >>> ConvTranspose1d(4, 2, 4, stride=2, padding=1)(mt.randn(3, 4, 10)).shape
        mpitensor.Size([3, 2, 20])
    """

    _nd = 1
    _fn = staticmethod(F.conv_transpose1d)


class ConvTranspose2d(_ConvTransposeNd):
    """2-D transposed convolution over an NCHW input, as ``torch.nn.ConvTranspose2d``.

    Args:
        in_channels, out_channels, kernel_size, stride, padding, output_padding, groups, bias,
        dilation, padding_mode, device, dtype: as :class:`ConvTranspose1d`, with ints or pairs.

    Raises:
        ValueError: as :class:`ConvTranspose1d`.

    Example:
        >>> import mpitensor as mt
        >>> m = ConvTranspose2d(16, 8, 3, stride=2, padding=1)
        >>> m(mt.randn(1, 16, 12, 12), output_size=[1, 8, 24, 24]).shape
        mpitensor.Size([1, 8, 24, 24])
    """

    _nd = 2
    _fn = staticmethod(F.conv_transpose2d)


class ConvTranspose3d(_ConvTransposeNd):
    """3-D transposed convolution over an (N, C, D, H, W) input, as
    ``torch.nn.ConvTranspose3d``.

    Args:
        in_channels, out_channels, kernel_size, stride, padding, output_padding, groups, bias,
        dilation, padding_mode, device, dtype: as :class:`ConvTranspose1d`, with ints or
        3-tuples.

    Raises:
        ValueError: as :class:`ConvTranspose1d`.

    Example:
        >>> import mpitensor as mt
        >>> ConvTranspose3d(2, 1, 2, stride=2)(mt.randn(1, 2, 3, 3, 3)).shape
        mpitensor.Size([1, 1, 6, 6, 6])
    """

    _nd = 3
    _fn = staticmethod(F.conv_transpose3d)


LazyConv1d = _lazy_conv(Conv1d, False)


LazyConv2d = _lazy_conv(Conv2d, False)


LazyConv3d = _lazy_conv(Conv3d, False)


LazyConvTranspose1d = _lazy_conv(ConvTranspose1d, True)


LazyConvTranspose2d = _lazy_conv(ConvTranspose2d, True)


LazyConvTranspose3d = _lazy_conv(ConvTranspose3d, True)
