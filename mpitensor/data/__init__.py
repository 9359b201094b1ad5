"""Datasets, samplers and the DataLoader, with ``torch.utils.data``'s names and semantics.

``mpitensor.utils.data`` is the same module under torch's path, so
``from mpitensor.utils.data import DataLoader, DistributedSampler, TensorDataset`` works.
Ready-made datasets live in :mod:`mpitensor.data.datasets` (``MNIST``, ``Digits``).

Example:
    >>> from mpitensor.data import DataLoader, TensorDataset
    >>> ds = TensorDataset(mpitensor.zeros(10, 3), mpitensor.arange(10))
    >>> len(DataLoader(ds, batch_size=4)), len(DataLoader(ds, batch_size=4, drop_last=True))
    (3, 2)
"""

from __future__ import annotations

from . import datasets
from .dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from .loader import DataLoader, default_collate, default_convert, get_worker_info
from .mnist import DatasetCorruptError, DatasetError, DatasetNotFoundError, DownloadError
from .sampler import (
    BatchSampler,
    DistributedEvalSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = [
    "datasets",
    "Dataset",
    "IterableDataset",
    "TensorDataset",
    "Subset",
    "ConcatDataset",
    "ChainDataset",
    "StackDataset",
    "random_split",
    "DataLoader",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "Sampler",
    "SequentialSampler",
    "RandomSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
    "BatchSampler",
    "DistributedSampler",
    "DistributedEvalSampler",
    "DatasetError",
    "DatasetNotFoundError",
    "DatasetCorruptError",
    "DownloadError",
]
