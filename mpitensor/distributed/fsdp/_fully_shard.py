"""``fully_shard`` (FSDP2): each call makes one unit of a module's parameters, sharded on dim 0.

Apply it to the blocks first, then to the root. Per unit and per step:

* forward: before the module runs, its unit is gathered (one ``all_gather_into_tensor``) and
  the module's parameters become the full tensors; the next unit's gather is started at once
  (asynchronous) so that it travels while this module computes. After the module ran, the unit
  is resharded (``reshard_after_forward``; the root unit stays gathered for backward).
* backward: the gradient reaching a module's outputs first gathers its unit again (and starts
  the gather of the unit that runs before it); as soon as the last of the unit's gradients is
  accumulated, they are reduce-scattered (asynchronous, so it overlaps the rest of backward)
  and the unit is resharded; at the end of backward every reduction is waited for and each
  sharded parameter's ``.grad`` holds the mean over the ranks of its rows.

Between steps, a module's registered parameters are its shards (``Shard(0)`` on the mesh), so
the optimizer, ``parameters()`` and ``state_dict()`` see shards only. A tensor-parallel
parameter (a DTensor over another mesh dimension) has its local piece sharded instead, and is
a DTensor on the 2-D mesh between steps (see ``_tensor_parallel``).

HSDP: given a 2-D mesh (replicate, shard), the parameters are ``(Replicate(), Shard(0))``
DTensors: gathered and reduce-scattered over the shard dim as above, and each unit's reduced
shards all-reduced over the replicate dim (asynchronous, started when the next unit's
gradients are ready, or at the end of backward).
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from mpitensor._base import config as _config
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.autograd import is_grad_enabled, queue_callback
from mpitensor.dtypes import is_floating_dtype
from mpitensor.nn import Module
from mpitensor.tensor import Tensor

from ..optim._agreement import check_same_everywhere
from ._group import BufferPool, ParamInfo, ShardedGroup, array_module, local, raw
from ._policies import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from ._tensor_parallel import TPLayout, check_tp_params, load_piece, tp_layouts

__all__ = ["FSDPModule", "UnshardHandle", "fully_shard"]

_DEFAULT_MP = MixedPrecisionPolicy()  # frozen: safe to share
_DEFAULT_OFFLOAD = OffloadPolicy()  # holds nothing


class _Root:
    """What the outermost unit keeps for the whole tree: every unit and their forward order."""

    def __init__(self, states: List["_State"]) -> None:
        self.states = states
        self.order: List["_State"] = []
        self.recording = True
        self.callback_queued = False
        self.reducing: List["_State"] = []  # HSDP: reduce-scattering, not yet all-reducing

    def record(self, st: "_State") -> None:
        if self.recording and st not in self.order:
            self.order.append(st)

    def after_forward(self) -> None:
        self.recording = False

    def queue_final(self) -> None:
        if not self.callback_queued:
            self.callback_queued = True
            queue_callback(self.final_callback)

    def final_callback(self) -> None:
        """End of backward: reduce the units not reduced yet, wait for all, reshard."""
        self.callback_queued = False
        self.reducing = []
        for st in self.states:
            if st.group is not None and st.seen and st.sync:
                if st.group._reduce is None and st.pending_seen:
                    st.group.start_reduce()
        for st in self.states:  # HSDP: every unit's all-reduce over the replicas in flight
            if st.group is not None:
                st.group.start_replicate_reduce()
        for st in self.states:
            if st.group is None:
                continue
            st.group.finish_reduce()
            if st.reshard_after_backward:
                st.reshard()
            st.seen = 0
            st.pending_seen = False
            st.bw_started = False


class _State:
    """One unit: its module, parameters, collectives and switches."""

    def __init__(self, module: Module, group: Optional[ShardedGroup], mesh: Any, pg: Any,
                 mp: MixedPrecisionPolicy, reshard_after_forward: bool) -> None:
        self.module, self.group, self.mesh, self.pg, self.mp = module, group, mesh, pg, mp
        self.reshard_after_forward = reshard_after_forward
        self.reshard_after_backward = self.sync = True
        self.root: Optional[_Root] = None
        self.is_root = False
        self.fwd_prefetch: Optional[List["_State"]] = None
        self.bwd_prefetch: Optional[List["_State"]] = None
        # FSDP1's BACKWARD_POST: the backward prefetch waits until this unit's gradients are
        # ready (they are then reduced first), instead of starting with its backward
        self.prefetch_after_grads = False
        self.seen = 0
        self.pending_seen = False
        self.bw_started = False
        self._hooked = False
        self.needed = 0 if group is None else sum(i.requires_grad for i in group.infos)

    # ---- registration --------------------------------------------------------------------

    def _register(self, unsharded: bool) -> None:
        for info in self.group.infos:
            p = info.unsharded if unsharded else info.sharded
            for owner, name in info.owners:
                owner._parameters[name] = p

    def _register_pieces(self) -> None:
        """Register the shards' local pieces (plain tensors) in place of the DTensors."""
        for info in self.group.infos:
            for owner, name in info.owners:
                owner._parameters[name] = local(info.sharded)

    def unshard(self) -> None:
        if self.group is None:
            return
        was = self.group.is_unsharded
        self.group.finish_gather()
        if not was:
            self._hook_unsharded()
            self._register(True)

    def reshard(self) -> None:
        if self.group is None:
            return
        self.group.free()
        self._register(False)

    def _hook_unsharded(self) -> None:
        if self._hooked:  # the unsharded parameters live as long as the unit
            return
        self._hooked = True
        for info in self.group.infos:
            if info.requires_grad:
                info.unsharded.register_post_accumulate_grad_hook(self._grad_ready)

    # ---- prefetch ------------------------------------------------------------------------

    def _neighbour(self, step: int) -> List["_State"]:
        order = self.root.order if self.root is not None else []
        if self not in order:
            return []
        k = order.index(self) + step
        return [order[k]] if 0 <= k < len(order) else []

    def prefetch(self, forward: bool) -> None:
        explicit = self.fwd_prefetch if forward else self.bwd_prefetch
        targets = explicit if explicit is not None else self._neighbour(1 if forward else -1)
        for st in targets:
            if st.group is not None and not st.group.is_unsharded:
                st.group.start_gather(async_op=True)

    # ---- backward ------------------------------------------------------------------------

    def pre_backward(self) -> None:
        if self.bw_started:
            return
        self.bw_started = True
        self.root.queue_final()
        self.unshard()
        if not self.prefetch_after_grads:
            self.prefetch(forward=False)

    def _grad_ready(self, _param: Any) -> None:
        self.root.queue_final()
        self.seen += 1
        self.pending_seen = True
        if self.seen < self.needed or not self.sync:
            return
        self.pending_seen = False
        self.group.start_reduce()
        if self.prefetch_after_grads:
            self.prefetch(forward=False)
        # HSDP: the unit reduced before this one had this unit's backward to finish its
        # reduce-scatter; its all-reduce over the replicas starts now, so it overlaps the rest
        # of backward (in the order backward reaches the units: the same on every rank)
        for st in self.root.reducing:
            st.group.start_replicate_reduce()
        self.root.reducing = [self] if self.group.replicate is not None else []
        if self.reshard_after_backward and not self.is_root:
            self.reshard()


