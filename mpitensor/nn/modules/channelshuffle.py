"""``torch.nn.modules.channelshuffle``: ``ChannelShuffle`` (the channels of each group
interleaved)."""

from __future__ import annotations

from .. import functional as F  # noqa: N812 - torch's spelling
from .pixelshuffle import _one_number

__all__ = ["ChannelShuffle"]

ChannelShuffle = _one_number("ChannelShuffle", "groups", F.channel_shuffle, """\
Interleave channels across ``groups``.

    Example:
        >>> import mpitensor as mt
        >>> ChannelShuffle(2)(mt.arange(4.0).reshape(1, 4, 1)).flatten()
        tensor([0., 2., 1., 3.])
    """, __name__)
