"""``mpitensor.distributed.nn`` (``torch.distributed.nn``): collectives that carry gradients.

``from mpitensor.distributed.nn import functional`` gives ``all_reduce``, ``all_gather``,
``broadcast``, ``reduce``, ``gather``, ``scatter``, ``reduce_scatter``, ``all_to_all`` and
``all_to_all_single`` as differentiable functions: each returns new tensors (the input is left
as it is) and backward runs the adjoint collective, so a loss computed from gathered
activations sends each rank the gradient of its own part. See :mod:`.functional`.
"""

from __future__ import annotations

from . import functional
from .functional import (
    all_gather,
    all_reduce,
    all_to_all,
    all_to_all_single,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)

__all__ = ["functional", "all_gather", "all_reduce", "all_to_all", "all_to_all_single",
           "broadcast", "gather", "reduce", "reduce_scatter", "scatter"]