class _PreBackward(Function):
    """Identity on a unit's output whose backward gathers the unit before its module's
    backward runs."""

    @staticmethod
    def forward(ctx: Any, x: Any, state: _State) -> Any:
        ctx.state = state
        return x

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        ctx.state.pre_backward()
        return g, None


def _map_tensors(obj: Any, fn: Any) -> Any:
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_map_tensors(o, fn) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _hooked_output(t: Tensor, st: _State) -> Tensor:
    """``t`` through :class:`_PreBackward` (a DTensor output, a tensor-parallel module's: its
    local piece, wrapped again)."""
    if not t.requires_grad:
        return t
    piece = getattr(t, "_local_tensor", None)
    if piece is None:
        return _PreBackward.apply(t, st)
    return type(t)._make(_PreBackward.apply(piece, st), t.device_mesh, t.placements, t.shape)


def _cast(obj: Any, dtype: Any) -> Any:
    return _map_tensors(obj, lambda t: t.to(dtype) if is_floating_dtype(t.dtype) else t)


def _pre_forward(module: Module, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    st: _State = module._fsdp_state
    if st.root is None:
        _lazy_init(st)
    st.root.record(st)
    st.unshard()
    st.prefetch(forward=True)
    if st.mp.cast_forward_inputs and st.mp.param_dtype is not None:
        args, kwargs = _cast(args, st.mp.param_dtype), _cast(kwargs, st.mp.param_dtype)
    return args, kwargs


def _post_forward(module: Module, args: tuple, output: Any) -> Any:
    st: _State = module._fsdp_state
    if st.is_root:
        st.root.after_forward()
    elif st.reshard_after_forward:
        st.reshard()
    if is_grad_enabled() and st.group is not None:
        output = _map_tensors(output, lambda t: _hooked_output(t, st))
    if st.mp.output_dtype is not None:
        output = _cast(output, st.mp.output_dtype)
    return output


def _lazy_init(st: _State) -> None:
    """The first unit to run forward is the root: it gathers the states of its subtree."""
    states = [m._fsdp_state for m in st.module.modules() if isinstance(m, FSDPModule)]
    root = _Root(states)
    pool = BufferPool()
    for s in states:
        s.root = root
        s.is_root = s is st
        if s.group is not None:
            s.group.pool = pool


class UnshardHandle:
    """The wait handle of ``FSDPModule.unshard(async_op=True)``."""

    def __init__(self, state: Optional[_State]) -> None:
        self._state = state

    def wait(self) -> None:
        """Finish the gather; the module's parameters are then the full tensors."""
        if self._state is not None:
            self._state.unshard()
            self._state = None


class FSDPModule:
    """Mixed into the class of every module given to :func:`fully_shard`."""

    def _fsdp_states(self, recurse: bool) -> List[_State]:
        if not recurse:
            return [self._fsdp_state]
        return [m._fsdp_state for m in self.modules() if isinstance(m, FSDPModule)]

    def reshard(self) -> None:
        """Free the gathered parameters; the registered ones are the shards again."""
        self._fsdp_state.reshard()

    def unshard(self, async_op: bool = False) -> Optional[UnshardHandle]:
        """Gather the parameters now (``async_op``: start it, and return a handle to wait)."""
        st = self._fsdp_state
        if st.group is not None:
            st.group.start_gather(async_op=True)
        if async_op:
            return UnshardHandle(st)
        st.unshard()
        return None

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *,
                                   recurse: bool = True) -> None:
        """``False``: backward accumulates full gradients locally without reducing them (for
        gradient accumulation); the next backward with ``True`` reduces the sum."""
        for st in self._fsdp_states(recurse):
            st.sync = bool(requires_gradient_sync)

    def set_reshard_after_backward(self, reshard_after_backward: bool, *,
                                   recurse: bool = True) -> None:
        """Whether backward frees the gathered parameters (``False`` keeps them for the next
        forward, at the cost of memory)."""
        for st in self._fsdp_states(recurse):
            st.reshard_after_backward = bool(reshard_after_backward)

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        """Whether forward frees the gathered parameters (backward gathers them again)."""
        for st in self._fsdp_states(recurse):
            st.reshard_after_forward = bool(reshard_after_forward)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load a state dict whose sharded entries are DTensors laid out as the parameters (as
        ``state_dict()`` gives them) or whole tensors (each rank keeps its rows).

        With ``assign=True`` (torch's "keep the state dict's tensors", which FSDP2's checkpoint
        example passes) the entries of other tensors are assigned as on any module; the
        sharded entries' values go into the shards the unit gathers from, and each sharded
        parameter takes its entry's ``requires_grad``.

        Raises:
            ValueError: an entry's layout or shape does not fit its sharded parameter, or with
                ``assign=True`` its dtype differs (a unit's shards share one buffer).
        """
        units = [m._fsdp_state for m in self.modules()
                 if isinstance(m, FSDPModule) and m._fsdp_state.group is not None]
        for st in units:
            st.reshard()
        by_id = {id(i.sharded): i for st in units for i in st.group.infos}
        params = dict(self.named_parameters())
        values = dict(state_dict)
        sharded = [k for k, p in params.items() if id(p) in by_id and k in values]
        if assign:
            _check_assignable(values, sharded, params)
        for key in sharded:
            values[key] = _piece(values[key], by_id[id(params[key])], key)
        for st in units:
            st._register_pieces()
        try:
            if not assign:
                return Module.load_state_dict(self, values, strict=strict)
            first = Module.load_state_dict(self, {k: values[k] for k in sharded}, strict=False)
        finally:
            for st in units:
                st._register(False)
        for key in sharded:
            params[key].requires_grad_(bool(getattr(state_dict[key], "requires_grad", True)))
        rest = {k: v for k, v in values.items() if k not in set(sharded)}
        second = Module.load_state_dict(self, rest, strict=False, assign=True)
        missing = [k for k in first.missing_keys if k in set(second.missing_keys)]
        unexpected = [k for k in second.unexpected_keys if k in set(first.unexpected_keys)]
        if strict and (missing or unexpected):
            raise RuntimeError(f"load_state_dict: missing keys {missing}, unexpected keys "
                               f"{unexpected}; pass strict=False to load what matches")
        return type(first)(missing, unexpected)

    def set_modules_to_forward_prefetch(self, modules: List["FSDPModule"]) -> None:
        """Gather these units as soon as this one's forward starts (replaces the default, the
        unit that ran next in the first forward)."""
        self._fsdp_state.fwd_prefetch = [_checked_unit(m) for m in modules]

    def set_modules_to_backward_prefetch(self, modules: List["FSDPModule"]) -> None:
        """Gather these units as soon as this one's backward starts."""
        self._fsdp_state.bwd_prefetch = [_checked_unit(m) for m in modules]


