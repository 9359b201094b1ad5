"""``mpitensor.utils.data.dataset``: the dataset classes at torch's import path.

Example:
    >>> from mpitensor.utils.data.dataset import Dataset, TensorDataset, random_split
"""

from __future__ import annotations

from mpitensor.data.dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "StackDataset", "ConcatDataset",
           "ChainDataset", "Subset", "random_split"]
