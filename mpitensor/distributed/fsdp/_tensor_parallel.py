"""``fully_shard`` over a tensor-parallel model (torch's 2-D recipe: FSDP over "dp", TP over
"tp").

A parameter that ``parallelize_module`` made a DTensor over a 1-D tensor-parallel mesh holds a
local piece on every rank; the ranks of one data-parallel line (the same "tp" coordinate) hold
pieces of the same shape and values. ``fully_shard`` shards that *local piece* on its dim 0 over
the data-parallel mesh, as it shards a plain parameter (``torch.chunk``'s rows, uneven allowed).
So the all-gather over "dp" before forward gives back the whole local piece, and the module
sees the tensor-parallel DTensor its plan's hooks were written for; the gradient of that piece
is reduce-scattered over "dp" as any other.

Between steps the parameter is a DTensor over the 2-D mesh of both lines. Its layout: the
tensor-parallel placement cuts the tensor first, then "dp" cuts that piece on dim 0. DTensor
nests shards of one tensor dim in mesh order (the first mesh dim cuts first), so that layout is
exactly the placements ``(tp_placement, Shard(0))`` on the mesh ordered ``("tp", "dp")`` (torch
writes the same layout as ``(_StridedShard(0, split_factor=tp), Shard(0))`` on ``("dp",
"tp")``). Every DTensor operation then takes it as it is: ``full_tensor()``, ``redistribute``,
distributed checkpoints (each rank's block is one contiguous box of the global tensor).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from mpitensor.nn import Parameter

__all__: List[str] = []


class TPLayout:
    """One tensor-parallel parameter's two layouts: over "tp" (gathered, what the module sees)
    and over ("tp", "dp") (sharded, what the optimizer and ``state_dict`` see)."""

    def __init__(self, param: Any, mesh_2d: Any) -> None:
        from ..tensor import Shard

        self.tp_mesh = param.device_mesh
        self.tp_placements = tuple(param.placements)
        self.global_shape = tuple(param.shape)
        self.mesh = mesh_2d
        self.placements = self.tp_placements + (Shard(0),)

    def unsharded(self, piece: Any, requires_grad: bool) -> Any:
        """The gathered local piece as the tensor-parallel DTensor parameter."""
        from ..tensor import DTensor

        d = DTensor.from_local(piece, self.tp_mesh, self.tp_placements, run_check=False,
                               shape=self.global_shape)
        return Parameter(d, requires_grad=requires_grad)

    def sharded(self, rows: Any, requires_grad: bool) -> Any:
        """This rank's rows of the local piece as a DTensor parameter on the 2-D mesh."""
        from ..tensor import DTensor

        d = DTensor.from_local(rows, self.mesh, self.placements, run_check=False,
                               shape=self.global_shape)
        return Parameter(d, requires_grad=requires_grad)

    def box(self) -> Tuple[slice, ...]:
        """This rank's block of the global tensor (one slice per dim)."""
        from ..tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(self.global_shape, self.mesh,
                                                              self.placements)
        return tuple(slice(o, o + s) for s, o in zip(shape, offset))


def _ranks(mesh: Any) -> List[int]:
    return [int(r) for r in mesh.mesh.numpy().reshape(-1)]


def check_tp_params(managed: Dict[int, Tuple[Any, List[Tuple[Any, str]]]],
                    dp_mesh: Any) -> None:
    """Refuse, on every rank alike and before any traffic, what the 2-D layout cannot hold."""
    from ..tensor import DTensor

    for p, owners in managed.values():
        if isinstance(p, DTensor):
            _check_tp_param(p, owners[0][1], dp_mesh)


