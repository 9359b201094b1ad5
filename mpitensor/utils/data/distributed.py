"""``mpitensor.utils.data.distributed``: :class:`DistributedSampler` at torch's import path.

Example:
    >>> from mpitensor.utils.data.distributed import DistributedSampler
"""

from __future__ import annotations

from mpitensor.data import DistributedSampler

__all__ = ["DistributedSampler"]
