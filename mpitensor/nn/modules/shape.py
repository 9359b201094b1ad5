"""Modules that rearrange or resize with ``torch.nn``'s names: :class:`Unflatten`,
:class:`PixelShuffle`, :class:`PixelUnshuffle`, :class:`ChannelShuffle`, :class:`Unfold`,
:class:`Fold`, :class:`Upsample`, :class:`UpsamplingNearest2d`,
:class:`UpsamplingBilinear2d`.

Example:
    >>> import mpitensor as mt
    >>> Unflatten(1, (2, 3))(mt.zeros(4, 6)).shape
    mpitensor.Size([4, 2, 3])
"""

from __future__ import annotations

import math
from typing import Any, Optional

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from .._functional.checks import is_int
from .._functional.checks import wrap_dim
from .module import Module

__all__ = ["Unflatten", "PixelShuffle", "PixelUnshuffle", "ChannelShuffle", "Unfold", "Fold",
           "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d"]


class Unflatten(Module):
    """Split dimension ``dim`` into ``unflattened_size`` (which may hold one -1).

    Raises:
        TypeError: a non-integer dim or size. RuntimeError (in forward): sizes whose product
            is not the dimension's size.

    Example:
        >>> import mpitensor as mt
        >>> Unflatten(-1, (2, -1))(mt.zeros(6)).shape
        mpitensor.Size([2, 3])
    """

    def __init__(self, dim: int, unflattened_size: Any) -> None:
        super().__init__()
        if not is_int(dim):
            raise TypeError(f"Unflatten: dim must be an int, got {dim!r}")
        if not isinstance(unflattened_size, (tuple, list)) or \
                not all(is_int(s) for s in unflattened_size):
            raise TypeError(f"Unflatten: unflattened_size must be a tuple or list of ints, got "
                            f"{unflattened_size!r}")
        self.dim = dim
        self.unflattened_size = unflattened_size

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        d = wrap_dim(self.dim, input.ndim, "Unflatten")
        sizes = list(self.unflattened_size)
        n = input.shape[d]
        if sizes.count(-1) == 1:
            known = math.prod(s for s in sizes if s != -1)
            sizes[sizes.index(-1)] = n // known if known else 0
        if math.prod(sizes) != n:
            raise RuntimeError(f"Unflatten: sizes {tuple(self.unflattened_size)} do not multiply "
                               f"to the size {n} of dimension {d}")
        shape = tuple(input.shape)
        return input.reshape(shape[:d] + tuple(sizes) + shape[d + 1:])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class PixelShuffle(Module):
    """(*, C r^2, H, W) -> (*, C, H r, W r).

    Example:
        >>> import mpitensor as mt
        >>> PixelShuffle(2)(mt.zeros(1, 4, 3, 3)).shape
        mpitensor.Size([1, 1, 6, 6])
    """

    def __init__(self, upscale_factor: int) -> None:
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.pixel_shuffle(input, self.upscale_factor)

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """(*, C, H r, W r) -> (*, C r^2, H, W).

    Example:
        >>> import mpitensor as mt
        >>> PixelUnshuffle(2)(mt.zeros(1, 1, 6, 6)).shape
        mpitensor.Size([1, 4, 3, 3])
    """

    def __init__(self, downscale_factor: int) -> None:
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.pixel_unshuffle(input, self.downscale_factor)

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"


class ChannelShuffle(Module):
    """Interleave channels across ``groups``.

    Example:
        >>> import mpitensor as mt
        >>> ChannelShuffle(2)(mt.arange(4.0).reshape(1, 4, 1)).flatten()
        tensor([0., 2., 1., 3.])
    """

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.groups = groups

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.channel_shuffle(input, self.groups)

    def extra_repr(self) -> str:
        return f"groups={self.groups}"


class Unfold(Module):
    """Extract sliding blocks (im2col); see :func:`~mpitensor.nn.functional.unfold`.

    Example:
        >>> import mpitensor as mt
        >>> Unfold(2)(mt.zeros(1, 3, 4, 4)).shape
        mpitensor.Size([1, 12, 9])
    """

    def __init__(self, kernel_size: Any, dilation: Any = 1, padding: Any = 0,
                 stride: Any = 1) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.padding = padding
        self.stride = stride

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, dilation={self.dilation}, "
                f"padding={self.padding}, stride={self.stride}")


class Fold(Module):
    """Sum sliding blocks into an image (col2im); see :func:`~mpitensor.nn.functional.fold`.

    Example:
        >>> import mpitensor as mt
        >>> Fold((3, 3), 2)(mt.zeros(1, 4, 4)).shape
        mpitensor.Size([1, 1, 3, 3])
    """

    def __init__(self, output_size: Any, kernel_size: Any, dilation: Any = 1, padding: Any = 0,
                 stride: Any = 1) -> None:
        super().__init__()
        self.output_size = output_size
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.padding = padding
        self.stride = stride

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.fold(input, self.output_size, self.kernel_size, self.dilation, self.padding,
                      self.stride)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, kernel_size={self.kernel_size}, "
                f"dilation={self.dilation}, padding={self.padding}, stride={self.stride}")


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
