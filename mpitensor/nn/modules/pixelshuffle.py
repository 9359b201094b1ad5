"""``torch.nn.modules.pixelshuffle``: ``PixelShuffle`` and ``PixelUnshuffle`` (channels to a
finer spatial grid and back); ``ChannelShuffle`` is made here too."""

from __future__ import annotations

import inspect
from operator import attrgetter
from typing import Any, Callable

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from ._common import _ReprFields
from .module import Module

__all__ = ["PixelShuffle", "PixelUnshuffle"]


def _one_number(name: str, field: str, fn: Callable[[Tensor, Any], Tensor], doc: str,
                module: str = __name__) -> type:
    """A layer keeping the constructor's one argument as ``field`` and running
    ``fn(input, field)``; its repr is ``field=value``."""
    get = attrgetter(field)
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    signature = inspect.Signature([inspect.Parameter("self", kind), inspect.Parameter(field, kind)])

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            value = signature.bind(self, *args, **kwargs).arguments[field]
        except TypeError as e:
            raise TypeError(f"{name}(): {e}") from None
        Module.__init__(self)
        setattr(self, field, value)

    def forward(self: Any, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return fn(input, get(self))

    __init__.__signature__ = signature  # type: ignore[attr-defined]
    __init__.__qualname__, forward.__qualname__ = f"{name}.__init__", f"{name}.forward"
    return type(name, (_ReprFields, Module), {"__init__": __init__, "forward": forward,
                                              "_repr": (field,), "__doc__": doc,
                                              "__module__": module})


PixelShuffle = _one_number("PixelShuffle", "upscale_factor", F.pixel_shuffle, """\
(*, C r^2, H, W) -> (*, C, H r, W r).

    Example:
        >>> import mpitensor as mt
        >>> PixelShuffle(2)(mt.zeros(1, 4, 3, 3)).shape
        mpitensor.Size([1, 1, 6, 6])
    """)

PixelUnshuffle = _one_number("PixelUnshuffle", "downscale_factor", F.pixel_unshuffle, """\
(*, C, H r, W r) -> (*, C r^2, H, W).

    Example:
        >>> import mpitensor as mt
        >>> PixelUnshuffle(2)(mt.zeros(1, 1, 6, 6)).shape
        mpitensor.Size([1, 4, 3, 3])
    """)
