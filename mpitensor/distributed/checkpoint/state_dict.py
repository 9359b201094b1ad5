"""Model and optimizer state dicts keyed by parameter names, ready for ``save`` and ``load``.

An optimizer's own ``state_dict()`` numbers its parameters (0, 1, ...); the numbering depends
on how the optimizer was built, so it cannot be matched across runs or shardings. Here the
optimizer state is keyed by the parameters' names in the model (``"0.weight"``), as torch's
``torch.distributed.checkpoint.state_dict`` keys it, and the model's and optimizer's
DTensors are kept sharded (each rank saves its part) unless ``full_state_dict`` asks for whole
tensors.

The usual resume::

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)

An optimizer that has not stepped yet has no state to load into; :func:`get_state_dict`
creates it by one step with a learning rate of zero and zero gradients (the parameters do not
change; gradients that were None are None again), as torch does.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

from mpitensor import distributed as dist
from mpitensor.autograd import no_grad
from mpitensor.distributed.checkpoint import _planning as plan_
from mpitensor.nn import Module
from mpitensor.optim import Optimizer
from mpitensor.tensor import Tensor

__all__ = ["StateDictOptions", "get_model_state_dict", "get_optimizer_state_dict",
           "get_state_dict", "set_model_state_dict", "set_optimizer_state_dict",
           "set_state_dict"]


@dataclass
class StateDictOptions:
    """How the state dicts are built and loaded.

    Attributes:
        full_state_dict: whole tensors (DTensors gathered) instead of each rank's shards.
        cpu_offload: tensors moved to the CPU; with ``full_state_dict``, only rank 0 gets
            the state dict (the others an empty dict), as in torch.
        ignore_frozen_params: leave out parameters that do not require grad.
        keep_submodule_prefixes: with ``submodules``, keep the submodules' name prefixes.
        strict: ``set_*`` fail on missing or unexpected model keys (as
            ``Module.load_state_dict(strict=True)``).
        broadcast_from_rank0: ``set_*`` take full state dicts that only rank 0 holds, and send
            them to the other ranks (implies ``full_state_dict``).
        flatten_optimizer_state_dict: the optimizer state dict as one flat dict
            (``"state.<param>.<key>"``, ``"param_groups.<param>.<key>"``).
        dsd_fqn_modifiers: accepted for torch's signature; modules here have no name modifiers.
    """

    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    keep_submodule_prefixes: bool = True
    strict: bool = True
    broadcast_from_rank0: bool = False
    flatten_optimizer_state_dict: bool = False
    dsd_fqn_modifiers: str = "_fqn_modifiers"


def _options(options: Optional[StateDictOptions]) -> StateDictOptions:
    if options is None:
        return StateDictOptions()
    if not isinstance(options, StateDictOptions):
        raise TypeError(f"options must be a StateDictOptions, got {type(options).__name__}")
    return options


def _optimizers(optimizers: Union[Optimizer, Iterable[Optimizer]]) -> List[Optimizer]:
    opts = [optimizers] if isinstance(optimizers, Optimizer) else list(optimizers)
    bad = [type(o).__name__ for o in opts if not isinstance(o, Optimizer)]
    if bad:
        raise TypeError(f"optimizers must be Optimizers, got {', '.join(bad)}")
    return opts


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _is_dtensor(x: Any) -> bool:
    dt = plan_._dtensor_type()
    return dt is not None and isinstance(x, dt)


def _out(value: Any, options: StateDictOptions) -> Any:
    """A value as the options want it returned (whole, on the CPU)."""
    if isinstance(value, dict):
        return {k: _out(v, options) for k, v in value.items()}
    if options.full_state_dict and _is_dtensor(value):
        value = value.full_tensor()
    if options.cpu_offload and isinstance(value, Tensor):
        value = value.detach().cpu()
    return value


def _finish(sd: Dict[str, Any], options: StateDictOptions) -> Dict[str, Any]:
    if options.full_state_dict and options.cpu_offload and _rank() != 0:
        return {}
    return sd


# ------------------------------------------------------------------ model
def _param_names(model: Module) -> Dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def get_model_state_dict(model: Module, *, submodules: Optional[Set[Module]] = None,
                         options: Optional[StateDictOptions] = None) -> Dict[str, Any]:
    """The model's state dict, shaped by ``options`` (see :class:`StateDictOptions`).

    Example:
        >>> sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        ... # doctest: +SKIP
    """
    options = _options(options)
    with _sharded_fsdp1(model):
        sd = model.state_dict()
    if options.ignore_frozen_params:
        frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
        sd = {k: v for k, v in sd.items() if k not in frozen}
    if submodules is not None:
        prefixes = [(n + ".") if n else "" for n, m in model.named_modules() if m in submodules]
        kept: Dict[str, Any] = {}
        for k, v in sd.items():
            hit = next((p for p in prefixes if k.startswith(p)), None)
            if hit is not None:
                kept[k if options.keep_submodule_prefixes else k[len(hit):]] = v
        sd = kept
    return _finish({k: _out(v, options) for k, v in sd.items()}, options)


def _broadcast(sd: Any) -> Any:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return sd
    box = [sd if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _like(value: Any, current: Any, name: str) -> Any:
    """``value`` (a whole tensor) cut to ``current``'s shard when ``current`` is a DTensor."""
    if not _is_dtensor(current) or _is_dtensor(value) or not isinstance(value, Tensor):
        return value
    from mpitensor.distributed.tensor import DTensor

    entry = plan_.tensor_entry(current, for_load=True)
    if tuple(value.shape) != entry.shape:
        raise ValueError(f"{name}: a full tensor of shape {tuple(value.shape)} cannot fill a "
                         f"DTensor of global shape {entry.shape}")
    if entry.box is None:
        local = current.to_local()
    else:
        local = value[plan_.within(entry.box, (0,) * len(entry.shape))]
    return DTensor.from_local(local.to(current.to_local().device).contiguous(),
                              current.device_mesh, current.placements, shape=current.shape,
                              stride=current.stride())


