"""``torch.distributed.tensor`` on MPI: tensors split, replicated or partially summed over the
ranks of a :class:`DeviceMesh`.

Example (``mpiexec -n 4``)::

    from mpitensor.distributed.tensor import distribute_tensor, init_device_mesh, Shard
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    w = distribute_tensor(mt.randn(8, 4), mesh, [Replicate(), Shard(0)])
    (w * 2).full_tensor()

The operations a DTensor supports are those with a sharding rule (``_dispatch``); the rule
files are the modules ``_rules_*.py`` and ``_ops_*.py`` of this package, all imported here.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..device_mesh import DeviceMesh, init_device_mesh
from ._api import DTensor, distribute_module, distribute_tensor
from ._factories import empty, full, ones, rand, randn, zeros
from .placement_types import Partial, Placement, Replicate, Shard

__all__ = ["DTensor", "DeviceMesh", "init_device_mesh", "Placement", "Shard", "Replicate",
           "Partial", "distribute_tensor", "distribute_module", "zeros", "ones", "empty",
           "full", "rand", "randn"]


def _load_rules() -> None:
    """Import every rule module of this package (a new ``_ops_*.py`` needs no edit here)."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith(("_rules_", "_ops_")):
            importlib.import_module(f"{__name__}.{info.name}")


_load_rules()
