"""``torch.distributed._tensor``: the old name of :mod:`mpitensor.distributed.tensor`, which
programs written for torch before 2.4 import (``from torch.distributed._tensor import Shard``,
``from torch.distributed._tensor.device_mesh import init_device_mesh``).

Its submodules are the new package's own modules, registered under the old names, so a class
imported either way is one class (``isinstance`` holds across both spellings).
"""

from __future__ import annotations

import importlib
import sys

from ..tensor import (
    DeviceMesh,
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
    empty,
    full,
    init_device_mesh,
    ones,
    rand,
    randn,
    zeros,
)

__all__ = ["DTensor", "DeviceMesh", "init_device_mesh", "Placement", "Shard", "Replicate",
           "Partial", "distribute_tensor", "distribute_module", "zeros", "ones", "empty",
           "full", "rand", "randn"]

# old submodule name -> the module of the new package that holds its names
_SUBMODULES = {"api": "_api", "placement_types": "placement_types",
               "device_mesh": "device_mesh"}
for _old, _new in _SUBMODULES.items():
    sys.modules[f"{__name__}.{_old}"] = importlib.import_module(
        f"mpitensor.distributed.tensor.{_new}")