def _fill_dtensor(current: Any, value: Any, name: str) -> None:
    """Copy ``value`` (a whole tensor or a DTensor) into the DTensor ``current``, in place."""
    if not _is_dtensor(value):
        value = _like(value, current, name)
    elif tuple(value.shape) != tuple(current.shape):
        raise ValueError(f"{name}: a DTensor of global shape {tuple(value.shape)} cannot fill "
                         f"one of global shape {tuple(current.shape)}")
    elif tuple(value.placements) != tuple(current.placements):
        value = value.redistribute(current.device_mesh, current.placements)
    with no_grad():
        current.to_local().copy_(value.to_local())


def set_model_state_dict(model: Module, model_state_dict: Dict[str, Any], *,
                         options: Optional[StateDictOptions] = None) -> Any:
    """Load ``model_state_dict`` into ``model``; DTensor entries are filled shard by shard.

    A whole tensor given for a DTensor parameter is cut to this rank's shard; a DTensor with
    other placements is redistributed first.

    Returns:
        ``(missing_keys, unexpected_keys)``, as ``Module.load_state_dict`` returns them.

    Raises:
        RuntimeError: with ``strict``, keys are missing or unexpected (nothing is loaded).

    Example:
        >>> set_model_state_dict(model, sd)  # doctest: +SKIP
    """
    options = _options(options)
    if options.broadcast_from_rank0:
        model_state_dict = _broadcast(model_state_dict)
    with _sharded_fsdp1(model):
        current = model.state_dict(keep_vars=True)
    missing = [k for k in current if k not in model_state_dict]
    unexpected = [k for k in model_state_dict if k not in current]
    if options.strict and (missing or unexpected):
        raise RuntimeError(f"set_model_state_dict: the state dict does not fit the model "
                           f"(missing keys: {missing}, unexpected keys: {unexpected}); pass "
                           f"StateDictOptions(strict=False) to load what fits")
    sharded = {k for k, v in current.items() if _is_dtensor(v) and k in model_state_dict}
    for k in sharded:
        _fill_dtensor(current[k], model_state_dict[k], k)
    rest = {k: v for k, v in model_state_dict.items() if k not in sharded}
    with _sharded_fsdp1(model):
        result = model.load_state_dict(rest, strict=False)
    return type(result)(missing, unexpected)


def _sharded_fsdp1(model: Module) -> Any:
    """FSDP1 units of ``model`` give and take DTensor shards inside the block (their
    SHARDED_STATE_DICT type), as torch's get/set_state_dict set it; whole tensors, when
    ``full_state_dict`` asks for them, come from those shards as for ``fully_shard``."""
    from mpitensor.distributed.fsdp import FullyShardedDataParallel as FSDP
    from mpitensor.distributed.fsdp import StateDictType

    if not FSDP.fsdp_modules(model):
        return contextlib.nullcontext()
    return FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT)