def _piece(value: Any, info: ParamInfo, key: str) -> Any:
    """This rank's rows of a state-dict entry for a sharded parameter."""
    from ..tensor import DTensor

    if info.layout is not None:
        got = load_piece(value, info.layout, info.start, info.stop)
        if got is None:
            raise ValueError(f"load_state_dict: {key!r} is {_described(value)}, the parameter "
                             f"is {info.layout.global_shape} {info.layout.placements} on "
                             f"{info.layout.mesh!r}; give the parameter's layout, its "
                             "tensor-parallel one or the whole tensor")
        return got
    if isinstance(value, DTensor):
        if value.placements != info.sharded.placements or tuple(value.shape) != info.shape \
                or value.device_mesh != info.sharded.device_mesh:
            raise ValueError(f"load_state_dict: {key!r} is {_described(value)}, the parameter "
                             f"is {info.shape} {info.sharded.placements}; redistribute it "
                             "first")
        return value._local_tensor
    if tuple(value.shape) != info.shape:
        raise ValueError(f"load_state_dict: {key!r} has shape {tuple(value.shape)}, the "
                         f"parameter {info.shape}")
    return value[info.start:info.stop]


def _check_assignable(values: Dict[str, Any], keys: List[str], params: Dict[str, Any]) -> None:
    for key in keys:
        dtype = getattr(values[key], "dtype", None)
        if dtype is not None and dtype != params[key].dtype:
            raise ValueError(f"load_state_dict(assign=True): {key!r} is {dtype}, the sharded "
                             f"parameter {params[key].dtype}; a unit's shards share one "
                             "buffer: convert the entry first")


