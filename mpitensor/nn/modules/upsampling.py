"""``torch.nn.modules.upsampling``: ``Upsample`` and its fixed-mode forms
``UpsamplingNearest2d`` and ``UpsamplingBilinear2d``."""

from __future__ import annotations

from typing import Any, Optional

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from .module import Module

__all__ = ["Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"]


class Upsample(Module):
    """Resize with :func:`~mpitensor.nn.functional.interpolate`.

    Args:
        size, scale_factor: the output size, or the multiplier (one of the two).
        mode, align_corners, recompute_scale_factor: as in ``interpolate``.

    Example:
        >>> import mpitensor as mt
        >>> Upsample(scale_factor=2)(mt.zeros(1, 1, 2, 2)).shape
        mpitensor.Size([1, 1, 4, 4])
    """

    def __init__(self, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                 align_corners: Optional[bool] = None,
                 recompute_scale_factor: Optional[bool] = None) -> None:
        super().__init__()
        self.name = type(self).__name__
        self.size = size
        if isinstance(scale_factor, (tuple, list)):
            self.scale_factor = tuple(float(s) for s in scale_factor)
        else:
            self.scale_factor = float(scale_factor) if scale_factor else None
        self.mode = mode
        self.align_corners = align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.interpolate(input, self.size, self.scale_factor, self.mode, self.align_corners,
                             recompute_scale_factor=self.recompute_scale_factor)

    def extra_repr(self) -> str:
        if self.scale_factor is not None:
            info = f"scale_factor={self.scale_factor!r}"
        else:
            info = f"size={self.size!r}"
        return info + f", mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    """Nearest-neighbour upsampling of (N, C, H, W) inputs.

    Example:
        >>> import mpitensor as mt
        >>> UpsamplingNearest2d(scale_factor=2)(mt.zeros(1, 1, 2, 2)).shape
        mpitensor.Size([1, 1, 4, 4])
    """

    def __init__(self, size: Any = None, scale_factor: Any = None) -> None:
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """Bilinear upsampling of (N, C, H, W) inputs, with ``align_corners=True``.

    Example:
        >>> import mpitensor as mt
        >>> UpsamplingBilinear2d(size=3)(mt.zeros(1, 1, 2, 2)).shape
        mpitensor.Size([1, 1, 3, 3])
    """

    def __init__(self, size: Any = None, scale_factor: Any = None) -> None:
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)