# ------------------------------------------------------------------ optimizer
def _init_state(optim: Optimizer) -> None:
    """Create an optimizer's state by a step that changes nothing (zero lr, zero grads)."""
    if optim.state:
        return
    params = [p for g in optim.param_groups for p in g["params"]]
    made = [p for p in params if p.grad is None]
    lrs = [g["lr"] for g in optim.param_groups]
    with no_grad():
        for p in made:
            p.grad = p.detach() * 0
    try:
        for g in optim.param_groups:
            g["lr"] = 0.0
        optim.step()
    finally:
        for g, lr in zip(optim.param_groups, lrs):
            g["lr"] = lr
        for p in made:
            p.grad = None


# torch keeps this helper under this private name, and programs (FSDP2's checkpoint example)
# import it from here
_init_optim_state = _init_state

def _as_dtensor(value: Any, param: Any) -> Any:
    """An optimizer's state tensor for a DTensor parameter, as the DTensor it is a shard of.

    The optimizers step on local shards, so their per-parameter state (``exp_avg``, ...) is
    this rank's piece; unwrapped, every rank would save its piece under the same name as if
    it were the whole tensor.
    """
    if not _is_dtensor(param) or _is_dtensor(value) or not isinstance(value, Tensor):
        return value
    if value.ndim == 0 or tuple(value.shape) != tuple(param.to_local().shape):
        return value  # a per-parameter scalar (``step``), the same on every rank
    from mpitensor.distributed.tensor import DTensor

    return DTensor.from_local(value, param.device_mesh, param.placements, shape=param.shape,
                              stride=param.stride())


def _as_local(value: Any, param: Any, name: str) -> Any:
    """A loaded state value for ``param``, as the local shard the optimizer keeps."""
    if not _is_dtensor(param) or not isinstance(value, Tensor) or value.ndim == 0:
        return value
    if not _is_dtensor(value):
        value = _like(value, param, name)
    elif tuple(value.placements) != tuple(param.placements):
        value = value.redistribute(param.device_mesh, param.placements)
    return value.to_local()


def _named_osd(model: Module, optim: Optimizer) -> Dict[str, Any]:
    names = _param_names(model)
    order = [p for g in optim.param_groups for p in g["params"]]
    missing = [i for i, p in enumerate(order) if id(p) not in names]
    if missing:
        raise ValueError(f"the optimizer's parameters {missing} (in its order) are not "
                         f"parameters of the model; pass the model they belong to")
    fqn = [names[id(p)] for p in order]
    osd = optim.state_dict()
    state = {fqn[i]: {k: _as_dtensor(v, order[i]) for k, v in s.items()}
             for i, s in osd["state"].items()}
    groups = [{**{k: v for k, v in g.items() if k != "params"},
               "params": [fqn[i] for i in g["params"]]} for g in osd["param_groups"]]
    return {"state": state, "param_groups": groups}


def _flatten_osd(osd: Dict[str, Any]) -> Dict[str, Any]:
    flat: Dict[str, Any] = {}
    for name, st in osd["state"].items():
        flat.update({f"state.{name}.{k}": v for k, v in st.items()})
    for g in osd["param_groups"]:
        for name in g["params"]:
            flat.update({f"param_groups.{name}.{k}": v for k, v in g.items() if k != "params"})
    return flat


def get_optimizer_state_dict(model: Module, optimizers: Union[Optimizer, Iterable[Optimizer]],
                             *, submodules: Optional[Set[Module]] = None,
                             options: Optional[StateDictOptions] = None) -> Dict[str, Any]:
    """The optimizers' state keyed by parameter names (see the module docstring).

    Example:
        >>> osd = get_optimizer_state_dict(model, optimizer)  # doctest: +SKIP
        >>> osd["state"]["0.weight"]["exp_avg"]
    """
    options = _options(options)
    state: Dict[str, Any] = {}
    groups: List[Dict[str, Any]] = []
    for optim in _optimizers(optimizers):
        _init_state(optim)
        named = _named_osd(model, optim)
        state.update(named["state"])
        groups.extend(named["param_groups"])
    if submodules is not None:
        keep = {n for n, _ in _submodule_params(model, submodules)}
        state = {k: v for k, v in state.items() if k in keep}
        groups = [{**g, "params": [n for n in g["params"] if n in keep]} for g in groups]
        groups = [g for g in groups if g["params"]]
    osd = {"state": {k: _out(v, options) for k, v in state.items()}, "param_groups": groups}
    if options.flatten_optimizer_state_dict:
        osd = _flatten_osd(osd)
    return _finish(osd, options)


