"""``mpitensor.distributed.optim`` (torch's ``torch.distributed.optim``).

- :class:`DistributedOptimizer`: one optimizer over parameters held by several RPC workers.
- :class:`ZeroRedundancyOptimizer`: any optimizer with its state sharded across the ranks of
  a process group (ZeRO stage 1).
"""

from .optimizer import DistributedOptimizer
from .zero_redundancy_optimizer import ZeroRedundancyOptimizer

__all__ = ["DistributedOptimizer", "ZeroRedundancyOptimizer"]
