"""``torch.distributed.tensor.parallel`` on MPI: tensor parallelism by styles applied to
``nn.Linear`` and ``nn.Embedding`` (and replicated sequence-parallel layers), with
``loss_parallel`` for cross-entropy on class-sharded logits.

Example (a 2-rank MLP, ``mpiexec -n 2``)::

    mesh = init_device_mesh("cpu", (2,))
    parallelize_module(mlp, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
"""

from __future__ import annotations

from .._ops_loss import loss_parallel
from .api import parallelize_module
from .style import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

__all__ = ["parallelize_module", "ParallelStyle", "ColwiseParallel", "RowwiseParallel",
           "SequenceParallel", "PrepareModuleInput", "PrepareModuleOutput",
           "PrepareModuleInputOutput", "loss_parallel"]
