"""torch-style paths: ``mpitensor.utils.data`` is :mod:`mpitensor.data`.

Example:
    >>> from mpitensor.utils.data import DataLoader, DistributedSampler, TensorDataset
"""

from __future__ import annotations

from . import data

__all__ = ["data"]
