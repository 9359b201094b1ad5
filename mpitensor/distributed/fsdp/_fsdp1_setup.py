"""What ``FullyShardedDataParallel`` decides before it shards: its arguments checked, the mesh
of its strategy, the device, parameters on the meta device, the start from rank 0's values
and the buffers' dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

from mpitensor.dtypes import is_floating_dtype
from mpitensor.nn import Module
from mpitensor.nn.modules.batchnorm import _BatchNorm

from ._fsdp1_options import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
from ._fully_shard import FSDPModule
from ._policies import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

_HYBRID = (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)
#: the strategies that free the gathered parameters after forward
_FREE_AFTER_FORWARD = (ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD)


@dataclass
class Options:
    """One unit's checked arguments (the root's, with a policy's overrides for a unit)."""

    strategy: ShardingStrategy
    offload: bool
    mp: Optional[MixedPrecision]
    backward_prefetch: Optional[BackwardPrefetch]
    forward_prefetch: bool
    limit_all_gathers: bool
    use_orig_params: bool
    process_group: Any
    device_mesh: Any

    def replaced(self, overrides: Dict[str, Any]) -> "Options":
        """These options with a policy's overrides (constructor argument names)."""
        known = {"sharding_strategy": "strategy", "mixed_precision": "mp",
                 "backward_prefetch": "backward_prefetch", "forward_prefetch":
                 "forward_prefetch", "limit_all_gathers": "limit_all_gathers",
                 "use_orig_params": "use_orig_params", "process_group": "process_group",
                 "device_mesh": "device_mesh", "cpu_offload": "offload"}
        bad = sorted(set(overrides) - set(known))
        if bad:
            raise ValueError(f"FullyShardedDataParallel: a wrap policy overrode {bad}; a unit "
                             f"may override {sorted(known)}")
        args = dict(sharding_strategy=self.strategy, cpu_offload=CPUOffload(self.offload),
                    mixed_precision=self.mp, backward_prefetch=self.backward_prefetch,
                    forward_prefetch=self.forward_prefetch,
                    limit_all_gathers=self.limit_all_gathers,
                    use_orig_params=self.use_orig_params, process_group=self.process_group,
                    device_mesh=self.device_mesh)
        args.update(overrides)
        return checked_options(**args)

    def fully_shard_kwargs(self, is_root: bool) -> Dict[str, Any]:
        """The arguments of ``fully_shard`` for this unit."""
        mp = self.mp
        policy = MixedPrecisionPolicy()
        if mp is not None and (mp.param_dtype is not None or mp.reduce_dtype is not None):
            cast = bool(mp.cast_forward_inputs or (is_root and mp.cast_root_forward_inputs))
            policy = MixedPrecisionPolicy(param_dtype=mp.param_dtype,
                                          reduce_dtype=mp.reduce_dtype,
                                          output_dtype=getattr(mp, "output_dtype", None),
                                          cast_forward_inputs=cast)
        offload = CPUOffloadPolicy() if self.offload else OffloadPolicy()
        return dict(reshard_after_forward=self.strategy in _FREE_AFTER_FORWARD,
                    mp_policy=policy, offload_policy=offload)

    def mesh_key(self) -> Tuple[Any, ...]:
        """Units with equal keys share one mesh."""
        no_shard = self.strategy is ShardingStrategy.NO_SHARD
        return (no_shard, self.strategy in _HYBRID, id(self.process_group),
                id(self.device_mesh))


def _check_enum(value: Any, enum: Any, what: str, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, enum):
        names = ", ".join(f"{enum.__name__}.{m.name}" for m in enum)
        raise ValueError(f"FullyShardedDataParallel: {what} must be one of {names}"
                         f"{' or None' if allow_none else ''}, got {value!r}")


