"""``torch.nn.modules.fold``: ``Unfold`` (sliding blocks to columns, im2col) and ``Fold`` (its
adjoint, columns summed back into an image)."""

from __future__ import annotations

from typing import Any

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from ._common import _ReprFields
from .module import Module

__all__ = ["Unfold", "Fold"]


class Unfold(_ReprFields, Module):
    """Extract sliding blocks (im2col); see :func:`~mpitensor.nn.functional.unfold`.

    Example:
        >>> import mpitensor as mt
        >>> Unfold(2)(mt.zeros(1, 3, 4, 4)).shape
        mpitensor.Size([1, 12, 9])
    """

    def __init__(self, kernel_size: Any, dilation: Any = 1, padding: Any = 0,
                 stride: Any = 1) -> None:
        super().__init__()
        self._keep(kernel_size, dilation, padding, stride)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)

    _repr = ("kernel_size", "dilation", "padding", "stride")


class Fold(_ReprFields, Module):
    """Sum sliding blocks into an image (col2im); see :func:`~mpitensor.nn.functional.fold`.

    Example:
        >>> import mpitensor as mt
        >>> Fold((3, 3), 2)(mt.zeros(1, 4, 4)).shape
        mpitensor.Size([1, 1, 3, 3])
    """

    def __init__(self, output_size: Any, kernel_size: Any, dilation: Any = 1, padding: Any = 0,
                 stride: Any = 1) -> None:
        super().__init__()
        self._keep(output_size, kernel_size, dilation, padding, stride)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.fold(input, self.output_size, self.kernel_size, self.dilation, self.padding,
                      self.stride)

    _repr = ("output_size", "kernel_size", "dilation", "padding", "stride")
