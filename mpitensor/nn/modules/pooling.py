"""``torch.nn.modules.pooling``: max, average, adaptive, LP, fractional and unpooling layers in
1, 2 and 3 dimensions (:class:`MaxPool1d`, :class:`MaxPool2d`, :class:`AvgPool3d`,
:class:`AdaptiveAvgPool2d`, :class:`LPPool2d`, :class:`MaxUnpool3d`,
:class:`FractionalMaxPool2d`, ...).

Example:
    >>> import mpitensor as mt
    >>> MaxPool1d(2)(mt.tensor([[[1.0, 3.0, 2.0, 0.0]]]))
    tensor([[[3., 2.]]])
"""

from __future__ import annotations

from typing import Any, Optional

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from .._functional.pooling2d import _adaptive_size
from ._common import _IntOrPair, _pair, _positive_int, _ReprFields
from .module import Module

__all__ = ["MaxPool1d", "AvgPool1d", "AdaptiveMaxPool1d", "LPPool1d", "MaxUnpool1d", "MaxPool3d",
           "AvgPool3d", "AdaptiveAvgPool3d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "LPPool2d",
           "LPPool3d", "MaxUnpool2d", "MaxUnpool3d", "FractionalMaxPool2d", "FractionalMaxPool3d",
           "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "AdaptiveAvgPool1d"]


def _ntuple(v: Any, nd: int) -> tuple:
    if isinstance(v, (tuple, list)):
        return tuple(v)
    return (v,) * nd


def _single(v: Any) -> tuple:
    return _ntuple(v, 1)


def _set_window(module: Module, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
                **more: Any) -> None:
    """The sliding-window attributes, as torch keeps them (stride defaults to the kernel), and
    the pooling's ``more`` attributes."""
    module.kernel_size = kernel_size
    module.stride = stride if stride is not None else kernel_size
    module.padding = padding
    module.ceil_mode = ceil_mode
    for name, value in more.items():
        setattr(module, name, value)


class _MaxPoolNd(_ReprFields, Module):
    """Shared body of the sliding-window max poolings; subclasses name their function."""

    _fn = staticmethod(F.max_pool1d)

    def __init__(self, kernel_size: Any, stride: Optional[Any] = None, padding: Any = 0,
                 dilation: Any = 1, return_indices: bool = False,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        _set_window(self, kernel_size, stride, padding, ceil_mode, dilation=dilation,
                    return_indices=return_indices)

    def forward(self, input: Tensor) -> Any:  # noqa: A002 - torch's name
        return self._fn(input, self.kernel_size, self.stride, self.padding, self.dilation,
                        ceil_mode=self.ceil_mode, return_indices=self.return_indices)

    _repr = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")


class MaxPool1d(_MaxPoolNd):
    """Max over sliding windows of (N, C, L) or (C, L).

    Example:
        >>> MaxPool1d(3, stride=1)
        MaxPool1d(kernel_size=3, stride=1, padding=0, dilation=1, ceil_mode=False)
    """


class MaxPool3d(_MaxPoolNd):
    """Max over sliding 3-D windows of (N, C, D, H, W) or (C, D, H, W).

    Example:
        >>> MaxPool3d(3, stride=2)
        MaxPool3d(kernel_size=3, stride=2, padding=0, dilation=1, ceil_mode=False)
    """

    _fn = staticmethod(F.max_pool3d)


class AvgPool1d(_ReprFields, Module):
    """Mean over sliding windows of (N, C, L) or (C, L).

    Example:
        >>> AvgPool1d(2)
        AvgPool1d(kernel_size=(2,), stride=(2,), padding=(0,))
    """

    def __init__(self, kernel_size: Any, stride: Optional[Any] = None, padding: Any = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True) -> None:
        super().__init__()
        self.kernel_size = _single(kernel_size)
        self.stride = _single(stride if stride is not None else kernel_size)
        self.padding = _single(padding)
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.avg_pool1d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad)

    _repr = ("kernel_size", "stride", "padding")


class _AdaptiveMaxPoolNd(_ReprFields, Module):
    """Shared body of the adaptive max poolings; subclasses name their function."""

    _fn = staticmethod(F.adaptive_max_pool1d)

    def __init__(self, output_size: Any, return_indices: bool = False) -> None:
        super().__init__()
        self.output_size = output_size
        self.return_indices = return_indices

    def forward(self, input: Tensor) -> Any:  # noqa: A002 - torch's name
        return self._fn(input, self.output_size, self.return_indices)

    _repr = ("output_size",)


class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    """Max over ``output_size`` windows tiling the last dimension.

    Example:
        >>> AdaptiveMaxPool1d(3)
        AdaptiveMaxPool1d(output_size=3)
    """


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    """Max over windows tiling (N, C, H, W) or (C, H, W) into ``output_size`` cells (None
    keeps a dimension's size).

    Example:
        >>> AdaptiveMaxPool2d((2, None))
        AdaptiveMaxPool2d(output_size=(2, None))
    """

    _fn = staticmethod(F.adaptive_max_pool2d)


class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    """Max over windows tiling (N, C, D, H, W) or (C, D, H, W) into ``output_size`` cells.

    Example:
        >>> AdaptiveMaxPool3d(2)
        AdaptiveMaxPool3d(output_size=2)
    """

    _fn = staticmethod(F.adaptive_max_pool3d)


class _AdaptiveAvgPoolNd(_ReprFields, Module):
    """Shared body of the adaptive average poolings; subclasses name their function and the
    number of dimensions whose sizes the constructor checks (``_check``, 0: none)."""

    _fn = staticmethod(F.adaptive_avg_pool1d)
    _check = 0

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        if self._check:
            sizes = _adaptive_size(output_size, self._check, type(self).__name__)
            if self._check == 1 and sizes[0] is None:
                raise TypeError(f"{type(self).__name__}: output_size must be an int, got None")
        self.output_size = output_size

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return self._fn(input, self.output_size)

    _repr = ("output_size",)


class AdaptiveAvgPool3d(_AdaptiveAvgPoolNd):
    """Mean over windows tiling (N, C, D, H, W) or (C, D, H, W) into ``output_size`` cells.

    Example:
        >>> AdaptiveAvgPool3d((2, None, 3))
        AdaptiveAvgPool3d(output_size=(2, None, 3))
    """

    _fn = staticmethod(F.adaptive_avg_pool3d)


class AvgPool3d(_ReprFields, Module):
    """Mean over sliding 3-D windows of (N, C, D, H, W) or (C, D, H, W).

    Example:
        >>> AvgPool3d(3, stride=2)
        AvgPool3d(kernel_size=3, stride=2, padding=0)
    """

    def __init__(self, kernel_size: Any, stride: Optional[Any] = None, padding: Any = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: Optional[int] = None) -> None:
        super().__init__()
        _set_window(self, kernel_size, stride, padding, ceil_mode,
                    count_include_pad=count_include_pad, divisor_override=divisor_override)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.avg_pool3d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)

    _repr = ("kernel_size", "stride", "padding")


