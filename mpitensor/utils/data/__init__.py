"""``mpitensor.utils.data``: the same names as :mod:`mpitensor.data`, at torch's import path.

Its submodules follow torch's too: ``mpitensor.utils.data.distributed.DistributedSampler``,
``.sampler``, ``.dataset`` and ``.dataloader``.

Example:
    >>> from mpitensor.utils.data import DataLoader, DistributedSampler, TensorDataset
    >>> from mpitensor.utils.data.distributed import DistributedSampler
"""

from __future__ import annotations

from mpitensor.data import *  # noqa: F403
from mpitensor.data import __all__  # noqa: F401

from . import dataloader, dataset, distributed, sampler  # noqa: E402,F401 - torch's paths