def _described(value: Any) -> str:
    placements = getattr(value, "placements", None)
    if placements is None:
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a DTensor {tuple(value.shape)} {placements} on {value.device_mesh!r}"


def _checked_unit(m: Any) -> _State:
    if not isinstance(m, FSDPModule):
        raise TypeError(f"expected a module given to fully_shard, got {type(m).__name__}")
    return m._fsdp_state


def _managed(module: Module) -> Dict[int, Tuple[Any, List[Tuple[Any, str]]]]:
    """The parameters of ``module`` not managed by a unit below it: id -> (param, owners)."""
    found: Dict[int, Tuple[Any, List[Tuple[Any, str]]]] = {}

    def visit(m: Module) -> None:
        for name, p in m._parameters.items():
            if p is not None:
                found.setdefault(id(p), (p, []))[1].append((m, name))
        for child in m.children():
            if not isinstance(child, FSDPModule):
                visit(child)

    visit(module)
    return found


def _resolve_mesh(module: Module, mesh: Any, device_type: str) -> Any:
    from ..device_mesh import DeviceMesh, init_device_mesh

    if device_type == "meta":  # parameters without data (shards made as host memory): any mesh
        device_type = getattr(mesh, "device_type", "cpu")
    if mesh is None:
        below = [m._fsdp_state.mesh for m in module.modules()
                 if isinstance(m, FSDPModule) and m is not module]
        if below:
            return below[0]
        import mpitensor.distributed as dist

        return init_device_mesh(device_type, (dist.get_world_size(),))
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"fully_shard: mesh must be a DeviceMesh, got {type(mesh).__name__}")
    if mesh.ndim not in (1, 2):
        raise ValueError(
            f"fully_shard: the mesh {mesh!r} has {mesh.ndim} dimensions; give a 1-D mesh "
            f"(shard) or a 2-D one (replicate, shard: HSDP), e.g. mesh['dp'] or "
            f"mesh['dp_replicate', 'dp_shard']")
    if mesh.get_coordinate() is None:
        raise ValueError(f"fully_shard: rank {mesh.get_rank()} is not in the mesh {mesh!r}; "
                         "call fully_shard on the ranks of the mesh only")
    if mesh.device_type != device_type:
        raise ValueError(f"fully_shard: the mesh is on device type {mesh.device_type!r} but the "
                         f"parameters are on {device_type!r}; build the mesh with "
                         f"init_device_mesh({device_type!r}, ...) or move the module")
    return mesh