def checked_options(*, sharding_strategy: Any, cpu_offload: Any, mixed_precision: Any,
                    backward_prefetch: Any, forward_prefetch: Any, limit_all_gathers: Any,
                    use_orig_params: Any, process_group: Any, device_mesh: Any) -> Options:
    """The arguments checked (the same on every rank: no traffic) into :class:`Options`.

    Raises:
        ValueError, TypeError, NotImplementedError: an unknown strategy or prefetch, options of
            the wrong type, ``keep_low_precision_grads=True``.
    """
    strategy = ShardingStrategy.FULL_SHARD if sharding_strategy is None else sharding_strategy
    _check_enum(strategy, ShardingStrategy, "sharding_strategy", False)
    _check_enum(backward_prefetch, BackwardPrefetch, "backward_prefetch", True)
    if cpu_offload is not None and not isinstance(cpu_offload, CPUOffload):
        raise TypeError(f"FullyShardedDataParallel: cpu_offload must be a CPUOffload, got "
                        f"{type(cpu_offload).__name__}")
    if mixed_precision is not None:
        if not isinstance(mixed_precision, MixedPrecision):
            raise TypeError(f"FullyShardedDataParallel: mixed_precision must be a "
                            f"MixedPrecision, got {type(mixed_precision).__name__}")
        if mixed_precision.keep_low_precision_grads:
            raise NotImplementedError(
                "FullyShardedDataParallel: MixedPrecision(keep_low_precision_grads=True) is not "
                "supported: gradients come back in the parameters' dtype; leave it False")
    for name, value in (("forward_prefetch", forward_prefetch),
                        ("limit_all_gathers", limit_all_gathers),
                        ("use_orig_params", use_orig_params)):
        if not isinstance(value, bool):
            raise TypeError(f"FullyShardedDataParallel: {name} must be a bool, got {value!r}")
    if process_group is not None and device_mesh is not None:
        raise ValueError("FullyShardedDataParallel: pass process_group or device_mesh, not both")
    return Options(strategy, bool(cpu_offload and cpu_offload.offload_params), mixed_precision,
                   backward_prefetch, forward_prefetch, limit_all_gathers, use_orig_params,
                   process_group, device_mesh)


# ---- the module ----------------------------------------------------------------------------

def check_module(module: Any, fsdp_cls: type) -> None:
    """``ValueError``/``TypeError`` for a module FSDP cannot take (the same on every rank)."""
    if not isinstance(module, Module):
        raise TypeError(f"FullyShardedDataParallel takes an nn.Module, got "
                        f"{type(module).__name__}")
    if isinstance(module, fsdp_cls):
        raise ValueError("FullyShardedDataParallel: the module is already a "
                         "FullyShardedDataParallel; wrap the module inside it only once")
    for name, m in module.named_modules():
        if isinstance(m, FSDPModule) and not getattr(m, "_fsdp1_wrapped", False):
            where = f"its submodule {name!r}" if name else "the module"
            raise ValueError(f"FullyShardedDataParallel: {where} ({type(m).__name__}) was "
                             f"given to fully_shard already; use either fully_shard (FSDP2) "
                             f"or FullyShardedDataParallel on one model, not both")


def ignored_parameters(module: Module, ignored_modules: Any,
                       ignored_states: Any) -> Tuple[Set[int], List[Module]]:
    """``(ids of the parameters left alone, the modules left alone)``."""
    if ignored_modules is not None and ignored_states is not None:
        raise ValueError("FullyShardedDataParallel: pass ignored_modules or ignored_states, "
                         "not both")
    mods: List[Module] = []
    params: List[Any] = []
    for item in list(ignored_modules or ()) + list(ignored_states or ()):
        if isinstance(item, Module):
            mods.append(item)
        elif hasattr(item, "requires_grad") and hasattr(item, "shape"):
            params.append(item)
        else:
            raise TypeError(f"FullyShardedDataParallel: ignored_modules/ignored_states hold "
                            f"modules or parameters, got {type(item).__name__}")
    ids = {id(p) for p in params}
    for m in mods:
        ids |= {id(p) for p in m.parameters()}
    return ids, mods


