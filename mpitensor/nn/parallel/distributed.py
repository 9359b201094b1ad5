"""``DistributedDataParallel`` and the tutorials' explicit gradient-sync helpers.

DDP is the one place where autograd meets communication. At construction it broadcasts the
wrapped module's parameters and buffers from the group's rank 0 (one coalesced broadcast per
dtype and device) and lays the parameters that require grad out in *buckets*: flat, contiguous
buffers filled in reverse registration order (the order in which backward produces gradients),
each up to ``bucket_cap_mb`` megabytes. During ``loss.backward()``, the model's
:class:`~mpitensor.nn.parallel._reducer.Reducer` (``ddp.reducer``, as in torch) does the rest:

1. a post-accumulate-grad hook on each parameter copies its final gradient into its slot of its
   bucket (with ``gradient_as_bucket_view=True`` the gradient *is* that slot, so nothing is
   copied once ``.grad`` is the view);
2. when the last gradient of a bucket is in, the bucket is divided by the world size and a
   non-blocking all-reduce (``async_op=True``, sum) is launched at once, so communication
   overlaps the rest of backward. Buckets are launched strictly in bucket order, so every rank
   issues the same collectives in the same sequence;
3. a callback queued with :func:`mpitensor.autograd.queue_callback` runs when backward ends: it
   launches what is left, waits for every bucket and writes the averaged gradients back into
   ``param.grad``. When ``backward()`` returns, the gradients are averaged over the group, ready
   for ``optimizer.step()``, exactly as in torch.

Ranks with different numbers of batches train inside :meth:`DistributedDataParallel.join`;
:meth:`DistributedDataParallel.verify_in_sync` checks that the replicas still agree. The full
reference is ``docs/ddp.md``.

Example (run with ``mpiexec -n 2 python train.py``)::

    import mpitensor as mt
    import mpitensor.distributed as dist
    import mpitensor.nn as nn
    from mpitensor.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("mpi")
    model = DDP(nn.Linear(10, 1))
    opt = mt.optim.SGD(model.parameters(), lr=0.1)
    loss = model(mt.randn(8, 10)).sum()
    loss.backward()          # gradients are averaged over the ranks here
    opt.step()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from operator import attrgetter
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import distributed as dist
from mpitensor.distributed import ProcessGroup, ReduceOp
from mpitensor.distributed._grad_bucket import BuiltinCommHookType, GradBucket
from mpitensor.distributed.algorithms.join import _DISABLED as _NO_JOIN
from mpitensor.distributed.algorithms.join import Join, Joinable, JoinHook
from mpitensor.distributed.model_sync import (
    average_gradients,
    broadcast_parameters,
    coalesced_broadcast,
    device_key,
    member_group,
    tensors_of,
)
from mpitensor.errors import MpiTensorError, ReplicaDivergenceError
from mpitensor.tensor import Tensor

from ..modules.module import Module
from ._reducer import CommStats, Reducer
from ._replica_check import check_layout, verify_replicas

__all__ = [
    "DistributedDataParallel",
    "CommStats",
    "ReplicaDivergenceError",
    "average_gradients",
    "broadcast_parameters",
]

_MB = 1024 * 1024


class _JoinState:
    """Bookkeeping of one enabled :meth:`DistributedDataParallel.join` context."""

    __slots__ = ("divide_by_initial_world_size", "throw", "step", "xp")

    def __init__(self, divide_by_initial_world_size: bool, throw: bool, xp: Any) -> None:
        self.divide_by_initial_world_size = divide_by_initial_world_size
        self.throw = throw
        self.step = 0  # join all-reduces made so far (the same count on every rank)
        self.xp = xp


def _mesh_group(module: Module, process_group: Any, device_mesh: Any) -> Any:
    """The group of a 1-D ``device_mesh``, with ``module``'s DTensor parameters (tensor
    parallel over another mesh dimension) turned into local pieces for DDP."""
    from mpitensor.distributed.tensor.parallel import ddp as _tp_ddp

    if process_group is not None:
        raise ValueError("DistributedDataParallel: give process_group or device_mesh, not both")
    if getattr(device_mesh, "ndim", None) != 1:
        raise ValueError(f"DistributedDataParallel: device_mesh must be a 1-D DeviceMesh (e.g. "
                         f"mesh['dp']), got {device_mesh!r}")
    _tp_ddp._check_meshes_apart(module, device_mesh)
    _tp_ddp._pre_dp_module_transform(module)
    return device_mesh.get_group(0)


def _option(name: str, what: str) -> property:
    """A read-only view of the Reducer's constructor option ``name``; ``what`` is its doc."""
    return property(attrgetter(f"reducer.{name}"), doc=f"{what} (constructor option).")


