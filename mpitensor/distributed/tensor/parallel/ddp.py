"""Tensor parallelism under ``DistributedDataParallel``: a tensor-parallel module's DTensor
parameters handed to DDP as their local pieces.

``DistributedDataParallel(model, device_mesh=mesh["dp"])`` calls
:func:`_pre_dp_module_transform` on a model that ``parallelize_module`` sharded over another
mesh dimension (``mesh["tp"]``), as torch's DDP does. Each DTensor parameter is replaced by a
plain ``Parameter`` holding its local piece: the ranks of one data-parallel group hold pieces of
the same shape at the same place of the tensor-parallel layout, so averaging those pieces'
gradients over the group (what DDP does) is the data-parallel average of the DTensor gradient.
Around each forward the pieces are wrapped again as DTensors (``DTensor.from_local``, which is
differentiable: the gradient comes back into the piece), so the model's own code and the
styles' hooks see the DTensors they were written for.
"""

from __future__ import annotations

from typing import Any, List, Tuple

from mpitensor.nn.parameter import Parameter

from .._api import DTensor

__all__: List[str] = []


def _localize(module: Any) -> List[Tuple[Any, str, Any, Any, Tuple[Any, ...], Tuple[int, ...]]]:
    """Replace every DTensor parameter of ``module`` by a Parameter of its local piece."""
    entries = []
    for owner in module.modules():
        for name, p in list(owner._parameters.items()):
            if not isinstance(p, DTensor):
                continue
            piece = Parameter(p.to_local().detach(), requires_grad=p.requires_grad)
            owner.register_parameter(name, piece)
            entries.append((owner, name, piece, p.device_mesh, tuple(p.placements),
                            tuple(p.shape)))
    return entries


def _check_meshes_apart(module: Any, dp_mesh: Any) -> None:
    """Raise where a DTensor parameter of ``module`` is laid out over ranks of ``dp_mesh`` other
    than this one: its pieces would then differ across the data-parallel group."""
    dp_ranks = {int(r) for r in dp_mesh.mesh.numpy().reshape(-1)}
    for name, p in module.named_parameters():
        if not isinstance(p, DTensor):
            continue
        shared = dp_ranks & {int(r) for r in p.device_mesh.mesh.numpy().reshape(-1)}
        if len(shared) > 1:
            raise ValueError(
                f"DistributedDataParallel: parameter {name!r} is a DTensor over the mesh "
                f"{p.device_mesh.mesh.tolist()}, which shares ranks {sorted(shared)} with the "
                f"data-parallel mesh {dp_mesh.mesh.tolist()}; lay the parameters out over "
                "another mesh dimension (e.g. mesh['tp']) than the one given to DDP "
                "(mesh['dp'])")


def _pre_dp_module_transform(module: Any) -> Any:
    """Hand ``module``'s DTensor parameters to data parallelism as plain local pieces, and wrap
    them back into DTensors for the length of every forward (see the module doc)."""
    entries = _localize(module)
    if not entries:
        return module

    def wrap(_m: Any, _args: Any) -> None:
        for owner, name, piece, mesh, placements, shape in entries:
            # shadows the registered piece for attribute reads only: parameters() still
            # yields the pieces, which the optimizer and DDP's reducer own
            owner.__dict__[name] = DTensor.from_local(piece, mesh, placements,
                                                      run_check=False, shape=shape)

    def unwrap(_m: Any, _args: Any, _out: Any) -> None:
        for owner, name, *_ in entries:
            owner.__dict__.pop(name, None)

    module.register_forward_pre_hook(wrap, prepend=True)
    module.register_forward_hook(unwrap)
    return module