def _signature(params: List[Any], values: bool) -> List[Tuple[Any, ...]]:
    """Per parameter: shape, dtype and, with ``values``, a checksum of its values (to compare
    across ranks)."""
    if not values:
        return [(tuple(p.shape), str(p.dtype)) for p in params]
    out = []
    for p in params:
        a = raw(p)
        if p.is_cuda:
            check = float(a.astype("f8").sum())
        else:
            data = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            check = hashlib.blake2b(data.data, digest_size=8).hexdigest()
        out.append((tuple(p.shape), str(p.dtype), check))
    return out


def _check_same_on_mesh(params: List[Any], mesh: Any) -> None:
    """``ValueError`` on every rank of ``mesh`` where the ranks' parameter shapes or dtypes
    differ, or (under ``MPITENSOR_DEBUG=1`` only) their values.

    Values may differ, as torch allows: each rank keeps the rows of its own tensor (a model
    built without a seed is then a model whose rows came from several draws). The debug mode
    refuses that, for programs that mean every rank to build the same model.

    On a 2-D (HSDP) mesh: one gather over the shard dim, then one of those lines over the
    replicate dim, so every rank sees the whole grid and decides alike (two checks one after
    the other could fail one line while the others wait in the second)."""
    values = _config.DEBUG
    mine = _signature(params, values)
    what = "parameter (shape, dtype, checksum)" if values else "parameter (shape, dtype)"
    if mesh.ndim == 1:
        try:
            check_same_everywhere(mine, mesh.get_group(0), "fully_shard", what)
        except ValueError as exc:  # raised alike on every rank
            raise ValueError(str(exc) + _VALUES_HINT * values) from None
        return
    import mpitensor.distributed as dist

    line: List[Any] = [None] * mesh.size(1)
    dist.all_gather_object(line, mine, group=mesh.get_group(1))
    grid: List[Any] = [None] * mesh.size(0)
    dist.all_gather_object(grid, line, group=mesh.get_group(0))
    ranks = mesh.mesh.numpy().reshape(-1).tolist()
    flat = [sig for row in grid for sig in row]  # in the mesh's row-major order, as ranks
    odd = [r for r, sig in zip(ranks, flat) if sig != flat[0]]
    if odd:
        theirs = flat[ranks.index(odd[0])]
        k = next((k for k, (a, b) in enumerate(zip(flat[0], theirs)) if a != b), None)
        detail = (f"{len(flat[0])} {what}s on rank {ranks[0]}, {len(theirs)} on rank {odd[0]}"
                  if k is None else f"{what} {k} is {flat[0][k]} on rank {ranks[0]} and "
                  f"{theirs[k]} on rank {odd[0]}")
        raise ValueError(f"fully_shard: the {what}s differ across ranks of the mesh "
                         f"{mesh.mesh.tolist()} ({detail}; ranks {odd} differ from rank "
                         f"{ranks[0]}); build the same model on every rank, in the same order"
                         + _VALUES_HINT * values)


