"""Putting whole tensors and modules onto a mesh: the scatter behind ``distribute_tensor``,
``distribute_module``, and the cross-rank agreement that checks their arguments first."""

from __future__ import annotations

import inspect
from typing import Any, Callable, List, Optional, Sequence

import mpitensor.distributed as dist
from mpitensor import backend as _backend
from mpitensor.nn.parameter import Parameter
from mpitensor.tensor import Tensor

from ..device_mesh import DeviceMesh
from ._redistribute import partition_value, redistribute_array
from .placement_types import Partial, Placement, Replicate, Shard, shard_size_and_offset

__all__ = ["agree", "distribute_local", "distribute_module"]


def agree(mesh: DeviceMesh, mine: Any, check: Callable[[List[Any], int], Optional[str]],
          where: str) -> None:
    """Gather ``mine`` along every mesh dimension and raise, on every rank of the mesh, if
    ``check(gathered, mesh_dim)`` finds a problem on any of them.

    One small pickled all-gather per mesh dimension, plus one per dimension but the last to
    spread a problem found late to the ranks of the other lines.
    """
    if mesh.get_coordinate() is None:
        return
    problem: Optional[str] = None
    for m in range(mesh.ndim):
        seen: List[Any] = [None] * mesh.size(m)
        dist.all_gather_object(seen, (mine, problem), group=mesh.get_group(m))
        problem = next((p for _, p in seen if p), None) or check([s for s, _ in seen], m)
    for m in range(mesh.ndim - 1):
        flags: List[Any] = [None] * mesh.size(m)
        dist.all_gather_object(flags, problem, group=mesh.get_group(m))
        problem = next((p for p in flags if p), None)
    if problem:
        raise ValueError(f"{where}: {problem} (rank {dist.get_rank()}); every rank of the mesh "
                         "must pass matching arguments")


def _same_everywhere(seen: List[Any], m: int) -> Optional[str]:
    odd = [c for c, s in enumerate(seen) if s != seen[0]]
    if odd:
        return (f"along mesh dim {m}, index 0 passed {seen[0]} but index(es) {odd} passed "
                f"{[seen[c] for c in odd]}")
    return None


def _scatter_dim(x: Any, dim: int, mesh: DeviceMesh, m: int, src: int) -> Any:
    """Shard(dim) from the rank at index ``src`` of mesh dim ``m`` (one scatter)."""
    xp = _backend.array_module(x)
    k, n = mesh.size(m), x.shape[dim]
    c = -(-n // k)
    front = xp.moveaxis(x, dim, 0)
    out = xp.empty((c,) + front.shape[1:], dtype=x.dtype)
    pieces = None
    if mesh.get_local_rank(m) == src:
        buf = xp.empty((k, c) + front.shape[1:], dtype=x.dtype)  # pads are trimmed
        for r in range(k):  # one slab copy per rank
            size, start = shard_size_and_offset(n, k, r)
            buf[r, :size] = front[start:start + size]
        pieces = list(buf)
    dist.scatter(out, pieces, group=mesh.get_group(m), group_src=src)
    size, _ = shard_size_and_offset(n, k, mesh.get_local_rank(m))
    return xp.ascontiguousarray(xp.moveaxis(out[:size], 0, dim))


def distribute_local(tensor: Tensor, mesh: DeviceMesh, placements: Sequence[Placement],
                     src: Optional[int]) -> Tensor:
    """This rank's piece of ``tensor`` laid out as ``placements``, from index ``src``."""
    meta = (tuple(tensor.shape), str(tensor.dtype), tuple(placements), src)
    agree(mesh, meta, _same_everywhere, "distribute_tensor")
    if src is not None and not all(0 <= src < mesh.size(m) for m in range(mesh.ndim)):
        raise ValueError(f"distribute_tensor: src_data_rank {src} is not an index along every "
                         f"mesh dimension of {mesh.shape}")
    x = tensor._data
    if mesh.get_coordinate() is None:
        return Tensor(x[tuple(slice(0, 0) for _ in x.shape)] if x.ndim else x.reshape(0))
    if src is None:
        y = redistribute_array(x, tuple(tensor.shape), mesh, [Replicate()] * mesh.ndim,
                               placements)
        return Tensor(_backend.array_module(x).array(y, copy=True, order="C"))
    copied = False
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            x, copied = _scatter_dim(x, p.dim, mesh, m, src), True
            continue
        if not copied:  # the broadcast writes: never into the caller's tensor
            x, copied = _backend.array_module(x).array(x, copy=True, order="C"), True
        dist.broadcast(x, group=mesh.get_group(m), group_src=src)
        if isinstance(p, Partial):
            x = partition_value(x, p.reduce_op, mesh, m)
    if not copied:
        x = x.copy()
    return Tensor(x)


# ---------------------------------------------------------------------- modules
def _replicate_rest(module: Any, mesh: DeviceMesh, dtensor: type,
                    distribute_tensor: Callable[..., Any]) -> None:
    """Make every parameter and buffer still plain a replicated DTensor."""
    full = [Replicate()] * mesh.ndim
    for sub in module.modules():
        for name, p in list(sub.named_parameters(recurse=False)):
            if not isinstance(p, dtensor):
                sub.register_parameter(name, Parameter(
                    distribute_tensor(p.data, mesh, full), requires_grad=p.requires_grad))
        for name, b in list(sub.named_buffers(recurse=False)):
            if not isinstance(b, dtensor):
                sub.register_buffer(name, distribute_tensor(b, mesh, full))


def _arity(fn: Callable[..., Any]) -> int:
    try:
        return len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return 3


def distribute_module(module: Any, mesh: Optional[DeviceMesh],
                      partition_fn: Optional[Callable[..., None]],
                      input_fn: Optional[Callable[..., Any]],
                      output_fn: Optional[Callable[..., Any]], dtensor: type,
                      distribute_tensor: Callable[..., Any]) -> Any:
    if mesh is None:
        raise ValueError("distribute_module: pass device_mesh (there is no current mesh)")
    if getattr(module, "_distribute_module_applied", False):
        raise RuntimeError("distribute_module: this module was already distributed; call it "
                           "once per module")
    if partition_fn is not None:
        for name, sub in module.named_modules():
            partition_fn(name, sub, mesh)
    _replicate_rest(module, mesh, dtensor, distribute_tensor)
    if input_fn is not None:
        if _arity(input_fn) != 3:
            raise TypeError("distribute_module: input_fn must take (module, inputs, "
                            "device_mesh)")
        module.register_forward_pre_hook(lambda mod, inputs: input_fn(mod, inputs, mesh))
    if output_fn is not None:
        if _arity(output_fn) != 3:
            raise TypeError("distribute_module: output_fn must take (module, outputs, "
                            "device_mesh)")
        module.register_forward_hook(
            lambda mod, inputs, outputs: output_fn(mod, outputs, mesh))
    module._distribute_module_applied = True
    return module