def _submodule_params(model: Module, submodules: Set[Module]) -> List[Tuple[str, Any]]:
    out = []
    for prefix, m in model.named_modules():
        if m in submodules:
            out.extend((f"{prefix}.{n}" if prefix else n, p) for n, p in m.named_parameters())
    return out


def _unflatten_osd(flat: Dict[str, Any], names: List[List[str]]) -> Dict[str, Any]:
    state: Dict[str, Any] = {}
    groups = []
    for group_names in names:
        for name in group_names:
            head = f"state.{name}."
            st = {k[len(head):]: v for k, v in flat.items() if k.startswith(head)}
            if st:
                state[name] = st
        head = f"param_groups.{group_names[0]}." if group_names else None
        hyper = {k[len(head):]: v for k, v in flat.items() if head and k.startswith(head)}
        groups.append({**hyper, "params": list(group_names)})
    return {"state": state, "param_groups": groups}


def _load_one(model: Module, optim: Optimizer, osd: Dict[str, Any]) -> None:
    names = _param_names(model)
    group_names = [[names[id(p)] for p in g["params"]] for g in optim.param_groups]
    if "state" not in osd and "param_groups" not in osd:
        osd = _unflatten_osd(osd, group_names)
    by_first = {tuple(g["params"]): g for g in osd["param_groups"]}
    params = {n: p for g in optim.param_groups for p in g["params"] for n in [names[id(p)]]}
    index, state, groups = 0, {}, []
    for gn in group_names:
        saved = by_first.get(tuple(gn)) or next(
            (g for g in osd["param_groups"] if set(gn) <= set(g["params"])), None)
        if saved is None:
            raise ValueError(f"the optimizer state dict has no parameter group holding "
                             f"{gn[:3]}{'...' if len(gn) > 3 else ''}")
        ids = list(range(index, index + len(gn)))
        for i, n in zip(ids, gn):
            if n in osd["state"]:
                state[i] = {k: _as_local(v, params[n], f"state[{n!r}][{k!r}]")
                            for k, v in osd["state"][n].items()}
        groups.append({**{k: v for k, v in saved.items() if k != "params"}, "params": ids})
        index += len(gn)
    optim.load_state_dict({"state": state, "param_groups": groups})


def set_optimizer_state_dict(model: Module, optimizers: Union[Optimizer, Iterable[Optimizer]],
                             optim_state_dict: Dict[str, Any], *,
                             options: Optional[StateDictOptions] = None) -> None:
    """Load a state dict from :func:`get_optimizer_state_dict` into the optimizers.

    Example:
        >>> set_optimizer_state_dict(model, optimizer, osd)  # doctest: +SKIP
    """
    options = _options(options)
    if options.broadcast_from_rank0:
        optim_state_dict = _broadcast(optim_state_dict)
    for optim in _optimizers(optimizers):
        _init_state(optim)
        _load_one(model, optim, optim_state_dict)


def get_state_dict(model: Module, optimizers: Union[Optimizer, Iterable[Optimizer]], *,
                   submodules: Optional[Set[Module]] = None,
                   options: Optional[StateDictOptions] = None) -> Tuple[Dict[str, Any],
                                                                         Dict[str, Any]]:
    """``(get_model_state_dict(...), get_optimizer_state_dict(...))``.

    Example:
        >>> model_sd, optim_sd = get_state_dict(model, optimizer)  # doctest: +SKIP
    """
    return (get_model_state_dict(model, submodules=submodules, options=options),
            get_optimizer_state_dict(model, optimizers, submodules=submodules, options=options))


def set_state_dict(model: Module, optimizers: Union[Optimizer, Iterable[Optimizer]], *,
                   model_state_dict: Dict[str, Any], optim_state_dict: Dict[str, Any],
                   options: Optional[StateDictOptions] = None) -> Any:
    """Load both state dicts; returns the model's ``(missing_keys, unexpected_keys)``.

    Example:
        >>> set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd)
        ... # doctest: +SKIP
    """
    result = set_model_state_dict(model, model_state_dict, options=options)
    if optim_state_dict:
        set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    return result
