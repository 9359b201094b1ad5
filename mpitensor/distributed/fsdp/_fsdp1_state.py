"""``FullyShardedDataParallel``'s state dicts: names without the wrapper's, the three state-dict
types for the model and the optimizer, and the whole parameters of ``summon_full_params``.

Every conversion that communicates (``full_tensor()``) runs in the order of the state dict's
keys, the same on every rank, so every rank must make the call.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

from mpitensor.autograd import no_grad
from mpitensor.nn import Parameter
from mpitensor.tensor import Tensor

from ._fsdp1_options import StateDictSettings, StateDictType
from ._group import raw

WRAPPED = "_fsdp_wrapped_module"


def clean(name: str) -> str:
    """A name as the unwrapped model has it (the wrappers' own level left out)."""
    return name.replace(WRAPPED + ".", "").replace("." + WRAPPED, "").replace(WRAPPED, "")


def _dtensor_type() -> Any:
    from ..tensor import DTensor

    return DTensor


def _rank() -> int:
    import mpitensor.distributed as dist

    return dist.get_rank()


def _offloaded(value: Any, offload: bool) -> Any:
    return value.cpu() if offload and isinstance(value, Tensor) else value


def model_entry(value: Any, settings: StateDictSettings, orig_dtype: Any) -> Any:
    """One model state-dict value as ``settings`` want it: a DTensor made whole on every rank
    under FULL; as it is under SHARDED and LOCAL (each rank's piece is its local tensor: torch
    wraps its flat pieces as ShardedTensors for the same reason, so that a distributed
    checkpoint saves every rank's piece)."""
    if isinstance(value, _dtensor_type()) and \
            settings.state_dict_type is StateDictType.FULL_STATE_DICT:
        with no_grad():
            value = value.full_tensor()
    if orig_dtype is not None and isinstance(value, Tensor) and value.dtype != orig_dtype:
        value = value.to(orig_dtype)
    return _offloaded(value, settings.state_dict_config.offload_to_cpu)


def drops_on_this_rank(settings: StateDictSettings, optim: bool = False) -> bool:
    """FULL with ``rank0_only``: ranks other than 0 get an empty dict."""
    cfg = settings.optim_state_dict_config if optim else settings.state_dict_config
    return (settings.state_dict_type is StateDictType.FULL_STATE_DICT
            and getattr(cfg, "rank0_only", False) and _rank() != 0)


def real_names(inner: Any) -> Dict[str, str]:
    """Clean name -> the name under ``inner`` (through nested wrappers) of every saved entry."""
    out = {}
    for path, m in inner.named_modules():
        for name, _ in m._persistent_state():
            real = f"{path}.{name}" if path else name
            out[clean(real)] = real
    return out


def local_as_dtensor(value: Any, current: Any) -> Any:
    """A LOCAL state dict's piece for the DTensor ``current``, as a DTensor of its layout."""
    if not isinstance(current, _dtensor_type()) or isinstance(value, _dtensor_type()):
        return value
    return _dtensor_type().from_local(value, current.device_mesh, current.placements,
                                      run_check=False, shape=current.shape)


# ---- optimizer state dicts -----------------------------------------------------------------

def _param_order(model: Any, optim: Any) -> Tuple[List[Any], Dict[int, str]]:
    """The optimizer's parameters in its numbering (without one: the model's, as torch
    numbers them then) and the model's name of each."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = list(model.parameters()) if optim is None else \
        [p for g in optim.param_groups for p in g["params"]]
    strays = [i for i, p in enumerate(order) if id(p) not in names]
    if strays:
        raise ValueError(f"FSDP optimizer state dict: the optimizer's parameters {strays} (in "
                         f"its order) are not parameters of the model given; pass the model "
                         f"whose parameters() the optimizer was built from")
    return order, names


def _is_piece(value: Any, param: Any) -> bool:
    """Whether a state value is the per-element state of a DTensor parameter's piece."""
    return (isinstance(param, _dtensor_type()) and isinstance(value, Tensor)
            and not isinstance(value, _dtensor_type()) and value.ndim > 0
            and tuple(value.shape) == tuple(param.to_local().shape))


def optim_entry(value: Any, param: Any, settings: StateDictSettings) -> Any:
    kind = settings.state_dict_type
    if _is_piece(value, param):
        value = _dtensor_type().from_local(value, param.device_mesh, param.placements,
                                           run_check=False, shape=param.shape)
        if kind is StateDictType.FULL_STATE_DICT:
            value = value.full_tensor()
    return _offloaded(value, settings.optim_state_dict_config.offload_to_cpu)


def named_optim_state(model: Any, optim: Any, osd: Optional[Dict[str, Any]],
                      settings: StateDictSettings) -> Dict[str, Any]:
    """The optimizer's state keyed by the parameters' clean names (see ``optim_state_dict``)."""
    order, names = _param_order(model, optim)
    osd = optim.state_dict() if osd is None else osd
    state = {}
    for idx in sorted(osd["state"]):
        p = order[idx]
        state[names[id(p)]] = {k: optim_entry(v, p, settings)
                               for k, v in osd["state"][idx].items()}
    groups = [{**{k: v for k, v in g.items() if k != "params"},
               "params": [names[id(order[i])] for i in g["params"]]}
              for g in osd["param_groups"]]
    if drops_on_this_rank(settings, optim=True):
        return {}
    return {"state": state, "param_groups": groups}


def _rows_of(value: Any, param: Any, what: str) -> Any:
    """This rank's rows of a whole tensor for the ``Shard(0)`` DTensor ``param``."""
    if tuple(value.shape) != tuple(param.shape):
        raise ValueError(f"{what}: a tensor of shape {tuple(value.shape)} for a parameter of "
                         f"shape {tuple(param.shape)}")
    mesh = param.device_mesh
    n = mesh.size(mesh.ndim - 1)
    k = mesh.get_local_rank(mesh.ndim - 1)
    d0 = param.shape[0]
    chunk = -(-d0 // n)
    return value[min(k * chunk, d0):min((k + 1) * chunk, d0)]


def optim_value_to_load(value: Any, param: Any, kind: StateDictType, what: str) -> Any:
    if not isinstance(param, _dtensor_type()) or not isinstance(value, Tensor) \
            or value.ndim == 0:
        return value
    if isinstance(value, _dtensor_type()):
        if value.placements != param.placements or value.device_mesh != param.device_mesh:
            value = value.redistribute(param.device_mesh, param.placements)
        return value.to_local()
    if kind is StateDictType.LOCAL_STATE_DICT:
        return value
    return _rows_of(value, param, what).contiguous()


def optim_state_to_load(model: Any, optim: Any, osd: Dict[str, Any],
                        kind: StateDictType) -> Dict[str, Any]:
    """A state dict keyed by names turned into the optimizer's own (numbered, local pieces)."""
    order, names = _param_order(model, optim)
    index = {names[id(p)]: i for i, p in enumerate(order)}
    unknown = sorted(set(osd.get("state", {})) - set(index))
    if unknown:
        raise ValueError(f"optim_state_dict_to_load: the state dict names parameters the "
                         f"optimizer does not hold: {unknown[:5]}")
    state = {}
    for name, st in osd["state"].items():
        i = index[name]
        state[i] = {k: optim_value_to_load(v, order[i], kind, f"state[{name!r}][{k!r}]")
                    for k, v in st.items()}
    groups = []
    for g in osd["param_groups"]:
        missing = [n for n in g["params"] if n not in index]
        if missing:
            raise ValueError(f"optim_state_dict_to_load: parameter group names {missing[:5]}, "
                             f"which the optimizer does not hold")
        groups.append({**{k: v for k, v in g.items() if k != "params"},
                       "params": [index[n] for n in g["params"]]})
    return {"state": state, "param_groups": groups}


# ---- summon_full_params --------------------------------------------------------------------

class Summoned:
    """Whole parameters registered in place of a set of units' shards, until :meth:`restore`."""

    def __init__(self, states: List[Any], register: bool) -> None:
        self.items: List[Tuple[Any, Any, Any]] = []
        self.states = [st for st in states if not getattr(st, "summoned", False)]
        for st in self.states:
            st.reshard()
            st.summoned = True
            for info in st.group.infos:
                if info.layout is not None:
                    raise NotImplementedError(
                        "summon_full_params: a tensor-parallel parameter (a DTensor over "
                        "another mesh dim) has no single whole tensor here")
                with no_grad():
                    whole = info.sharded.full_tensor()
                full = Parameter(whole, requires_grad=info.requires_grad)
                self.items.append((st, info, full))
                if register:
                    for owner, name in info.owners:
                        owner._parameters[name] = full

    def restore(self, writeback: bool) -> None:
        for _, info, full in self.items:
            if writeback and info.stop > info.start:
                raw(info.sharded)[...] = raw(full)[info.start:info.stop]
        for st in self.states:
            st._register(False)
            st.summoned = False


def iter_units(fsdp_modules: List[Any]) -> Iterator[Any]:
    """The fully_shard states (with parameters) of these FSDP instances."""
    for m in fsdp_modules:
        st = m._fsdp_wrapped_module._fsdp_state
        if st.group is not None:
            yield st