def _check_tp_param(p: Any, name: str, dp_mesh: Any) -> None:
    where = f"fully_shard: parameter {name!r}"
    if dp_mesh.ndim != 1:
        raise NotImplementedError(
            f"{where} is a DTensor {p.placements} on {p.device_mesh!r}, and the mesh given to "
            f"fully_shard is {dp_mesh.ndim}-D (HSDP); HSDP over a tensor-parallel model (a "
            "3-D mesh) is not supported: give fully_shard a 1-D data-parallel mesh")
    if p.device_mesh.ndim != 1:
        raise NotImplementedError(
            f"{where} is a DTensor over a {p.device_mesh.ndim}-D mesh; fully_shard shards "
            "tensor-parallel parameters of a 1-D mesh (e.g. mesh['tp']) only")
    if any(pl.is_partial() for pl in p.placements):
        raise ValueError(f"{where} is a Partial DTensor {p.placements}; a parameter must be "
                         "Shard or Replicate over the tensor-parallel mesh")
    shared = set(_ranks(dp_mesh)) & set(_ranks(p.device_mesh))
    if len(shared) > 1:
        raise ValueError(
            f"{where} is a DTensor over the mesh {p.device_mesh.mesh.tolist()}, which shares "
            f"ranks {sorted(shared)} with the data-parallel mesh {dp_mesh.mesh.tolist()}; "
            "lay the parameters out over another mesh dimension (e.g. mesh['tp']) than the "
            "one given to fully_shard (mesh['dp'])")


def _mesh_2d(dp_mesh: Any, tp_mesh: Any, pg: Any) -> Any:
    """The ("tp", "dp") mesh of the two lines through this rank: one all_gather_object over
    "dp" of each member's "tp" line (the sub-meshes keep no link to the mesh they came from)."""
    import mpitensor.distributed as dist

    from ..device_mesh import DeviceMesh

    gathered: List[Any] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(gathered, (dist.get_rank(), _ranks(tp_mesh)), group=pg)
    members, lines = [r for r, _ in gathered], [line for _, line in gathered]
    flat = [r for line in lines for r in line]
    # a grid: the lines are alike in length and disjoint, and each data-parallel rank sits at
    # one place in its line (else the ranks sharding a piece over "dp" hold different pieces)
    places = {line.index(r) if r in line else -1 for line, r in zip(lines, members)}
    if len({len(line) for line in lines}) != 1 or len(set(flat)) != len(flat) or \
            len(places) != 1 or -1 in places:
        raise ValueError(f"fully_shard: the tensor-parallel meshes of the data-parallel ranks "
                         f"{members} do not form a grid with it ({lines}): the "
                         "tensor-parallel mesh is not a sub-mesh of the data-parallel mesh's "
                         "parent; build both from one init_device_mesh, e.g. mesh['dp'] and "
                         "mesh['tp']")
    grid = np.array(lines, dtype=np.int64).T  # (tp, dp)
    names = (tp_mesh.mesh_dim_names or (None,)) + (dp_mesh.mesh_dim_names or (None,))
    mesh = DeviceMesh.__new__(DeviceMesh)
    mesh._setup(dp_mesh.device_type, np.ascontiguousarray(grid),
                None if None in names or len(set(names)) != 2 else names, dp_mesh.get_rank())
    mesh._groups = [tp_mesh.get_group(), dp_mesh.get_group()]
    return mesh


def tp_layouts(managed: Dict[int, Tuple[Any, List[Tuple[Any, str]]]], dp_mesh: Any,
               pg: Any) -> Dict[int, TPLayout]:
    """For every DTensor parameter of ``managed``: its 2-D layout (id -> TPLayout).

    Collective over ``pg`` (one gather per tensor-parallel mesh), in the order of ``managed``,
    which is the same on every rank of a data-parallel line (checked before: call it after
    :func:`check_tp_params` and the parameters' cross-rank check).
    """
    from ..tensor import DTensor

    meshes: Dict[Any, Any] = {}
    out: Dict[int, TPLayout] = {}
    for key, (p, _owners) in managed.items():
        if not isinstance(p, DTensor):
            continue
        if p.device_mesh not in meshes:
            meshes[p.device_mesh] = _mesh_2d(dp_mesh, p.device_mesh, pg)
        out[key] = TPLayout(p, meshes[p.device_mesh])
    return out


def load_piece(value: Any, layout: Optional[TPLayout], start: int, stop: int) -> Optional[Any]:
    """This rank's block of a state-dict entry for a tensor-parallel parameter, or None where
    ``value`` is laid out neither as the parameter nor over "tp" nor whole."""
    from ..tensor import DTensor

    if isinstance(value, DTensor):
        if value.device_mesh == layout.mesh and tuple(value.placements) == layout.placements:
            return value._local_tensor
        if value.device_mesh == layout.tp_mesh and \
                tuple(value.placements) == layout.tp_placements:
            return value._local_tensor[start:stop]
        return None
    if tuple(value.shape) != layout.global_shape:
        return None
    return value[layout.box()]