def resolve_device(device_id: Any) -> str:
    """``"cpu"`` or ``"cuda"`` for ``device_id``.

    Raises:
        RuntimeError: a CUDA device without CuPy or a GPU.
        TypeError: something that names no device.
    """
    if device_id is None:
        return "cpu"
    name = device_id if isinstance(device_id, (str, int)) else getattr(device_id, "type", None)
    if name is None:
        raise TypeError(f"FullyShardedDataParallel: device_id must be None, an int, a string "
                        f"or a device, got {type(device_id).__name__}")
    if isinstance(name, str) and name.split(":")[0] == "cpu":
        return "cpu"
    from mpitensor import cuda

    if not cuda.is_available():
        raise RuntimeError(f"FullyShardedDataParallel: device_id={device_id!r} names a CUDA "
                           f"device, but CuPy or a GPU is missing on this machine; pass "
                           f"device_id=None (or 'cpu') to train on the CPU")
    return "cuda"


def _on_meta(m: Module) -> bool:
    own = list(m._parameters.values()) + list(m._buffers.values())
    return any(t is not None and t.device.type == "meta" for t in own)


def materialize(module: Module, param_init_fn: Any, device_type: str,
                skip: Any = lambda m: False) -> None:
    """Give tensors on the meta device memory and values, module by module (parents first):
    ``param_init_fn(m)`` on every module holding some itself, or else its
    ``to_empty(recurse=False)`` and ``reset_parameters()``. Subtrees ``skip`` picks (ignored
    modules, FSDP units already) are left alone."""
    if param_init_fn is not None and not callable(param_init_fn):
        raise TypeError(f"FullyShardedDataParallel: param_init_fn must be callable, got "
                        f"{type(param_init_fn).__name__}")
    pending, found = [module], []
    while pending:
        m = pending.pop(0)
        if m is not module and skip(m):
            continue
        if _on_meta(m):
            found.append(m)
        pending.extend(m.children())
    for m in found:
        if param_init_fn is not None:
            param_init_fn(m)
            continue
        m.to_empty(device=device_type, recurse=False)
        reset = getattr(m, "reset_parameters", None)
        if callable(reset):
            reset()


def sync_from_rank0(module: Module, mesh: Any) -> None:
    """Every rank of ``mesh`` takes the parameters and buffers of its first rank."""
    from ..model_sync import broadcast_parameters

    if mesh.ndim == 2:  # along each row (the shard dim), then down each column (replicas)
        grid = mesh.mesh.numpy()
        row, col = mesh.get_coordinate()
        broadcast_parameters(module, src=int(grid[row, 0]), group=mesh.get_group(1))
        broadcast_parameters(module, src=int(grid[0, col]), group=mesh.get_group(0))
        return
    broadcast_parameters(module, src=int(mesh.mesh.numpy().reshape(-1)[0]),
                         group=mesh.get_group(0))


def cast_buffers(module: Module, mp: Optional[MixedPrecision]) -> Dict[str, Any]:
    """Cast the floating buffers to ``mp.buffer_dtype`` in place; returns their names (as the
    module names them) and original dtypes."""
    if mp is None or mp.buffer_dtype is None:
        return {}
    keep = tuple(mp._module_classes_to_ignore or (_BatchNorm,))
    out = {}
    for path, m in module.named_modules():
        if isinstance(m, keep):
            continue
        for name, buf in list(m._buffers.items()):
            if buf is None or not is_floating_dtype(buf.dtype) or buf.dtype == mp.buffer_dtype:
                continue
            out[f"{path}.{name}" if path else name] = buf.dtype
            m._buffers[name] = buf.to(mp.buffer_dtype)
    return out


@dataclass
class _FullPrecision(MixedPrecision):
    """A unit of a class mixed precision leaves alone: computed in its parameters' own dtype
    (its inputs cast to it), its outputs cast back to the model's ``param_dtype``."""

    output_dtype: Optional[Any] = None


