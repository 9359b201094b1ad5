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


def _fixed(name: str, what: str, call: str, out: int, **fixed: Any) -> type:
    """An :class:`Upsample` of (N, C, H, W) inputs taking ``size`` and ``scale_factor`` only,
    the rest ``fixed``; its docstring is ``what`` and an example: ``name(call)`` of a 2 x 2
    image is ``out`` x ``out``."""

    def __init__(self: Upsample, size: Any = None, scale_factor: Any = None) -> None:
        Upsample.__init__(self, size, scale_factor, **fixed)

    doc = (f"{what}\n\n    Example:\n        >>> import mpitensor as mt\n"
           f"        >>> {name}({call})(mt.zeros(1, 1, 2, 2)).shape\n"
           f"        mpitensor.Size([1, 1, {out}, {out}])\n    ")
    return type(name, (Upsample,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


UpsamplingNearest2d = _fixed("UpsamplingNearest2d", "Nearest-neighbour upsampling of (N, C, H, W) "
                             "inputs.", "scale_factor=2", 4, mode="nearest")
UpsamplingBilinear2d = _fixed("UpsamplingBilinear2d", "Bilinear upsampling of (N, C, H, W) "
                              "inputs, with ``align_corners=True``.", "size=3", 3,
                              mode="bilinear", align_corners=True)
