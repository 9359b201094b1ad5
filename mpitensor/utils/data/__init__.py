"""``mpitensor.utils.data``: the same names as :mod:`mpitensor.data`, at torch's import path.

Its submodules follow torch's too: ``mpitensor.utils.data.distributed.DistributedSampler``.

Example:
    >>> from mpitensor.utils.data import DataLoader, DistributedSampler, TensorDataset
    >>> from mpitensor.utils.data.distributed import DistributedSampler
"""

from __future__ import annotations

from mpitensor.data import *  # noqa: F403
from mpitensor.data import __all__  # noqa: F401

from . import distributed  # noqa: E402,F401 - torch's `torch.utils.data.distributed` path