class DistributedDataParallel(Module, Joinable):
    """Data parallelism at the module level, with ``torch.nn.parallel.DistributedDataParallel``'s
    interface and semantics.

    Each rank holds a replica of ``module`` and runs it on its own share of the batch; during
    ``backward()`` the gradients are averaged over ``process_group`` in buckets whose all-reduces
    overlap the rest of backward, so that after ``loss.backward()`` every replica holds the same
    averaged gradients and, after ``optimizer.step()``, the same parameters.

    Differences from torch, all deliberate: buckets follow the reverse registration order of the
    parameters from the first step on (torch starts with one bucket and, after the first
    iteration, rebuilds them in the order gradients arrived: the same order for models whose
    layers are registered in forward order, as LeNet and every ``Sequential``); communication
    hooks and mixed precision are not provided; the ``overlap`` switch and
    :meth:`verify_in_sync` are extensions; the bucket layouts of all ranks are compared at
    construction (and, in debug mode, at every synchronising forward). MPI has no progress
    thread, so each gradient hook also tests the oldest in-flight all-reduce, which keeps the
    launched ones moving during backward.

    Args:
        module: the ``mpitensor.nn.Module`` to replicate (kept at ``.module``; the state dict's
            keys are prefixed ``module.`` as in torch).
        device_ids: None for CPU modules (and for GPU modules already on their device), or a
            list of one CUDA device (index, ``"cuda:N"`` or ``mpitensor.device``) that the
            module's parameters must live on.
        output_device: accepted for compatibility; outputs stay where ``module`` puts them.
        dim: must be 0 (accepted for compatibility: each rank passes its own shard).
        broadcast_buffers: broadcast the module's buffers from the group's rank 0 at the
            start of a forward when the previous forward synchronised gradients (or at the
            first forward), as torch: so the first evaluation forward after training uses rank
            0's running statistics on every rank (see :meth:`forward`). None means True.
            ``False`` also leaves the buffers out of the broadcast at construction (as torch).
        init_sync: broadcast parameters and buffers from the group's rank 0 at construction
            (default True). With False, the replicas must already be equal: construction
            runs :meth:`verify_in_sync` (one small gather) and raises where they are not.
        process_group: the group to average over (default: the world).
        bucket_cap_mb: bucket size in MiB (default 25). The first bucket is capped at
            ``min(1 MiB, bucket_cap_mb)`` so the first all-reduce starts early, as in torch;
            ``0`` gives one bucket per parameter.
        find_unused_parameters: parameters that take no part in producing the outputs (found
            by walking the autograd graph after each forward) or that get no gradient count as
            zero gradients and are still all-reduced, so that replicas stay in sync; the
            gradient of a parameter unused on every rank is left as it was (None after
            ``zero_grad()``), as torch. Without it (and without ``static_graph``), a backward
            that leaves a parameter without gradient still completes on every rank (zeros in
            its place; its ``.grad`` left alone), and the next forward with gradients enabled
            raises RuntimeError naming it, as torch.
        gradient_as_bucket_view: make each ``param.grad`` a view of its bucket slot, saving a
            copy and the memory of one gradient per parameter.
        static_graph: the promise that every iteration uses the same parameters in the same
            way. The parameters unused in the first synchronised backward are learned there
            (no error) and from then on marked ready at the start of every backward, without
            walking the graph; their gradients stay untouched, as torch.
        forward_sync_buffers: torch 2.13's newer name for ``broadcast_buffers``
            (keyword-only here); when given, it decides the forward broadcasts and
            ``broadcast_buffers`` is ignored, and construction broadcasts the buffers whatever
            its value.
        overlap: **mpitensor extension** (not in torch): ``True`` (default) launches each
            bucket's all-reduce as soon as it is ready during backward; ``False`` launches all
            of them only when backward has finished (for measuring what overlap buys).
        check_reduction: accepted for compatibility (deprecated in torch); unused.
        device_mesh: a 1-D DeviceMesh to average over, in place of ``process_group``
            (keyword-only here). A module made tensor-parallel over another mesh dimension
            (``parallelize_module(model, mesh["tp"], ...)``, then ``device_mesh=mesh["dp"]``)
            has its DTensor parameters handed to DDP as their local pieces, wrapped back into
            DTensors around each forward, as torch's 2-D (TP + DDP) recipe.

    Attributes:
        module: the wrapped module.
        comm_stats: a :class:`CommStats` with cheap counters (buckets, wait time per step).
        require_backward_grad_sync: False inside :meth:`no_sync`.
        require_forward_param_sync: whether the last forward synchronised gradients (True
            before the first); the next forward broadcasts the buffers only when it is set.
        forward_sync_buffers: the buffer switch (``broadcast_buffers`` reads and sets it too).

    Uneven inputs: :meth:`join`. Replicas that may have drifted apart: :meth:`verify_in_sync`.

    Raises:
        TypeError: ``module`` is not an ``mpitensor.nn.Module``, or a bad argument type.
        ValueError: ``bucket_cap_mb < 0``, parameters on different devices, no parameter that
            requires grad, or ``device_ids`` that do not match the module.
        CollectiveMismatchError: on every rank, where the replicas' parameters (number, shape,
            dtype) or bucket layouts differ across ranks; the message lists each rank's layout.
            In debug mode (``dist.set_debug()``, ``MPITENSOR_DEBUG=1``) the layouts are also
            compared at every synchronising forward (say, ranks running backward through
            different DDP instances).
        ReplicaDivergenceError: with ``init_sync=False``, on every rank, where the replicas'
            values differ.
        NotInitializedError: the process group has not been initialized.

    Example:
        >>> model = DistributedDataParallel(LeNet())
        >>> for x, y in loader:
        ...     opt.zero_grad()
        ...     F.nll_loss(model(x), y).backward()     # averaged gradients on every rank
        ...     opt.step()
    """

    def __init__(
        self,
        module: Module,
        device_ids: Optional[Sequence[Any]] = None,
        output_device: Any = None,
        dim: int = 0,
        broadcast_buffers: Optional[bool] = True,
        init_sync: bool = True,
        process_group: Optional[ProcessGroup] = None,
        bucket_cap_mb: Optional[float] = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        *,
        forward_sync_buffers: Optional[bool] = None,
        overlap: bool = True,
        device_mesh: Any = None,
    ) -> None:
        super().__init__()
        self._join_config = _NO_JOIN  # set by an algorithms.join.Join around the loop
        self._join_divide = True
        # every check is local and comes before the first message
        cap = self._checked_options(module, bucket_cap_mb, dim, broadcast_buffers,
                                    find_unused_parameters, gradient_as_bucket_view,
                                    static_graph, overlap, init_sync, forward_sync_buffers)
        if device_mesh is not None:
            process_group = _mesh_group(module, process_group, device_mesh)
        pg = member_group(process_group, "DistributedDataParallel")
        params = self._trainable(module, device_ids)
        init_buffers = self._set_options(module, pg, device_ids, output_device, dim, cap,
                                         broadcast_buffers, forward_sync_buffers)
        named = {id(p): n for n, p in module.named_parameters()}
        self.reducer = Reducer(
            params, [named.get(id(p), f"<param {i}>") for i, p in enumerate(params)], pg,
            self.bucket_bytes_cap, find_unused_parameters=bool(find_unused_parameters),
            static_graph=bool(static_graph), gradient_as_bucket_view=bool(gradient_as_bucket_view),
            overlap=bool(overlap))
        self.comm_stats = self.reducer.stats
        if self._world > 1:
            self._check_layout("construction")
            self.reducer.connect()
        self._sync_replicas(init_sync, init_buffers)
        self.reducer.install_hooks()

    # ---------------------------------------------------------------- construction steps
    @staticmethod
    def _checked_options(module: Any, bucket_cap_mb: Any, dim: int, *flags: Any) -> float:
        """Validate the arguments; return the bucket cap in MiB (25 when None)."""
        if not isinstance(module, Module):
            raise TypeError(
                f"DistributedDataParallel: module must be an mpitensor.nn.Module, got "
                f"{type(module).__name__}; wrap your layers in an nn.Module (or nn.Sequential)")
        if bucket_cap_mb is None:
            bucket_cap_mb = 25
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)):
            raise TypeError(f"DistributedDataParallel: bucket_cap_mb must be a number of MiB, "
                            f"got {bucket_cap_mb!r}")
        if not bucket_cap_mb >= 0:
            raise ValueError(f"DistributedDataParallel: bucket_cap_mb must be >= 0 (0 gives one "
                             f"bucket per parameter), got {bucket_cap_mb!r}")
        names = ("broadcast_buffers", "find_unused_parameters", "gradient_as_bucket_view",
                 "static_graph", "overlap", "init_sync", "forward_sync_buffers")
        for name, flag in zip(names, flags):
            if name.endswith("buffers") and flag is None:
                continue  # torch's None: the default
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"DistributedDataParallel: {name} must be True or False, got "
                                f"{flag!r}")
        if dim != 0:
            raise ValueError("DistributedDataParallel: dim must be 0 (inputs are not scattered: "
                             "each rank passes its own shard of the batch)")
        return float(bucket_cap_mb)

    def _trainable(self, module: Module, device_ids: Any) -> List[Tensor]:
        """The parameters to synchronise: those that require a gradient, on one device."""
        params = [p for p in tensors_of(module, "DistributedDataParallel") if p.requires_grad]
        if not params:
            raise ValueError(
                "DistributedDataParallel: the module has no parameter that requires a gradient, "
                "so there is nothing to synchronise; use the module itself")
        devices = sorted({device_key(p._data) for p in params})
        if len(devices) > 1:
            raise ValueError(
                f"DistributedDataParallel: the module's parameters are on different devices "
                f"{devices}; move the whole module to one device first (module.to(device))")
        self._check_device_ids(device_ids, devices[0])
        return params

    def _set_options(self, module: Module, pg: ProcessGroup, device_ids: Any,
                     output_device: Any, dim: int, cap_mb: float, broadcast_buffers: Any,
                     forward_sync_buffers: Any) -> bool:
        """The module's public attributes (torch's names) and per-model constants; the
        gradient options go to the :class:`Reducer`.

        Returns:
            Whether construction broadcasts the buffers: as torch, the older
            ``broadcast_buffers=False`` leaves them out, ``forward_sync_buffers`` never does.
        """
        self.module = module
        self.device_ids = list(device_ids) if device_ids is not None else None
        self.output_device = output_device
        self.dim = dim
        if forward_sync_buffers is not None:  # the newer name wins (torch 2.13)
            self.forward_sync_buffers = bool(forward_sync_buffers)
            init_buffers = True
        else:
            self.forward_sync_buffers = broadcast_buffers is None or bool(broadcast_buffers)
            init_buffers = self.forward_sync_buffers
        self.process_group = pg
        self.bucket_bytes_cap = int(cap_mb * _MB)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._world = pg.size_
        self._src = pg.ranks[0]
        self._join: Optional[_JoinState] = None  # set only inside an enabled join()
        return init_buffers

    def _sync_replicas(self, init_sync: bool, buffers: bool) -> None:
        """Start every replica from the source rank's parameters (and buffers)."""
        self._init_broadcasts = 0
        if init_sync:
            states = [p._data for p in tensors_of(self.module, "DistributedDataParallel")]
            if buffers:
                states += [b._data for b in self.module.buffers() if b is not None]
            self._init_broadcasts = coalesced_broadcast(states, self.process_group, self._src)
        elif self._world > 1:
            # no broadcast: the caller promises equal replicas; checking costs one small gather
            self.verify_in_sync()

    # ---------------------------------------------------------------- construction helpers
    @staticmethod
    def _check_device_ids(device_ids: Any, device: str) -> None:
        if device_ids is None:
            return
        if not isinstance(device_ids, (list, tuple)) or len(device_ids) != 1:
            raise ValueError(
                f"DistributedDataParallel: device_ids must be None or a list of one device "
                f"(the one this rank's module lives on), got {device_ids!r}")
        d = device_ids[0]
        try:
            want = (d if isinstance(d, _backend.device) else
                    _backend.device("cuda", int(d)) if isinstance(d, (int, np.integer))
                    else _backend.device(str(d)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"DistributedDataParallel: bad device in device_ids: {exc}") from None
        if want.type == "cpu":
            raise ValueError(
                f"DistributedDataParallel: device_ids={device_ids!r} names the CPU; a CPU module "
                "takes device_ids=None (device_ids is for the one GPU this rank's module is on)")
        if str(want) != device and not (want.index is None and device.startswith("cuda")):
            raise ValueError(
                f"DistributedDataParallel: device_ids={device_ids!r} but the module's parameters "
                f"are on {device}; move the module with module.to('{want}') first")

    # ---------------------------------------------------------------- public API
    @property
    def broadcast_buffers(self) -> bool:
        """Whether forwards broadcast the buffers (torch's older name of
        ``forward_sync_buffers``)."""
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        self.forward_sync_buffers = bool(value)

    # the gradient options live in the Reducer, which acts on them; fixed at construction
    find_unused_parameters = _option("find_unused_parameters", "Whether parameters unused by a "
                                     "step count as zero gradients")
    static_graph = _option("static_graph", "Whether every step uses the same parameters")
    gradient_as_bucket_view = _option("gradient_as_bucket_view", "Whether each ``param.grad`` is "
                                      "a view of its bucket slot")
    overlap = _option("overlap", "Whether buckets are all-reduced during backward")

    def register_comm_hook(self, state: Any, hook: Callable[[Any, GradBucket], Any]) -> None:
        """Replace the averaging of each gradient bucket by ``hook(state, bucket)``.

        ``bucket`` is a :class:`~mpitensor.distributed.GradBucket`; the hook returns a
        :class:`~mpitensor.futures.Future` whose value is a tensor with the bucket's number of
        elements (or a list holding one), which becomes the parameters' gradients. Nothing is
        divided by the world size for the hook: averaging is its job (as torch's). Ready-made
        hooks live in :mod:`mpitensor.distributed.algorithms.ddp_comm_hooks`. Hooks run in
        bucket order on every rank, so the collectives they issue match across ranks; inside
        :meth:`join`, joined ranks call the hook on zero buckets.

        Raises:
            TypeError: ``hook`` is not callable.
            RuntimeError: a hook is already registered (one per model, as torch). A hook that
                does not return a future, or whose result has the wrong number of elements,
                makes the backward pass raise ``RuntimeError``.

        Example:
            >>> from mpitensor.distributed.algorithms.ddp_comm_hooks import default_hooks
            >>> ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        """
        if not callable(hook):
            raise TypeError(f"DistributedDataParallel.register_comm_hook: the hook must be "
                            f"callable, got {type(hook).__name__}")
        if self.reducer.comm_hook is not None:
            raise RuntimeError("DistributedDataParallel: register_comm_hook or "
                               "_register_builtin_comm_hook may be called once per model")
        self.reducer.comm_hook, self.reducer.comm_state = hook, state

    def _register_builtin_comm_hook(self, comm_hook_type: Any) -> None:
        """Register a built-in hook by :class:`~mpitensor.distributed.BuiltinCommHookType`:
        ``ALLREDUCE`` (DDP's averaging) or ``FP16_COMPRESS`` (averaging in float16), both over
        this model's process group."""
        from mpitensor.distributed.algorithms.ddp_comm_hooks import default_hooks

        hooks = {BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
                 BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}
        if comm_hook_type not in hooks:
            raise TypeError(f"DistributedDataParallel._register_builtin_comm_hook: expected a "
                            f"BuiltinCommHookType, got {comm_hook_type!r}")
        self.register_comm_hook(self.process_group, hooks[comm_hook_type])

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Context manager that turns gradient synchronisation off (gradient accumulation).

        Forward/backward passes run inside it accumulate gradients locally with no
        communication; the first forward/backward after it synchronises the accumulated
        gradients. As in torch, the forward pass decides: a forward run inside ``no_sync``
        is not synchronised.

        Example:
            >>> with ddp.no_sync():
            ...     ddp(x1).sum().backward()       # local accumulation only
            >>> ddp(x2).sum().backward()           # averages the sum of both micro-batches
        """
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> contextlib.AbstractContextManager:
        """Context manager for uneven inputs: ranks may run different numbers of iterations.

        Torch's ``DistributedDataParallel.join`` (``torch.distributed.algorithms.Join``). Inside
        it, each forward first joins a small all-reduce that says which ranks are still
        active. A rank whose loop has ended waits in ``__exit__`` and *shadows* the others:
        for every forward they make it joins that all-reduce and the buffer broadcast (when
        the active ranks make one), and for every synchronising forward it also takes part in
        each bucket's all-reduce (same buckets, same order) with zero gradients, so nobody
        waits for it. Arithmetic: the gradients of a step are ``sum over active ranks of local
        grad / D``, with ``D`` the initial world size (``divide_by_initial_world_size=True``:
        the same as an even run in which the missing batches contribute zero gradient) or the
        number of ranks still active (``False``: the mean over the active ranks). Inside
        ``join()`` the buffers are broadcast from the highest active rank, as in torch (rank 0
        may have joined and hold stale buffers).

        Exiting the context returns once every rank has exited it; every rank then receives
        the parameters (and, with ``broadcast_buffers``, the buffers) of a rank that ran every
        step (the highest such rank, as torch), so all replicas end equal, even inputs
        included. Optimizer state (momentum) of early ranks is not updated, as in torch.
        Inside ``join()``, follow every forward that synchronises (grad enabled, outside
        ``no_sync``) by its backward, run evaluation forwards under ``no_grad()``, and do not
        call other collectives on the group.

        Args:
            divide_by_initial_world_size: divide by the initial world size (True, default) or
                by the number of ranks that have not joined yet (False).
            enable: False turns the context into a no-op (ranks must then be even).
            throw_on_early_termination: when any rank runs out of inputs, every rank raises
                :class:`~mpitensor.errors.MpiTensorError` at the same step instead of
                shadowing.

        Returns:
            A context manager.

        Raises:
            TypeError: an argument is not a bool.
            RuntimeError: ``join()`` is already active on this DDP.
            MpiTensorError: with ``throw_on_early_termination=True``, on every rank, at the
                step at which some rank ran out of inputs.

        Example:
            >>> with ddp.join():
            ...     for x, y in my_uneven_shard:          # 3 + rank batches, say
            ...         opt.zero_grad()
            ...         F.nll_loss(ddp(x), y).backward()
            ...         opt.step()
            >>> # every rank now holds the same parameters
        """
        for name, flag in (("divide_by_initial_world_size", divide_by_initial_world_size),
                           ("enable", enable),
                           ("throw_on_early_termination", throw_on_early_termination)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"DistributedDataParallel.join: {name} must be True or False, "
                                f"got {flag!r}")
        if enable and self._join is not None:
            raise RuntimeError("DistributedDataParallel.join: already inside join() on this "
                               "DDP; use a single join() context around the training loop")
        return self._join_context(bool(divide_by_initial_world_size), bool(enable),
                                  bool(throw_on_early_termination))

    @contextlib.contextmanager
    def _join_context(self, divide: bool, enable: bool, throw: bool) -> Iterator[None]:
        if not enable:
            yield
            return
        xp = _backend.array_module(self.reducer.params[0]._data)
        state = _JoinState(divide, throw, xp)
        self._join = state
        try:
            yield
            # this rank's inputs are exhausted: shadow the others until all are done
            self._join_wait(state)
        finally:
            self._end_generic_join()

    # ------------------------------------------------ algorithms.join.Join([ddp, ...]) support
    def join_hook(self, **kwargs: Any) -> JoinHook:
        """The hook :class:`~mpitensor.distributed.algorithms.Join` runs on a rank that ran out
        of inputs: it shadows the active ranks' forwards and backwards (as :meth:`join`
        does), then every rank takes the final state of the last rank to join.

        Args:
            divide_by_initial_world_size: as in :meth:`join` (default True); given to ``Join``
                as a keyword argument.
        """
        divide = kwargs.get("divide_by_initial_world_size", True)
        if not isinstance(divide, (bool, np.bool_)):
            raise TypeError(f"DistributedDataParallel.join_hook: divide_by_initial_world_size "
                            f"must be True or False, got {divide!r}")
        self._join_divide = bool(divide)
        return _DDPJoinHook(self)

    @property
    def join_device(self) -> Any:
        """The device of the parameters (where the join's counts are summed)."""
        return self.reducer.params[0].device

    @property
    def join_process_group(self) -> ProcessGroup:
        """The process group gradients are averaged over."""
        return self.process_group

    def _generic_join_state(self) -> _JoinState:
        if self._join is None:
            self._join = _JoinState(self._join_divide, False,
                                    _backend.array_module(self.reducer.params[0]._data))
        return self._join

    def _generic_join_notify(self) -> None:
        """An active rank's forward inside ``Join([ddp])``: the join's count, then (below,
        in forward) the same per-forward all-reduce as inside :meth:`join`."""
        try:
            Join.notify_join_context(self)
        except RuntimeError:
            self._end_generic_join()  # throw_on_early_termination: this join is over
            raise
        self._generic_join_state()

    def _end_generic_join(self) -> None:
        self._join = None
        self.reducer.end_join()

    def _join_allreduce(self, state: _JoinState, active: bool, sync: bool, bufs: bool,
                        first: bool) -> np.ndarray:
        # [0, w): who is active; w: how many active ranks synchronise this step; w + 1: a
        # joined rank asks everyone to stop; [w + 2, 2w + 2): joined ranks in their first
        # wait (at the last step: the ranks that ran every step); 2w + 2: how many active
        # ranks broadcast the buffers before this forward
        w = self._world
        me = self.process_group.rank_
        v = np.zeros(2 * w + 3, np.int64)
        if active:
            v[me] = 1
            v[w] = int(sync)
            v[2 * w + 2] = int(bufs)
        else:
            v[w + 1] = int(state.throw)
            v[w + 2 + me] = int(first)
        if state.xp is not np:
            dv = state.xp.asarray(v)
            dist.all_reduce(dv, op=ReduceOp.SUM, group=self.process_group)
            v = _backend.to_numpy(dv)
        else:
            dist.all_reduce(v, op=ReduceOp.SUM, group=self.process_group)
        state.step += 1
        return v

    def _join_notify(self, sync: bool, bufs: bool) -> int:
        """An active rank's per-forward join all-reduce; returns the buffer source rank."""
        state = self._join
        v = self._join_allreduce(state, True, sync, bufs, False)
        w = self._world
        active = np.flatnonzero(v[:w])
        if v[w + 1]:
            raise self._early_termination_error(v, state)
        self.reducer.divisor = w if state.divide_by_initial_world_size else len(active)
        # as torch inside join(): the highest active rank holds the authoritative buffers
        return self.process_group.ranks[int(active[-1])]

    def _join_wait(self, state: _JoinState) -> None:
        """A joined rank: shadow the active ranks' steps until every rank has joined."""
        pg = self.process_group
        w = self._world
        first = True
        while True:
            v = self._join_allreduce(state, False, False, False, first)
            active = np.flatnonzero(v[:w])
            if len(active) == 0:
                break
            if state.throw:
                raise self._early_termination_error(v, state)
            first = False
            self._shadow_step(pg.ranks[int(active[-1])], bool(v[w]), bool(v[2 * w + 2]))
        # as torch, every rank then takes the state of a rank that ran every step (the
        # highest): the early ranks' parameters are stale, and buffers may differ anyway
        last = np.flatnonzero(v[w + 2:2 * w + 2])
        states = [p._data for p in tensors_of(self.module, "DistributedDataParallel")]
        if self.broadcast_buffers:
            states += [b._data for b in self.module.buffers() if b is not None]
        coalesced_broadcast(states, pg, pg.ranks[int(last[-1])])

    def _shadow_step(self, src: int, sync: bool, bufs: bool) -> None:
        """Match one forward of the active ranks (and its backward's all-reduces, if it syncs)
        with zero gradients."""
        pg = self.process_group
        # the next forward after join() decides its buffer broadcast as the active ranks do
        self.require_forward_param_sync = sync
        if self._world > 1:
            if sync and pg.debug:
                self._check_layout("sync")
            if bufs:
                self._sync_buffers(src)
        if not sync:
            return
        self.reducer.reduce_zeros()

    def _early_termination_error(self, v: np.ndarray, state: _JoinState) -> MpiTensorError:
        w = self._world
        done = [self.process_group.ranks[i] for i in range(w) if not v[i]]
        return MpiTensorError(
            f"rank {dist.get_rank()}: DistributedDataParallel.join(throw_on_early_termination="
            f"True): detected at least one rank that exhausted inputs (rank(s) {done} at join "
            f"step {state.step}); throwing across all ranks. Give every rank the same number of "
            "batches (e.g. DistributedSampler(..., drop_last=True)), or use join() without "
            "throw_on_early_termination so that the other ranks carry on")

    def verify_in_sync(self, atol: float = 0.0, rtol: float = 0.0) -> None:
        """Check that every replica holds the same parameters and buffers (**mpitensor extension**).

        Cheap when they agree: each rank hashes each tensor (8 bytes per tensor, computed on
        the host) and one small gather compares the hashes. Only the tensors whose hashes
        differ are then compared element by element with group rank 0's copy (one broadcast
        each), and an element differs when ``|x - x0| > atol + rtol * |x0|`` (equal values,
        infinities included, and NaN against NaN agree). Every rank makes the same decision
        and raises the same error. Call it on every rank of the group, outside ``join()``.

        Args:
            atol: absolute tolerance (default 0: bitwise-equal values, up to ``-0.0 == 0.0``).
            rtol: relative tolerance (default 0).

        Returns:
            None when the replicas agree.

        Raises:
            ReplicaDivergenceError: on every rank, naming each parameter or buffer that
                differs, the ranks whose values differ from group rank 0's, and the largest
                absolute difference (with where it is).
            TypeError, ValueError: a tolerance that is not a number >= 0 (before any traffic).
            RuntimeError: called inside ``join()``.

        Example:
            >>> ddp.verify_in_sync()                   # every N steps, or after a resume
            >>> ddp.verify_in_sync(atol=1e-6)          # tolerate round-off
        """
        self._check_tolerances(atol, rtol)
        if self._world == 1:
            return None
        verify_replicas(self.process_group, self._src, self._state_tensors(), float(atol),
                        float(rtol))

    def _check_tolerances(self, atol: Any, rtol: Any) -> None:
        for name, tol in (("atol", atol), ("rtol", rtol)):
            if isinstance(tol, bool) or not isinstance(tol, (int, float, np.integer,
                                                             np.floating)):
                raise TypeError(f"DistributedDataParallel.verify_in_sync: {name} must be a "
                                f"number, got {tol!r}")
            if not tol >= 0:
                raise ValueError(f"DistributedDataParallel.verify_in_sync: {name} must be >= 0, "
                                 f"got {tol!r}")
        if self._join is not None:
            raise RuntimeError("DistributedDataParallel.verify_in_sync: not inside join() (the "
                               "ranks that have joined would not take part); call it after the "
                               "join() context")

    def _state_tensors(self) -> List[tuple]:
        out = [("parameter", n, p._data) for n, p in self.module.named_parameters()]
        out += [("buffer", n, b._data) for n, b in self.module.named_buffers() if b is not None]
        return out

    def _check_layout(self, when: str) -> None:
        """Check that every rank has the same bucket layout (and, at construction, parameters).

        Raises ``CollectiveMismatchError`` on every rank, listing each rank's layout.
        """
        r = self.reducer
        check_layout(self.process_group, when, r.layout, r.params, r.names)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """Run the wrapped module (after syncing buffers) and prepare the gradient sync.

        The buffers are broadcast from the group's rank 0 before the module runs when
        ``broadcast_buffers`` is on and the *previous* forward synchronised gradients (or this
        is the first forward), as in torch: the first forward of an evaluation after training
        still broadcasts, so every replica evaluates with rank 0's running statistics; the
        following ones (no gradient sync) do not, nor does the first forward after them.

        Raises:
            RuntimeError: with gradients enabled, when the previous synchronised backward gave
                no gradient to some parameter and neither ``find_unused_parameters`` nor
                ``static_graph`` is set (as torch). The other ranks are told: those that did
                not raise it too get PeerFailedError in their next collective.
        """
        reducer = self.reducer
        if reducer.in_backward:
            reducer.recover()
        grad_on = _autograd.is_grad_enabled()
        if grad_on and reducer.unused_error is not None:
            reducer.raise_unused()
        sync = self.require_backward_grad_sync and grad_on
        bufs = self.broadcast_buffers and self.require_forward_param_sync
        src = self._src
        if self._join_config.enable:
            self._generic_join_notify()
        if self._join is not None:
            src = self._join_notify(sync, bufs)
        if self._world > 1:
            if sync and self.process_group.debug:
                self._check_layout("sync")
            if bufs:
                self._sync_buffers(src)
        out = self.module(*inputs, **kwargs)
        # decides whether the *next* forward broadcasts the buffers (torch's rule)
        self.require_forward_param_sync = sync
        if sync:
            reducer.prepare_for_backward(out)
        return out

    def _sync_buffers(self, src: int) -> None:
        """Broadcast the module's buffers from group member ``src`` (a global rank)."""
        bufs = [b._data for b in self.module.buffers() if b is not None]
        if bufs:
            coalesced_broadcast(bufs, self.process_group, src)

    def extra_repr(self) -> str:
        return (f"buckets={len(self.reducer.buckets)}, "
                f"bucket_cap_mb={self.bucket_bytes_cap / _MB:g}, world_size={self._world}")


class _DDPJoinHook(JoinHook):
    """What a joined rank does for its DDP inside ``algorithms.join.Join``."""

    def __init__(self, ddp: DistributedDataParallel) -> None:
        self.ddp = ddp

    def main_hook(self) -> None:
        ddp = self.ddp
        state = ddp._generic_join_state()
        v = ddp._join_allreduce(state, False, False, False, False)
        w = ddp._world
        active = np.flatnonzero(v[:w])
        ddp._shadow_step(ddp.process_group.ranks[int(active[-1])], bool(v[w]),
                         bool(v[2 * w + 2]))

    def post_hook(self, is_last_joiner: bool) -> None:
        # every rank takes the state of the last rank to join (the highest, if several)
        ddp = self.ddp
        pg = ddp.process_group
        try:
            if ddp._world > 1:
                mine = np.array([pg.rank_ if is_last_joiner else -1], np.int64)
                dist.all_reduce(mine, op=ReduceOp.MAX, group=pg)
                states = [p._data for p in tensors_of(ddp.module, "DistributedDataParallel")]
                if ddp.broadcast_buffers:
                    states += [b._data for b in ddp.module.buffers() if b is not None]
                coalesced_broadcast(states, pg, pg.ranks[int(mine[0])])
        finally:
            ddp._end_generic_join()