class _LPPoolNd(_ReprFields, Module):
    """Shared body of the power-average poolings; subclasses name their function."""

    _fn = staticmethod(F.lp_pool1d)

    def __init__(self, norm_type: float, kernel_size: Any, stride: Optional[Any] = None,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        self._keep(norm_type, kernel_size, stride, ceil_mode)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return self._fn(input, float(self.norm_type), self.kernel_size, self.stride,
                        self.ceil_mode)

    _repr = ("norm_type", "kernel_size", "stride", "ceil_mode")


class LPPool1d(_LPPoolNd):
    """Power-average pooling over sliding windows of the last dimension.

    Example:
        >>> LPPool1d(2, 3)
        LPPool1d(norm_type=2, kernel_size=3, stride=None, ceil_mode=False)
    """


class LPPool2d(_LPPoolNd):
    """Power-average pooling over sliding 2-D windows.

    Example:
        >>> LPPool2d(2, 3)
        LPPool2d(norm_type=2, kernel_size=3, stride=None, ceil_mode=False)
    """

    _fn = staticmethod(F.lp_pool2d)


class LPPool3d(_LPPoolNd):
    """Power-average pooling over sliding 3-D windows.

    Example:
        >>> LPPool3d(2, 3)
        LPPool3d(norm_type=2, kernel_size=3, stride=None, ceil_mode=False)
    """

    _fn = staticmethod(F.lp_pool3d)


class _MaxUnpoolNd(_ReprFields, Module):
    """Shared body of the unpoolings; subclasses name their function and rank."""

    _fn = staticmethod(F.max_unpool1d)
    _nd = 1

    def __init__(self, kernel_size: Any, stride: Optional[Any] = None, padding: Any = 0) -> None:
        super().__init__()
        self.kernel_size = _ntuple(kernel_size, self._nd)
        self.stride = _ntuple(stride if stride is not None else kernel_size, self._nd)
        self.padding = _ntuple(padding, self._nd)

    def forward(self, input: Tensor, indices: Tensor,  # noqa: A002 - torch's name
                output_size: Optional[Any] = None) -> Tensor:
        return self._fn(input, indices, self.kernel_size, self.stride, self.padding,
                        output_size)

    _repr = ("kernel_size", "stride", "padding")


class MaxUnpool1d(_MaxUnpoolNd):
    """The partial inverse of :class:`MaxPool1d` (give it the pooling's indices).

    Example:
        >>> MaxUnpool1d(2)
        MaxUnpool1d(kernel_size=(2,), stride=(2,), padding=(0,))
    """


class MaxUnpool2d(_MaxUnpoolNd):
    """The partial inverse of :class:`MaxPool2d` (give it the pooling's indices).

    Example:
        >>> MaxUnpool2d(2)
        MaxUnpool2d(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0))
    """

    _fn = staticmethod(F.max_unpool2d)
    _nd = 2


class MaxUnpool3d(_MaxUnpoolNd):
    """The partial inverse of :class:`MaxPool3d` (give it the pooling's indices).

    Example:
        >>> MaxUnpool3d(2)
        MaxUnpool3d(kernel_size=(2, 2, 2), stride=(2, 2, 2), padding=(0, 0, 0))
    """

    _fn = staticmethod(F.max_unpool3d)
    _nd = 3


class _FractionalMaxPoolNd(Module):
    """Shared body of the fractional max poolings; subclasses name their function and rank."""

    _fn = staticmethod(F.fractional_max_pool2d)
    _nd = 2

    def __init__(self, kernel_size: Any, output_size: Optional[Any] = None,
                 output_ratio: Optional[Any] = None, return_indices: bool = False,
                 _random_samples: Optional[Tensor] = None) -> None:
        super().__init__()
        cls = type(self).__name__
        self.kernel_size = _ntuple(kernel_size, self._nd)
        self.return_indices = return_indices
        self.register_buffer("_random_samples", _random_samples)
        self.output_size = None if output_size is None else _ntuple(output_size, self._nd)
        self.output_ratio = None if output_ratio is None else _ntuple(output_ratio, self._nd)
        if output_size is None and output_ratio is None:
            raise ValueError(f"{cls} needs an output_size or an output_ratio")
        if output_size is not None and output_ratio is not None:
            raise ValueError(f"{cls}: give only one of output_size and output_ratio")
        if self.output_ratio is not None and not all(0 < r < 1 for r in self.output_ratio):
            raise ValueError(f"{cls}: output_ratio must lie in (0, 1), got {output_ratio!r}")

    def forward(self, input: Tensor) -> Any:  # noqa: A002 - torch's name
        return self._fn(input, self.kernel_size, self.output_size, self.output_ratio,
                        self.return_indices, _random_samples=self._random_samples)


class FractionalMaxPool2d(_FractionalMaxPoolNd):
    """Fractional max pooling over (N, C, H, W) or (C, H, W) (windows at pseudo-random
    steps; fixed by ``_random_samples`` of shape (N, C, 2) when given).

    Example:
        >>> FractionalMaxPool2d(3, output_ratio=0.5).output_ratio
        (0.5, 0.5)
    """


class FractionalMaxPool3d(_FractionalMaxPoolNd):
    """Fractional max pooling over (N, C, D, H, W) or (C, D, H, W) (samples (N, C, 3)).

    Example:
        >>> FractionalMaxPool3d(2, output_size=3).output_size
        (3, 3, 3)
    """

    _fn = staticmethod(F.fractional_max_pool3d)
    _nd = 3


class MaxPool2d(_MaxPoolNd):
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

    _fn = staticmethod(F.max_pool2d)

    def __init__(
        self, kernel_size: _IntOrPair, stride: Optional[_IntOrPair] = None,
        padding: _IntOrPair = 0, dilation: _IntOrPair = 1, return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
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
        super().__init__(kernel_size, stride, padding, dilation, bool(return_indices),
                         bool(ceil_mode))


class AvgPool2d(_ReprFields, Module):
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

    _repr = ("kernel_size", "stride", "padding")


class AdaptiveAvgPool2d(_AdaptiveAvgPoolNd):
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

    _fn = staticmethod(F.adaptive_avg_pool2d)
    _check = 2


class AdaptiveAvgPool1d(_AdaptiveAvgPoolNd):
    """1-D adaptive average pooling of (N, C, L) inputs to ``output_size`` positions.

    Raises:
        ValueError, TypeError: a negative or non-integer size.

    Example:
        >>> import mpitensor as mt
        >>> AdaptiveAvgPool1d(3)(mt.randn(2, 4, 10)).shape
        mpitensor.Size([2, 4, 3])
    """

    _check = 1
