"""What every mismatch test asserts after the mismatch: the group is unusable on every rank,
and the world is not."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor.distributed as dist
from mpitensor.errors import PeerFailedError


def assert_unusable_world_untouched(g) -> None:
    """The next call on ``g`` is refused; ``g`` is destroyed; the world still reduces."""
    with pytest.raises(PeerFailedError, match="unusable"):
        dist.all_reduce(np.ones(1), group=g)
    dist.destroy_process_group(g)
    x = np.ones(3)
    dist.all_reduce(x)
    assert (x == dist.get_world_size()).all()