def full_precision_unit(mp: Optional[MixedPrecision]) -> Any:
    """For the auto-wrap: modules of the classes mixed precision leaves alone (batch norms by
    default) become units of their own in full precision; the others are the policy's."""
    if mp is None or mp.param_dtype is None:
        return lambda m: False
    keep = tuple(mp._module_classes_to_ignore or (_BatchNorm,))

    def decide(m: Module) -> Any:
        own = next(iter(m.parameters()), None)
        if not isinstance(m, keep) or own is None:
            return False
        return {"mixed_precision": _FullPrecision(param_dtype=own.dtype,
                                                  reduce_dtype=own.dtype,
                                                  cast_forward_inputs=True,
                                                  output_dtype=mp.param_dtype)}

    return decide


# ---- meshes --------------------------------------------------------------------------------

def resolve_mesh(opts: Options, device_type: str) -> Any:
    """The DeviceMesh a unit shards over: 1-D for FULL_SHARD/SHARD_GRAD_OP, ``(ranks, 1)`` for
    NO_SHARD (every rank a replica), ``(replicas, shards)`` for the hybrid strategies."""
    import mpitensor.distributed as dist

    from ..device_mesh import DeviceMesh, init_device_mesh

    pg, mesh = opts.process_group, opts.device_mesh
    hybrid = opts.strategy in _HYBRID
    if mesh is not None:
        if not isinstance(mesh, DeviceMesh):
            raise TypeError(f"FullyShardedDataParallel: device_mesh must be a DeviceMesh, got "
                            f"{type(mesh).__name__}")
        want = 2 if hybrid else 1
        if mesh.ndim != want:
            raise ValueError(f"FullyShardedDataParallel: {opts.strategy.name} takes a "
                             f"{want}-D device_mesh, got {mesh.ndim}-D {mesh!r}"
                             + ("; a 2-D mesh is for HYBRID_SHARD" if not hybrid else ""))
        if opts.strategy is ShardingStrategy.NO_SHARD:
            return _replicas_mesh(mesh.mesh.numpy().reshape(-1).tolist(), device_type)
        return mesh
    if hybrid:
        if isinstance(pg, (tuple, list)) and len(pg) == 2:
            return _hybrid_from_groups(pg[0], pg[1], device_type)
        raise ValueError(f"FullyShardedDataParallel: {opts.strategy.name} needs a 2-D "
                         f"device_mesh=init_device_mesh('{device_type}', (replicas, shards)) "
                         f"or process_group=(shard_group, replicate_group)")
    if isinstance(pg, (tuple, list)):
        raise ValueError(f"FullyShardedDataParallel: a pair of process groups is for "
                         f"HYBRID_SHARD; {opts.strategy.name} takes one")
    if opts.strategy is ShardingStrategy.NO_SHARD:
        ranks = (list(range(dist.get_world_size())) if pg is None
                 else dist.get_process_group_ranks(pg))
        return _replicas_mesh(ranks, device_type)
    if pg is None:
        return init_device_mesh(device_type, (dist.get_world_size(),))
    return DeviceMesh.from_group(pg, device_type)


def _replicas_mesh(ranks: List[int], device_type: str) -> Any:
    """A ``(len(ranks), 1)`` mesh: shards of one rank, every rank a replica (NO_SHARD)."""
    from ..device_mesh import DeviceMesh

    grid = np.array(ranks, dtype=np.int64).reshape(-1, 1)
    return DeviceMesh(device_type, grid, mesh_dim_names=("replicate", "shard"))


def _hybrid_from_groups(shard: Any, replicate: Any, device_type: str) -> Any:
    """The (replicas, shards) mesh of a ``(shard_group, replicate_group)`` pair."""
    import mpitensor.distributed as dist

    from ..device_mesh import DeviceMesh

    mine = dist.get_process_group_ranks(shard)
    rows: List[Any] = [None] * dist.get_world_size(replicate)
    dist.all_gather_object(rows, mine, group=replicate)
    return DeviceMesh.from_group([replicate, shard], device_type, mesh=rows,
                                 mesh_dim_names=("replicate", "shard"))
