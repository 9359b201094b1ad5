"""``mpitensor.distributed.fsdp`` (torch's FSDP2): ``fully_shard`` and its policies.

See :mod:`mpitensor.distributed.fsdp._fully_shard` for what happens in forward and backward.
"""

from ._fully_shard import FSDPModule, UnshardHandle, fully_shard
from ._policies import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

__all__ = ["CPUOffloadPolicy", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy",
           "UnshardHandle", "fully_shard"]
