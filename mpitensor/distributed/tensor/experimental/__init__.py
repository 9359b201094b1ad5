"""``torch.distributed.tensor.experimental`` on MPI: :func:`implicit_replication` (plain
tensors beside DTensors taken as replicated), :func:`local_map` (a function on local pieces,
its outputs wrapped as DTensors), :func:`register_sharding` (a user's sharding strategies for
an op, on mpitensor's rule registry) and :func:`context_parallel` (not implemented: raises).

Example (``mpiexec -n 2``)::

    from mpitensor.distributed.tensor.experimental import implicit_replication, local_map
    with implicit_replication():
        y = dt * mpitensor.ones(dt.shape[-1])
"""

from __future__ import annotations

from typing import Any, Optional

from ._implicit import implicit_replication
from ._local_map import local_map
from ._register_sharding import TensorSpec, register_sharding

__all__ = ["context_parallel", "implicit_replication", "local_map", "register_sharding",
           "TensorSpec"]


def context_parallel(mesh: Any, *, buffers: Optional[list] = None,
                     buffer_seq_dims: Optional[list] = None,
                     no_restore_buffers: Optional[set] = None) -> Any:
    """Not implemented: raises NotImplementedError.

    torch's context parallelism shards the given buffers along their sequence dims in place
    (load-balanced for causal attention) and, inside the context, runs every
    ``scaled_dot_product_attention`` call as ring attention: each rank's queries meet every
    rank's keys and values, passed round the ring, with the online-softmax merge of the
    partial results and its own backward. mpitensor's attention rule gathers a sequence-sharded
    query, key and value before computing (docs/sharding.md), and has no ring kernel, so
    nothing here would give the memory saving the context promises.
    """
    raise NotImplementedError(
        "context_parallel is not implemented in mpitensor: it needs ring attention (keys and "
        "values passed round the mesh with an online-softmax merge, forward and backward), "
        "which mpitensor's scaled_dot_product_attention does not have. Shard the batch or the "
        "heads instead (F.scaled_dot_product_attention keeps a batch or head Shard), or pass "
        "DTensors sharded on the sequence dim, which the attention rule gathers first")
