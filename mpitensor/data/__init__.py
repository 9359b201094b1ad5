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

from . import dataset as _dataset
from . import datasets
from . import loader as _loader
from . import sampler as _sampler
from .dataset import *  # noqa: F403 - the names listed in each module's __all__
from .loader import *  # noqa: F403
from .mnist import DatasetCorruptError, DatasetError, DatasetNotFoundError, DownloadError
from .sampler import *  # noqa: F403

__all__ = ["datasets", *_dataset.__all__, *_loader.__all__, *_sampler.__all__,
           "DatasetError", "DatasetNotFoundError", "DatasetCorruptError", "DownloadError"]
