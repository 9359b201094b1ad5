"""``torch.distributed.tensor.debug`` on MPI: :class:`CommDebugMode` counts the collectives
a block of code issues (by kind and by module), :func:`visualize_sharding` prints which rank
holds which block of a DTensor.

Example (``mpiexec -n 2``)::

    from mpitensor.distributed.tensor.debug import CommDebugMode, visualize_sharding
    with CommDebugMode() as comm_mode:
        loss = model(x).sum()
        loss.backward()
    print(comm_mode.get_comm_counts())
    visualize_sharding(model.up.weight)
"""

from __future__ import annotations

from ._comm_mode import CommDebugMode
from ._op_names import ops
from ._visualize import visualize_sharding

__all__ = ["CommDebugMode", "visualize_sharding", "ops"]
