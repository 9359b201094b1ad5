"""Ready-made datasets: :class:`MNIST` (IDX files, verified download) and :class:`Digits`.

Example:
    >>> from mpitensor.data.datasets import Digits
    >>> len(Digits(train=True))
    1438
"""

from __future__ import annotations

from .digits import Digits
from .mnist import (
    MNIST,
    MNIST_MIRRORS,
    MNIST_RESOURCES,
    DatasetCorruptError,
    DatasetError,
    DatasetNotFoundError,
    DownloadError,
    download_mnist,
    read_idx,
)

__all__ = [
    "MNIST",
    "Digits",
    "DatasetError",
    "DatasetNotFoundError",
    "DatasetCorruptError",
    "DownloadError",
    "download_mnist",
    "read_idx",
    "MNIST_MIRRORS",
    "MNIST_RESOURCES",
]
