"""``FullyShardedDataParallel`` (torch's FSDP1): the wrapper class, on ``fully_shard``'s units.

``FSDP(module, auto_wrap_policy=...)`` first replaces the submodules the policy picks by FSDP
instances of their own (deepest first), then makes ``module`` one unit with what is left.
Each instance holds its module as ``_fsdp_wrapped_module`` (``.module``) and gives it to
``fully_shard``: the parameters become ``Shard(0)`` DTensors, gathered before the module's
forward and backward (one all-gather per unit) and their gradients reduce-scattered (one per
unit) as soon as they are ready. The strategies map onto ``fully_shard`` as:

* ``FULL_SHARD``: ``reshard_after_forward=True`` over a 1-D mesh of the process group;
* ``SHARD_GRAD_OP``: ``reshard_after_forward=False`` (freed after backward);
* ``NO_SHARD``: a ``(ranks, 1)`` mesh: every rank holds whole parameters (its one-rank shard)
  and gradients are all-reduced over the ranks, as DDP;
* ``HYBRID_SHARD`` / ``_HYBRID_SHARD_ZERO2``: a 2-D ``(replicas, shards)`` mesh (HSDP).

Names: ``named_parameters()``, ``state_dict()`` and ``load_state_dict`` use the unwrapped
model's names (no ``_fsdp_wrapped_module.``), as torch's FSDP does.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, List, Optional

from mpitensor.autograd import is_grad_enabled
from mpitensor.nn import Module
from mpitensor.nn.utils import clip_grad_norm_ as _clip_grad_norm

from . import _fsdp1_state as sd
from ._fsdp1_options import (
    BackwardPrefetch,
    FullOptimStateDictConfig,
    StateDictSettings,
    StateDictType,
    settings_for,
)
from ._fsdp1_setup import (
    Options,
    cast_buffers,
    check_module,
    checked_options,
    full_precision_unit,
    ignored_parameters,
    materialize,
    resolve_device,
    resolve_mesh,
    sync_from_rank0,
)
from ._fully_shard import fully_shard
from .wrap import auto_wrap, check_policy

__all__ = ["FullyShardedDataParallel"]


class _Build:
    """What the root hands down while it builds its units: options, ignored parameters and
    the meshes made so far (units of one kind share one)."""

    def __init__(self, device_type: str, ignored: set, ignored_modules: List[Module]) -> None:
        self.device_type = device_type
        self.ignored = ignored
        self.ignored_modules = ignored_modules
        self.meshes: Dict[Any, Any] = {}

    def mesh(self, opts: Options) -> Any:
        key = opts.mesh_key()
        if key not in self.meshes:
            self.meshes[key] = resolve_mesh(opts, self.device_type)
        return self.meshes[key]

    def numel(self, m: Module) -> int:
        return sum(p.numel() for p in m.parameters() if id(p) not in self.ignored)


class FullyShardedDataParallel(Module):
    """Shard a module's parameters, gradients and optimizer state over the ranks (FSDP1).

    Args:
        module: the module to wrap (``.module`` afterwards).
        process_group: the group to shard over (default: the world); for the hybrid
            strategies a pair ``(shard_group, replicate_group)``.
        sharding_strategy: a :class:`ShardingStrategy` (default ``FULL_SHARD``).
        cpu_offload: ``CPUOffload(offload_params=True)`` keeps the shards in host memory.
        auto_wrap_policy: a policy from :mod:`mpitensor.distributed.fsdp.wrap` (or any
            ``policy(module, recurse, nonwrapped_numel) -> bool``): the submodules that
            become units of their own.
        backward_prefetch: ``BACKWARD_PRE`` (default), ``BACKWARD_POST`` or None (no
            prefetch in backward).
        mixed_precision: a :class:`MixedPrecision`.
        ignored_modules, ignored_states: modules or parameters left as they are (not sharded,
            not reduced).
        param_init_fn: called on every submodule that holds tensors on the meta device
            itself (default there: its ``to_empty`` and ``reset_parameters()``).
        device_id: None, ``"cpu"`` or a CUDA device (needs CuPy and a GPU).
        sync_module_states: start from the first rank's parameters and buffers (broadcast).
        forward_prefetch: gather the next unit while this one's forward computes.
        limit_all_gathers: accepted; at most the next unit is gathered ahead here anyway.
        use_orig_params: accepted either way: the parameters are always the original ones
            (see docs/fsdp.md for the difference from torch's flat parameters).
        device_mesh: a 1-D mesh, or a 2-D ``(replicas, shards)`` one for the hybrid strategies.

    Raises:
        TypeError, ValueError, NotImplementedError: bad arguments, on every rank before any
            traffic (a policy that is not callable, an unknown strategy, a module given to
            ``fully_shard`` already, ...); RuntimeError: a CUDA ``device_id`` without CuPy.

    Example:
        >>> policy = functools.partial(size_based_auto_wrap_policy, min_num_params=100)
        >>> model = FSDP(Net(), auto_wrap_policy=policy)      # doctest: +SKIP
        >>> opt = optim.Adam(model.parameters(), lr=1e-3)    # the shards
    """

    def __init__(self, module: Module, process_group: Any = None,
                 sharding_strategy: Any = None, cpu_offload: Any = None,
                 auto_wrap_policy: Optional[Callable] = None,
                 backward_prefetch: Optional[BackwardPrefetch] = BackwardPrefetch.BACKWARD_PRE,
                 mixed_precision: Any = None, ignored_modules: Any = None,
                 param_init_fn: Optional[Callable] = None, device_id: Any = None,
                 sync_module_states: bool = False, forward_prefetch: bool = False,
                 limit_all_gathers: bool = True, use_orig_params: bool = False,
                 ignored_states: Any = None, device_mesh: Any = None) -> None:
        check_module(module, FullyShardedDataParallel)
        check_policy(auto_wrap_policy)
        opts = checked_options(
            sharding_strategy=sharding_strategy, cpu_offload=cpu_offload,
            mixed_precision=mixed_precision, backward_prefetch=backward_prefetch,
            forward_prefetch=forward_prefetch, limit_all_gathers=limit_all_gathers,
            use_orig_params=use_orig_params, process_group=process_group,
            device_mesh=device_mesh)
        if not isinstance(sync_module_states, bool):
            raise TypeError(f"FullyShardedDataParallel: sync_module_states must be a bool, "
                            f"got {sync_module_states!r}")
        device_type = resolve_device(device_id)
        ignored, ignored_mods = ignored_parameters(module, ignored_modules, ignored_states)
        build = _Build(device_type, ignored, ignored_mods)
        mesh = build.mesh(opts)
        materialize(module, param_init_fn, device_type,
                    lambda m: m in ignored_mods or isinstance(m, FullyShardedDataParallel))
        if device_type == "cuda":
            module.to(device_id if not isinstance(device_id, int) else f"cuda:{device_id}")
        if sync_module_states:
            sync_from_rank0(module, mesh)
        if auto_wrap_policy is not None:
            auto_wrap(module, auto_wrap_policy,
                      lambda child, overrides: _unit(child, opts.replaced(overrides), build),
                      lambda m: m in ignored_mods or isinstance(m, FullyShardedDataParallel),
                      build.numel, full_precision_unit(opts.mp))
        self._setup(module, opts, mesh, build, is_root=True)

    def _setup(self, module: Module, opts: Options, mesh: Any, build: _Build,
               is_root: bool) -> None:
        Module.__init__(self)
        self._fsdp1_options = opts
        self._fsdp1_settings = settings_for(StateDictType.FULL_STATE_DICT)
        self._fsdp1_buffer_dtypes = cast_buffers(module, opts.mp)
        self._fsdp_wrapped_module = module
        ignored = [p for p in module.parameters() if id(p) in build.ignored]
        fully_shard(module, mesh=mesh, ignored_params=ignored,
                    **opts.fully_shard_kwargs(is_root))
        module._fsdp1_wrapped = True
        # fully_shard made the module's class a subclass of its own (FSDP<Class>); printed, the
        # module keeps its own name inside the wrapper, as torch's FSDP1 prints it
        own_name = type(module).__bases__[-1].__name__
        type(module)._get_name = lambda _self: own_name
        st = module._fsdp_state
        st.fwd_prefetch = None if opts.forward_prefetch else []
        st.bwd_prefetch = [] if opts.backward_prefetch is None else None
        st.prefetch_after_grads = opts.backward_prefetch is BackwardPrefetch.BACKWARD_POST

    # ---- the wrapped module ----------------------------------------------------------------

    @property
    def module(self) -> Module:
        """The wrapped module."""
        return self._fsdp_wrapped_module

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "_fsdp_wrapped_module" or name.startswith("__"):
                raise
            return getattr(self._fsdp_wrapped_module, name)

    def __getitem__(self, key: Any) -> Any:
        return self._fsdp_wrapped_module[key]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self._fsdp_wrapped_module(*args, **kwargs)
        st = self._fsdp_wrapped_module._fsdp_state
        if st.is_root and not is_grad_enabled():
            # no backward will come to free them: every unit is resharded now, as torch does
            for unit in sd.iter_units(FullyShardedDataParallel.fsdp_modules(self)):
                unit.reshard()
        return out

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple]:
        """The parameters under the unwrapped model's names (the shards, as DTensors)."""
        for name, p in Module.named_parameters(self, prefix, recurse, remove_duplicate):
            yield sd.clean(name), p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple]:
        """The buffers under the unwrapped model's names."""
        for name, b in Module.named_buffers(self, prefix, recurse, remove_duplicate):
            yield sd.clean(name), b

    def _units(self, recurse: bool = True) -> List[Any]:
        mods = FullyShardedDataParallel.fsdp_modules(self) if recurse else [self]
        return list(sd.iter_units(mods))

    # ---- state dicts -----------------------------------------------------------------------

    def state_dict(self, *, destination: Optional[dict] = None, prefix: str = "",
                   keep_vars: bool = False) -> dict:
        """The state dict of the current state-dict type (``FULL_STATE_DICT`` unless
        :meth:`state_dict_type` says otherwise), under the unwrapped model's names. Every rank
        must call it (FULL gathers each sharded tensor)."""
        for st in self._units():
            if not getattr(st, "summoned", False):  # inside summon_full_params: the whole ones
                st.reshard()
        own = OrderedDict()
        self._fsdp_wrapped_module.state_dict(destination=own, keep_vars=keep_vars)
        settings = self._fsdp1_settings
        out = OrderedDict() if destination is None else destination
        for key, value in own.items():
            out[prefix + key] = sd.model_entry(value, settings,
                                               self._fsdp1_buffer_dtypes.get(key))
        if destination is None and sd.drops_on_this_rank(settings):
            return OrderedDict()
        return out

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load a state dict of the current type: whole tensors (FULL), DTensors (SHARDED) or
        each rank's pieces (LOCAL), under the unwrapped model's names."""
        names = sd.real_names(self._fsdp_wrapped_module)
        local = self._fsdp1_settings.state_dict_type is StateDictType.LOCAL_STATE_DICT
        current = dict(Module.named_parameters(self._fsdp_wrapped_module)) if local else {}
        values = OrderedDict()
        for key, value in state_dict.items():
            real = names.get(key, key)
            values[real] = sd.local_as_dtensor(value, current[real]) if real in current \
                else value
        try:
            got = self._fsdp_wrapped_module.load_state_dict(values, strict=strict,
                                                            assign=assign)
        except RuntimeError as exc:
            raise RuntimeError(sd.clean(str(exc))) from None
        return type(got)([sd.clean(k) for k in got.missing_keys],
                         [sd.clean(k) for k in got.unexpected_keys])

    @staticmethod
    def fsdp_modules(module: Module, root_only: bool = False) -> List["FullyShardedDataParallel"]:
        """The FSDP instances in ``module``'s tree (``module`` included), outermost first
        (``root_only``: those inside no other)."""
        found = [m for m in module.modules() if isinstance(m, FullyShardedDataParallel)]
        if not root_only:
            return found
        inner = {id(m) for f in found for m in f.modules() if m is not f}
        return [m for m in found if id(m) not in inner]

    @staticmethod
    def set_state_dict_type(module: Module, state_dict_type: StateDictType,
                            state_dict_config: Any = None,
                            optim_state_dict_config: Any = None) -> StateDictSettings:
        """Set the state-dict type of every FSDP instance in ``module``; returns the previous
        settings (of the first instance)."""
        settings = settings_for(state_dict_type, state_dict_config, optim_state_dict_config)
        mods = _instances(module, "set_state_dict_type")
        previous = mods[0]._fsdp1_settings
        for m in mods:
            m._fsdp1_settings = settings
        return previous

    @staticmethod
    def get_state_dict_type(module: Module) -> StateDictSettings:
        """The state-dict settings of the FSDP instances in ``module`` (all alike)."""
        mods = _instances(module, "get_state_dict_type")
        kinds = sorted({repr(m._fsdp1_settings) for m in mods})
        if len(kinds) > 1:
            raise ValueError(f"get_state_dict_type: the FSDP instances have different "
                             f"settings {kinds}; set them with set_state_dict_type on the root")
        return mods[0]._fsdp1_settings

    @staticmethod
    @contextlib.contextmanager
    def state_dict_type(module: Module, state_dict_type: StateDictType,
                        state_dict_config: Any = None,
                        optim_state_dict_config: Any = None) -> Iterator[None]:
        """Within the block, ``state_dict()``, ``load_state_dict``, ``optim_state_dict`` and
        ``optim_state_dict_to_load`` of ``module``'s FSDP instances use this type.

        Example:
            >>> cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
            >>> with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
            ...     sd = model.state_dict()        # doctest: +SKIP
        """
        mods = FullyShardedDataParallel.fsdp_modules(module)
        before = [m._fsdp1_settings for m in mods]
        FullyShardedDataParallel.set_state_dict_type(module, state_dict_type,
                                                     state_dict_config, optim_state_dict_config)
        try:
            yield
        finally:
            for m, s in zip(mods, before):
                m._fsdp1_settings = s

    @staticmethod
    def optim_state_dict(model: Module, optim: Any,
                         optim_state_dict: Optional[Dict[str, Any]] = None,
                         group: Any = None) -> Dict[str, Any]:
        """The optimizer's state keyed by parameter names, per the model's state-dict type:
        whole tensors (FULL; ``rank0_only``: ``{}`` on other ranks), DTensors (SHARDED) or
        pieces (LOCAL). Every rank must call it."""
        settings = FullyShardedDataParallel.get_state_dict_type(model)
        return sd.named_optim_state(model, optim, optim_state_dict, settings)

    @staticmethod
    def optim_state_dict_to_load(model: Module, optim: Any, optim_state_dict: Dict[str, Any],
                                 is_named_optimizer: bool = False, load_directly: bool = False,
                                 group: Any = None) -> Dict[str, Any]:
        """Turn :meth:`optim_state_dict`'s result into what ``optim.load_state_dict`` takes
        (each rank's pieces; ``load_directly``: load it too)."""
        if is_named_optimizer:
            raise NotImplementedError("optim_state_dict_to_load(is_named_optimizer=True): "
                                      "named optimizers are not supported; pass a plain one")
        kind = FullyShardedDataParallel.get_state_dict_type(model).state_dict_type
        out = sd.optim_state_to_load(model, optim, optim_state_dict, kind)
        if load_directly:
            optim.load_state_dict(out)
        return out

    @staticmethod
    def full_optim_state_dict(model: Module, optim: Any, optim_input: Any = None,
                              rank0_only: bool = True, group: Any = None) -> Dict[str, Any]:
        """:meth:`optim_state_dict` with whole tensors (the older API; ``rank0_only``: ``{}``
        on the other ranks)."""
        _no_optim_input(optim_input)
        settings = settings_for(StateDictType.FULL_STATE_DICT,
                                optim_config=FullOptimStateDictConfig(rank0_only=rank0_only))
        return sd.named_optim_state(model, optim, None, settings)

    @staticmethod
    def sharded_optim_state_dict(model: Module, optim: Any, group: Any = None) -> Dict[str, Any]:
        """:meth:`optim_state_dict` with DTensor state (the older API)."""
        return sd.named_optim_state(model, optim, None,
                                    settings_for(StateDictType.SHARDED_STATE_DICT))

    @staticmethod
    def shard_full_optim_state_dict(full_optim_state_dict: Dict[str, Any], model: Module,
                                    optim_input: Any = None, optim: Any = None) -> Dict[str, Any]:
        """A whole-tensor optimizer state dict (every rank holds it) as this rank's
        ``optim.load_state_dict`` input (numbered as ``optim``'s parameters, or without it as
        ``model.parameters()``)."""
        _no_optim_input(optim_input)
        return sd.optim_state_to_load(model, optim, full_optim_state_dict,
                                      StateDictType.FULL_STATE_DICT)

    @staticmethod
    def scatter_full_optim_state_dict(full_optim_state_dict: Optional[Dict[str, Any]],
                                      model: Module, optim_input: Any = None, optim: Any = None,
                                      group: Any = None) -> Dict[str, Any]:
        """:meth:`shard_full_optim_state_dict` for a state dict only rank 0 holds (sent to the
        others first; the other ranks may pass None)."""
        import mpitensor.distributed as dist

        box = [full_optim_state_dict if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return FullyShardedDataParallel.shard_full_optim_state_dict(box[0], model, optim_input,
                                                                    optim)

    # ---- whole parameters, gradients, synchronisation --------------------------------------

    @staticmethod
    @contextlib.contextmanager
    def summon_full_params(module: Module, recurse: bool = True, writeback: bool = True,
                           rank0_only: bool = False, offload_to_cpu: bool = False,
                           with_grads: bool = False) -> Iterator[None]:
        """Within the block the modules hold whole parameters (in their own dtype); with
        ``writeback`` the changes made to them go back into the shards at the end.

        Raises:
            ValueError: ``rank0_only`` with ``writeback``.
            NotImplementedError: ``with_grads=True``.
        """
        if with_grads:
            raise NotImplementedError("summon_full_params(with_grads=True) is not supported; "
                                      "the gradients stay sharded")
        if rank0_only and writeback:
            raise ValueError("summon_full_params: rank0_only=True needs writeback=False (the "
                             "other ranks do not hold the whole parameters)")
        mods = FullyShardedDataParallel.fsdp_modules(module) if recurse else [module]
        if not recurse and not isinstance(module, FullyShardedDataParallel):
            raise ValueError("summon_full_params(recurse=False) takes an FSDP instance")
        import mpitensor.distributed as dist

        held = sd.Summoned(list(sd.iter_units(mods)),
                           register=not rank0_only or dist.get_rank() == 0)
        try:
            yield
        finally:
            held.restore(writeback)

    def apply(self, fn: Callable[[Module], Any]) -> "FullyShardedDataParallel":
        """``fn`` on every submodule (children first) while the parameters are whole; changes
        go back into the shards (for weight initialisation)."""
        with FullyShardedDataParallel.summon_full_params(self, writeback=True):
            _post_order(self, fn)
        return self

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> Any:
        """Clip the gradients by their joint norm over every shard; returns that norm (the
        same plain 0-d tensor on every rank)."""
        total = _clip_grad_norm(list(self.parameters()), max_norm, norm_type)
        return total.full_tensor() if hasattr(total, "full_tensor") else total

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside the block keeps the whole gradients without reducing them; the
        first backward after it reduces their sum."""
        units = self._units()
        for st in units:
            st.sync = False
        try:
            yield
        finally:
            for st in units:
                st.sync = True

    def check_is_root(self) -> bool:
        """Whether this instance is inside no other FSDP instance (known after a forward)."""
        return bool(self._fsdp_wrapped_module._fsdp_state.is_root)


def _instances(module: Module, where: str) -> List[FullyShardedDataParallel]:
    mods = FullyShardedDataParallel.fsdp_modules(module)
    if not mods:
        raise ValueError(f"{where}: the module holds no FullyShardedDataParallel")
    return mods


def _no_optim_input(optim_input: Any) -> None:
    if optim_input is not None:
        raise NotImplementedError("optim_input is not supported (torch deprecates it); pass "
                                  "optim=, or nothing for the order of model.parameters()")


def _post_order(module: Module, fn: Callable[[Module], Any]) -> None:
    for child in module.children():
        _post_order(child, fn)
    fn(module)


def _unit(child: Module, opts: Options, build: _Build) -> FullyShardedDataParallel:
    """A nested FSDP instance made by the auto-wrap, with the root's (or overridden) options."""
    unit = FullyShardedDataParallel.__new__(FullyShardedDataParallel)
    unit._setup(child, opts, build.mesh(opts), build, is_root=False)
    return unit