# what a refusal adds under MPITENSOR_DEBUG=1, where only the values may be what differs
_VALUES_HINT = (" (MPITENSOR_DEBUG=1 compares the values too: seed every rank alike, or "
                "unset MPITENSOR_DEBUG to keep each rank's rows of its own values, as torch does)")


def _check_arguments(module: Any, reshard_after_forward: Any, shard_placement_fn: Any,
                     mp_policy: Any, offload_policy: Any) -> None:
    if not isinstance(module, Module):
        raise TypeError(f"fully_shard takes an nn.Module, got {type(module).__name__}")
    if isinstance(module, FSDPModule):
        raise ValueError(f"fully_shard: {type(module).__name__} is already fully sharded")
    if not isinstance(reshard_after_forward, bool):
        raise NotImplementedError(
            f"fully_shard(reshard_after_forward={reshard_after_forward!r}): only True or False "
            f"(resharding to a smaller world after forward is not supported)")
    if shard_placement_fn is not None:
        raise NotImplementedError("fully_shard(shard_placement_fn=...): parameters are sharded "
                                  "on dim 0 only; pass shard_placement_fn=None")
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(f"fully_shard: mp_policy must be a MixedPrecisionPolicy, got "
                        f"{type(mp_policy).__name__}")
    if not isinstance(offload_policy, OffloadPolicy):
        raise TypeError(f"fully_shard: offload_policy must be an OffloadPolicy, got "
                        f"{type(offload_policy).__name__}")


def _infos(managed: Dict[int, Tuple[Any, List[Tuple[Any, str]]]], world: int,
           rank: int, layouts: Dict[int, TPLayout]) -> List[ParamInfo]:
    infos, offset = [], 0
    for key, (p, owners) in managed.items():
        if p.dim() == 0:
            raise ValueError(f"fully_shard: parameter {owners[0][1]!r} of "
                             f"{type(owners[0][0]).__name__} is 0-dimensional and cannot be "
                             f"sharded on dim 0; give it shape (1,)")
        info = ParamInfo(owners, p, world, rank, offset, layouts.get(key))
        offset += info.padded
        infos.append(info)
    return infos


def _shard(info: ParamInfo, p: Any, offload: bool, mesh: Any) -> None:
    """This rank's rows of ``p`` (of its local piece, for a tensor-parallel ``p``) as a
    DTensor parameter in its own memory."""
    rows = raw(p)[info.start:info.stop].copy()
    if local(p).is_meta:  # a meta parameter's shard gets host memory (to_empty leaves DTensors be)
        rows = np.zeros(rows.shape, rows.dtype)
    if offload and p.is_cuda:
        rows = rows.get()
    info.sharded = info.make_sharded(Tensor(rows), mesh)


