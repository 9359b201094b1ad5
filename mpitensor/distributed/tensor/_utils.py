"""Where a rank's shard of a DTensor lies in the global tensor.

Used by DTensor itself and by the layers above it (FSDP, distributed checkpoints), which need
the shape and the global offset of this rank's piece without communicating.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from ..device_mesh import DeviceMesh
from .placement_types import Placement, Shard, shard_size_and_offset

__all__ = ["compute_local_shape_and_global_offset", "normalize_placements", "local_shape_at"]


def normalize_placements(placements: Sequence[Placement], mesh: DeviceMesh, ndim: int,
                         where: str) -> Tuple[Placement, ...]:
    """``placements`` checked against ``mesh`` and a tensor of ``ndim`` dimensions, with
    negative Shard dims made positive.

    Raises:
        TypeError: an entry that is not a Placement.
        ValueError: not one placement per mesh dimension, or a Shard dim outside the tensor.
    """
    if isinstance(placements, Placement):
        placements = (placements,)
    try:
        placements = tuple(placements)
    except TypeError:
        raise TypeError(f"{where}: placements must be a sequence of Placement, got "
                        f"{placements!r}") from None
    if len(placements) != mesh.ndim:
        raise ValueError(f"{where}: {len(placements)} placements {list(placements)} for a "
                         f"mesh of {mesh.ndim} dimension(s) {mesh.shape}; give one placement "
                         "per mesh dimension")
    out: List[Placement] = []
    for p in placements:
        if not isinstance(p, Placement):
            raise TypeError(f"{where}: {p!r} in placements is not a Shard, Replicate or "
                            "Partial")
        if isinstance(p, Shard):
            if not -ndim <= p.dim < max(ndim, 1) or ndim == 0:
                raise ValueError(f"{where}: {p!r} is beyond the tensor's {ndim} "
                                 f"dimension(s); shard a dim in [{-ndim}, {ndim - 1}]")
            if p.dim < 0:
                p = Shard(p.dim + ndim)
        out.append(p)
    return tuple(out)



def compute_local_shape_and_global_offset(
        global_shape: Sequence[int], mesh: DeviceMesh,
        placements: Sequence[Placement]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """This rank's shard of a tensor of ``global_shape`` placed on ``mesh``: its shape and
    the global index of its first element.

    Shards on the same tensor dimension from several mesh dimensions nest in mesh order (the
    first mesh dimension cuts the tensor, the next cuts that piece). A rank outside the mesh
    gets ``((0,), ())``, as in torch.

    Example:
        >>> mesh = init_device_mesh("cpu", (4,))
        >>> compute_local_shape_and_global_offset((10, 3), mesh, [Shard(0)])
        ((3, 3), (3, 0))                      # on rank 1; rank 3 gets ((1, 3), (9, 0))
    """
    shape = [int(s) for s in global_shape]
    placements = normalize_placements(placements, mesh, len(shape),
                                      "compute_local_shape_and_global_offset")
    coord = mesh.get_coordinate()
    if coord is None:
        return (0,), ()
    return _shape_offset_at(shape, mesh, placements, coord)


def _shape_offset_at(shape: List[int], mesh: DeviceMesh, placements: Sequence[Placement],
                     coord: Sequence[int]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    shape = list(shape)
    offset = [0] * len(shape)
    for mdim, p in enumerate(placements):
        if isinstance(p, Shard):
            size, start = shard_size_and_offset(shape[p.dim], mesh.size(mdim), coord[mdim])
            shape[p.dim] = size
            offset[p.dim] += start
    return tuple(shape), tuple(offset)


def local_shape_at(global_shape: Sequence[int], mesh: DeviceMesh,
                   placements: Sequence[Placement], coord: Sequence[int]) -> Tuple[int, ...]:
    """The shape of the piece at mesh coordinate ``coord`` (placements already checked)."""
    return _shape_offset_at([int(s) for s in global_shape], mesh, placements, coord)[0]
