"""``mpitensor.utils.data``: the same names as :mod:`mpitensor.data`, at torch's import path.

Example:
    >>> from mpitensor.utils.data import DataLoader, DistributedSampler, TensorDataset
"""

from __future__ import annotations

from mpitensor.data import *  # noqa: F403
from mpitensor.data import __all__  # noqa: F401
