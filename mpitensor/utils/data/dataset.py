"""``mpitensor.utils.data.dataset``: the dataset classes at torch's import path.

Example:
    >>> from mpitensor.utils.data.dataset import Dataset, TensorDataset, random_split
"""

from __future__ import annotations

from mpitensor.data.dataset import *  # noqa: F403 - every name, at torch's path
from mpitensor.data.dataset import __all__  # noqa: F401
