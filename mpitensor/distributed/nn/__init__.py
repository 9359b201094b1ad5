"""``mpitensor.distributed.nn`` (``torch.distributed.nn``): collectives that carry gradients.

``from mpitensor.distributed.nn import functional`` gives ``all_reduce``, ``all_gather``,
``broadcast``, ``reduce``, ``gather``, ``scatter``, ``reduce_scatter``, ``all_to_all`` and
``all_to_all_single`` as differentiable functions: each returns new tensors (the input is left
as it is) and backward runs the adjoint collective, so a loss computed from gathered
activations sends each rank the gradient of its own part. See :mod:`.functional`.

:class:`RemoteModule` (also ``api.remote_module.RemoteModule``) is a module built and run on
another RPC worker, with gradients through distributed autograd (see docs/rpc.md).
"""

from __future__ import annotations

from . import api, functional
from .api import RemoteModule
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

__all__ = ["api", "RemoteModule", "functional", "all_gather", "all_reduce", "all_to_all",
           "all_to_all_single", "broadcast", "gather", "reduce", "reduce_scatter", "scatter"]
