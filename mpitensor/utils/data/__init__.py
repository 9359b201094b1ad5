"""``mpitensor.utils.data``: the same names as :mod:`mpitensor.data`, at torch's import path.

Its submodules follow torch's too: ``mpitensor.utils.data.distributed.DistributedSampler``,
``.sampler``, ``.dataset`` and ``.dataloader``.

Example:
    >>> from mpitensor.utils.data import DataLoader, DistributedSampler, TensorDataset
    >>> from mpitensor.utils.data.distributed import DistributedSampler
"""

from __future__ import annotations

from mpitensor.data import *  # noqa: F403
from mpitensor.data import __all__ as _data_names

from . import (  # noqa: F401 - torch's paths
    dataloader,
    datapipes,
    dataset,
    distributed,
    graph,
    graph_settings,
    sampler,
)
from .datapipes import *  # noqa: F403 - IterDataPipe, functional_datapipe, ...
from .datapipes import __all__ as _pipe_names

__all__ = [*_data_names, *_pipe_names]
