"""``torch.nn.modules.pixelshuffle``: ``PixelShuffle`` and ``PixelUnshuffle`` (channels to a
finer spatial grid and back)."""

from __future__ import annotations

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from ._common import _ReprFields
from .module import Module

__all__ = ["PixelShuffle", "PixelUnshuffle"]


class PixelShuffle(_ReprFields, Module):
    """(*, C r^2, H, W) -> (*, C, H r, W r).

    Example:
        >>> import mpitensor as mt
        >>> PixelShuffle(2)(mt.zeros(1, 4, 3, 3)).shape
        mpitensor.Size([1, 1, 6, 6])
    """

    def __init__(self, upscale_factor: int) -> None:
        super().__init__()
        self._keep(upscale_factor)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.pixel_shuffle(input, self.upscale_factor)

    _repr = ("upscale_factor",)


class PixelUnshuffle(_ReprFields, Module):
    """(*, C, H r, W r) -> (*, C r^2, H, W).

    Example:
        >>> import mpitensor as mt
        >>> PixelUnshuffle(2)(mt.zeros(1, 1, 6, 6)).shape
        mpitensor.Size([1, 4, 3, 3])
    """

    def __init__(self, downscale_factor: int) -> None:
        super().__init__()
        self._keep(downscale_factor)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.pixel_unshuffle(input, self.downscale_factor)

    _repr = ("downscale_factor",)
