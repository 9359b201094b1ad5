"""``torch.distributed.tensor.device_mesh``: the mesh names where DTensor programs import them
(the same objects as :mod:`mpitensor.distributed.device_mesh`)."""

from __future__ import annotations

from ..device_mesh import DeviceMesh, init_device_mesh

__all__ = ["DeviceMesh", "init_device_mesh"]
