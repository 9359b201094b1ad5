"""``mpitensor.distributed.fsdp``: torch's FSDP2 (``fully_shard`` and its policies) and FSDP1
(``FullyShardedDataParallel``, its options and :mod:`.wrap`'s auto-wrap policies).

See :mod:`mpitensor.distributed.fsdp._fully_shard` for what happens in forward and backward,
and :mod:`mpitensor.distributed.fsdp._fsdp1` for how FSDP1 maps onto it.
"""

from . import fully_sharded_data_parallel, wrap
from ._fully_shard import FSDPModule, UnshardHandle, fully_shard
from ._policies import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from .fully_sharded_data_parallel import *  # noqa: F403 - FSDP1's names, as torch exports them

__all__ = ["CPUOffloadPolicy", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy",
           "UnshardHandle", "fully_shard", "wrap", *fully_sharded_data_parallel.__all__]
