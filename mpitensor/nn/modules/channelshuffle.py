"""``torch.nn.modules.channelshuffle``: ``ChannelShuffle`` (the channels of each group
interleaved)."""

from __future__ import annotations

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from ._common import _ReprFields
from .module import Module

__all__ = ["ChannelShuffle"]


class ChannelShuffle(_ReprFields, Module):
    """Interleave channels across ``groups``.

    Example:
        >>> import mpitensor as mt
        >>> ChannelShuffle(2)(mt.arange(4.0).reshape(1, 4, 1)).flatten()
        tensor([0., 2., 1., 3.])
    """

    def __init__(self, groups: int) -> None:
        super().__init__()
        self._keep(groups)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.channel_shuffle(input, self.groups)

    _repr = ("groups",)