def fully_shard(module: Module, *, mesh: Any = None, reshard_after_forward: bool = True,
                shard_placement_fn: Any = None,
                mp_policy: MixedPrecisionPolicy = _DEFAULT_MP,
                offload_policy: OffloadPolicy = _DEFAULT_OFFLOAD,
                ignored_params: Optional[set] = None) -> Module:
    """Shard ``module``'s parameters (those not already in a unit below it) on dim 0 over
    ``mesh``, and gather them around its forward and backward (see the module doc). A
    parameter that is a DTensor over another mesh dimension (``parallelize_module(model,
    mesh["tp"], ...)``) has its local piece sharded, and becomes a DTensor on the 2-D mesh
    ``("tp", "dp")`` placed ``(its placement, Shard(0))``.

    Args:
        module: the module; call ``fully_shard`` on its blocks first, then on it.
        mesh: a 1-D DeviceMesh, or a 2-D one (replicate, shard) for HSDP: parameters
            ``(Replicate(), Shard(0))`` (default: the mesh of a unit below, or one over the
            world).
        reshard_after_forward: free the gathered parameters after forward (gathered again in
            backward); ``False`` keeps them until the end of backward.
        shard_placement_fn: only ``None`` (dim 0).
        mp_policy: the dtypes of the gathered parameters, the reduction and the outputs.
        offload_policy: ``CPUOffloadPolicy()`` keeps the shards in host memory (CuPy).
        ignored_params: parameters left as they are (not sharded, not reduced).

    Returns:
        ``module``, whose class now also derives from :class:`FSDPModule`.

    Raises:
        TypeError, ValueError, NotImplementedError: bad arguments, a mesh of another device
            type or of 3+ dims, parameters of several dtypes without ``param_dtype``, a 0-dim
            parameter;
            ``ValueError`` on every rank, before any gather, where parameter shapes or dtypes
            differ across ranks (values too under ``MPITENSOR_DEBUG=1``; else, as torch).

    Example:
        >>> for block in model.blocks:
        ...     fully_shard(block)
        >>> fully_shard(model)
        >>> opt = optim.Adam(model.parameters(), lr=1e-3)   # the shards only
    """
    _check_arguments(module, reshard_after_forward, shard_placement_fn, mp_policy,
                     offload_policy)
    ignored = {id(p) for p in (ignored_params or ())}
    managed = {k: v for k, v in _managed(module).items() if k not in ignored}
    params = [p for p, _ in managed.values()]
    device_type = params[0].device.type if params else "cpu"
    mesh = _resolve_mesh(module, mesh, device_type)
    pg = mesh.get_group(mesh.ndim - 1)  # the shard dim: the last
    replicate = mesh.get_group(0) if mesh.ndim == 2 else None
    world, rank = mesh.size(mesh.ndim - 1), mesh.get_local_rank(mesh.ndim - 1)
    check_tp_params(managed, mesh)
    _check_same_on_mesh(params, mesh)
    layouts = tp_layouts(managed, mesh, pg)
    group = None
    if params:
        devices = {str(p.device) for p in params}
        if len(devices) > 1:
            raise ValueError(f"fully_shard: the parameters of one unit are on several devices "
                             f"({sorted(devices)}); move the module to one device first")
        dtypes = {str(p.dtype) for p in params}
        if len(dtypes) > 1 and mp_policy.param_dtype is None:
            raise ValueError(f"fully_shard: the parameters of one unit have several dtypes "
                             f"({sorted(dtypes)}); give mp_policy a param_dtype, or shard "
                             f"them in separate fully_shard calls")
        infos = _infos(managed, world, rank, layouts)
        offload = isinstance(offload_policy, CPUOffloadPolicy)
        xp = array_module(raw(params[0]))
        for info, p in zip(infos, params):
            _shard(info, p, offload, mesh)
        param_dtype = mp_policy.param_dtype or params[0].dtype
        group = ShardedGroup(infos, pg, world, rank, param_dtype,
                             mp_policy.reduce_dtype or param_dtype, offload, xp, replicate)
    st = _State(module, group, mesh, pg, mp_policy, reshard_after_forward)
    module._fsdp_state = st
    if group is not None:
        st._register(False)
    cls = type(module)
    module.__class__ = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
    module.register_forward_pre_hook(_pre_forward, prepend=True, with_kwargs=True)
    module.register_forward_hook(_post_forward)
    return module
