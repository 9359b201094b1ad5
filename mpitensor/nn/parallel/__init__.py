"""Data parallelism: ``DistributedDataParallel``, ``DataParallel`` and their building blocks.

``DistributedDataParallel`` averages gradients over MPI ranks (``docs/ddp.md``);
``DataParallel`` splits each batch over the GPUs of one process (and simply calls the module
where there is no GPU), built from ``scatter``, ``replicate``, ``parallel_apply`` and
``gather``, as in torch.

Example:
    >>> from mpitensor.nn.parallel import DistributedDataParallel as DDP
    >>> model = DDP(LeNet())                  # after dist.init_process_group()
"""

from __future__ import annotations

from .data_parallel import DataParallel, data_parallel
from .distributed import (
    CommStats,
    DistributedDataParallel,
    ReplicaDivergenceError,
    average_gradients,
    broadcast_parameters,
)
from .parallel_apply import parallel_apply
from .replicate import replicate
from .scatter_gather import gather, scatter

__all__ = ["DistributedDataParallel", "CommStats", "ReplicaDivergenceError", "average_gradients",
           "broadcast_parameters", "DataParallel", "data_parallel", "replicate", "scatter",
           "gather", "parallel_apply"]
