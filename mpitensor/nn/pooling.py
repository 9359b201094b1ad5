"""1-D pooling modules with ``torch.nn``'s names: :class:`MaxPool1d`, :class:`AvgPool1d`,
:class:`AdaptiveMaxPool1d`, :class:`LPPool1d`, :class:`MaxUnpool1d`, and
:class:`LocalResponseNorm` (a sliding mean over channels); the 2-D ones live in
:mod:`.layers`.

Example:
    >>> import mpitensor as mt
    >>> MaxPool1d(2)(mt.tensor([[[1.0, 3.0, 2.0, 0.0]]]))
    tensor([[[3., 2.]]])
"""

from __future__ import annotations

from typing import Any, Optional

from mpitensor.tensor import Tensor

from . import functional as F  # noqa: N812 - torch's spelling
from .module import Module

__all__ = ["MaxPool1d", "AvgPool1d", "AdaptiveMaxPool1d", "LPPool1d", "MaxUnpool1d",
           "LocalResponseNorm"]


def _single(v: Any) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


class MaxPool1d(Module):
    """Max over sliding windows of (N, C, L) or (C, L).

    Example:
        >>> MaxPool1d(3, stride=1)
        MaxPool1d(kernel_size=3, stride=1, padding=0, dilation=1, ceil_mode=False)
    """

    def __init__(self, kernel_size: Any, stride: Optional[Any] = None, padding: Any = 0,
                 dilation: Any = 1, return_indices: bool = False,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode

    def forward(self, input: Tensor) -> Any:  # noqa: A002 - torch's name
        return F.max_pool1d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                            ceil_mode=self.ceil_mode, return_indices=self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool1d(Module):
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

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveMaxPool1d(Module):
    """Max over ``output_size`` windows tiling the last dimension.

    Example:
        >>> AdaptiveMaxPool1d(3)
        AdaptiveMaxPool1d(output_size=3)
    """

    def __init__(self, output_size: Any, return_indices: bool = False) -> None:
        super().__init__()
        self.output_size = output_size
        self.return_indices = return_indices

    def forward(self, input: Tensor) -> Any:  # noqa: A002 - torch's name
        return F.adaptive_max_pool1d(input, self.output_size, self.return_indices)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class LPPool1d(Module):
    """Power-average pooling over sliding windows of the last dimension.

    Example:
        >>> LPPool1d(2, 3)
        LPPool1d(norm_type=2, kernel_size=3, stride=None, ceil_mode=False)
    """

    def __init__(self, norm_type: float, kernel_size: Any, stride: Optional[Any] = None,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        self.norm_type = norm_type
        self.kernel_size = kernel_size
        self.stride = stride
        self.ceil_mode = ceil_mode

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.lp_pool1d(input, float(self.norm_type), self.kernel_size, self.stride,
                           self.ceil_mode)

    def extra_repr(self) -> str:
        return (f"norm_type={self.norm_type}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, ceil_mode={self.ceil_mode}")


class MaxUnpool1d(Module):
    """The partial inverse of :class:`MaxPool1d` (give it the pooling's indices).

    Example:
        >>> MaxUnpool1d(2)
        MaxUnpool1d(kernel_size=(2,), stride=(2,), padding=(0,))
    """

    def __init__(self, kernel_size: Any, stride: Optional[Any] = None, padding: Any = 0) -> None:
        super().__init__()
        self.kernel_size = _single(kernel_size)
        self.stride = _single(stride if stride is not None else kernel_size)
        self.padding = _single(padding)

    def forward(self, input: Tensor, indices: Tensor,  # noqa: A002 - torch's name
                output_size: Optional[Any] = None) -> Tensor:
        return F.max_unpool1d(input, indices, self.kernel_size, self.stride, self.padding,
                              output_size)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class LocalResponseNorm(Module):
    """Normalise by the mean square over ``size`` neighbouring channels.

    Example:
        >>> LocalResponseNorm(2)
        LocalResponseNorm(2, alpha=0.0001, beta=0.75, k=1.0)
    """

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75,
                 k: float = 1.0) -> None:
        super().__init__()
        self.size = size
        self.alpha = alpha
        self.beta = beta
        self.k = k

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.local_response_norm(input, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"
