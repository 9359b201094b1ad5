"""``torch.distributed.tensor`` on MPI: tensors split or replicated over a DeviceMesh."""

from __future__ import annotations

from ..device_mesh import DeviceMesh, init_device_mesh
from .placement_types import Partial, Placement, Replicate, Shard

__all__ = ["DeviceMesh", "init_device_mesh", "Placement", "Shard", "Replicate", "Partial"]
