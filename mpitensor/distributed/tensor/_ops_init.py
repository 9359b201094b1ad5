"""``nn.init`` on DTensors: a module's ``reset_parameters`` (or a user's ``nn.init.normal_``)
after ``fully_shard`` or ``parallelize_module`` fills each rank's piece.

Every rank draws the whole tensor with its generator, as one process would, and keeps its own
block. So under the same seed the parameters are exactly those of a single process (the
generators of all ranks advance alike), whatever the mesh and placements; the cost is one
whole-size temporary per call, as ``distribute_tensor`` needs. A ``Partial`` tensor is refused
(its pieces are terms of a sum, not blocks of values).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import mpitensor.nn.init as _init

from ._utils import compute_local_shape_and_global_offset
from .placement_types import Partial

# the in-place initializers (their old spellings without "_" call these objects directly)
_FILLS = ("constant_", "dirac_", "eye_", "kaiming_normal_", "kaiming_uniform_", "normal_",
          "ones_", "orthogonal_", "sparse_", "trunc_normal_", "uniform_", "xavier_normal_",
          "xavier_uniform_", "zeros_")


def _fill_dtensor(fill: Callable[..., Any], tensor: Any, args: Any, kwargs: Any) -> Any:
    name = fill.__name__
    if any(isinstance(p, Partial) for p in tensor.placements):
        raise ValueError(f"nn.init.{name}: the DTensor is Partial {tensor.placements}; its "
                         "pieces are terms of a sum: redistribute it to Shard or Replicate "
                         "first")
    local = tensor._local_tensor
    whole = local.new_zeros(tuple(tensor.shape))  # this piece's dtype and device
    fill(whole, *args, **kwargs)
    shape, offset = compute_local_shape_and_global_offset(tuple(tensor.shape),
                                                          tensor.device_mesh,
                                                          tuple(tensor.placements))
    box = tuple(slice(o, o + s) for s, o in zip(shape, offset))
    local._data[...] = whole._data[box]
    return tensor


def _dispatching(fill: Callable[..., Any], dtensor_cls: type) -> Callable[..., Any]:
    @functools.wraps(fill)
    def init(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(tensor, dtensor_cls):
            return _fill_dtensor(fill, tensor, args, kwargs)
        return fill(tensor, *args, **kwargs)

    init._fills_dtensors = True  # type: ignore[attr-defined]
    return init


def _install() -> None:
    from ._api import DTensor

    for name in _FILLS:
        fill = getattr(_init, name, None)
        if fill is None or getattr(fill, "_fills_dtensors", False):
            continue
        setattr(_init, name, _dispatching(fill, DTensor))


_install()

__all__: Sequence[str] = []
