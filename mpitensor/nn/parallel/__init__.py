"""Data parallelism: ``DistributedDataParallel`` and the tutorials' explicit gradient sync.

Example:
    >>> from mpitensor.nn.parallel import DistributedDataParallel as DDP
    >>> model = DDP(LeNet())                  # after dist.init_process_group()
"""

from __future__ import annotations

from .distributed import (
    CommStats,
    DistributedDataParallel,
    ReplicaDivergenceError,
    average_gradients,
    broadcast_parameters,
)

__all__ = ["DistributedDataParallel", "CommStats", "ReplicaDivergenceError", "average_gradients",
           "broadcast_parameters"]
