"""``mpitensor.utils.data.sampler``: the samplers at torch's import path.

Example:
    >>> from mpitensor.utils.data.sampler import RandomSampler, WeightedRandomSampler
"""

from __future__ import annotations

from mpitensor.data.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = ["BatchSampler", "RandomSampler", "Sampler", "SequentialSampler",
           "SubsetRandomSampler", "WeightedRandomSampler"]
