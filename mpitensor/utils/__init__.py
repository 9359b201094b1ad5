"""torch-style paths: ``mpitensor.utils.data`` is :mod:`mpitensor.data`;
``mpitensor.utils.checkpoint`` is activation checkpointing.

Example:
    >>> from mpitensor.utils.data import DataLoader, DistributedSampler, TensorDataset
"""

from __future__ import annotations

from . import checkpoint, data

__all__ = ["checkpoint", "data"]
