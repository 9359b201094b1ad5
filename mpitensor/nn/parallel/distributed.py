"""``DistributedDataParallel`` and the tutorials' explicit gradient-sync helpers.

DDP is the one place where autograd meets communication. At construction it broadcasts the
wrapped module's parameters and buffers from the group's rank 0 (one coalesced broadcast per
dtype and device) and lays the parameters that require grad out in *buckets*: flat, contiguous
buffers filled in reverse registration order (the order in which backward produces gradients),
each up to ``bucket_cap_mb`` megabytes. During ``loss.backward()``:

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
import hashlib
import logging
import time
import weakref
from collections.abc import Iterator
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import distributed as dist
from mpitensor.autograd import Node
from mpitensor.distributed import ProcessGroup, ReduceOp
from mpitensor.distributed._grad_bucket import BuiltinCommHookType, GradBucket
from mpitensor.distributed.backends.mpi.node_reduce import NodeReduce
from mpitensor.distributed._work_future import progress
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
from mpitensor.errors import (
    CollectiveMismatchError,
    MpiTensorError,
    ReplicaDivergenceError,
)
from mpitensor.tensor import Tensor, _new

from ..module import Module

__all__ = [
    "DistributedDataParallel",
    "CommStats",
    "ReplicaDivergenceError",
    "average_gradients",
    "broadcast_parameters",
]

logger = logging.getLogger("mpitensor.nn.parallel")

_MB = 1024 * 1024
#: torch caps the first bucket at 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``) so that the first
#: all-reduce starts as early as possible in backward; mpitensor does the same.
DEFAULT_FIRST_BUCKET_BYTES = 1 * _MB

_UNUSED_MSG = (
    "rank {rank}: DistributedDataParallel: the previous backward pass gave no gradient to "
    "{count} parameter(s) that require one: {names}. Their buckets were "
    "all-reduced with zeros in their place, so that no rank waited for the others. DDP without "
    "find_unused_parameters=True expects every parameter to take part in the loss of every "
    "synchronised step. Pass find_unused_parameters=True (or static_graph=True when the same "
    "parameters go unused at every step), or make every parameter, and every output of "
    "forward, contribute to the loss"
)


# --------------------------------------------------------------------------------------------
# DDP


class CommStats:
    """Cheap per-step counters of a :class:`DistributedDataParallel` (for profiles).

    Attributes:
        num_buckets: how many buckets the parameters were grouped into.
        bucket_bytes: the size of each bucket, in bucket (launch) order.
        steps: synchronised backward passes so far.
        launched: buckets launched in the current/last backward (all of them once it ends).
        overlapped: buckets of the last backward launched *during* backward (before its end).
        last_wait_s: seconds the last backward's final callback waited for communication
            (launching the remaining buckets included).
        total_wait_s: the sum of ``last_wait_s`` over all steps.
        last_backward_end_s: ``time.perf_counter()`` when the last final callback started.
        shadowed: steps this rank shadowed inside :meth:`DistributedDataParallel.join` after
            running out of inputs (zero gradients all-reduced to match the active ranks).
    """

    __slots__ = ("num_buckets", "bucket_bytes", "steps", "launched", "overlapped",
                 "last_wait_s", "total_wait_s", "last_backward_end_s", "shadowed")

    def __init__(self, bucket_bytes: Sequence[int]) -> None:
        self.num_buckets = len(bucket_bytes)
        self.bucket_bytes = list(bucket_bytes)
        self.reset()

    def reset(self) -> None:
        """Zero the per-step counters (the bucket layout stays)."""
        self.steps = 0
        self.launched = 0
        self.overlapped = 0
        self.last_wait_s = 0.0
        self.total_wait_s = 0.0
        self.last_backward_end_s = 0.0
        self.shadowed = 0

    def as_dict(self) -> dict:
        """The counters as a plain dict."""
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self) -> str:
        return (f"CommStats(num_buckets={self.num_buckets}, steps={self.steps}, "
                f"overlapped={self.overlapped}, last_wait_s={self.last_wait_s:.6f}, "
                f"total_wait_s={self.total_wait_s:.6f})")


class _Bucket:
    """One flat gradient buffer and the parameters whose gradients live in it."""

    __slots__ = ("index", "params", "buffer", "views", "pending", "work", "nbytes")

    def __init__(self, index: int, params: List[int], buffer: Any, views: List[Any]) -> None:
        self.index = index
        self.params = params  # indices into DistributedDataParallel._params
        self.buffer = buffer
        self.views = views  # per parameter: its slot, shaped like the parameter
        self.pending = len(params)
        self.work: Any = None
        self.nbytes = int(buffer.nbytes)


def _bucket_assignment(sizes_dtypes: Sequence[tuple], cap_bytes: int,
                       first_cap_bytes: int) -> List[List[int]]:
    """Group parameter indices into buckets, as torch's ``compute_bucket_assignment_by_size``.

    ``sizes_dtypes`` is ``(index, nbytes, key)`` in the order gradients are expected (reverse
    registration order). Buckets hold one dtype/device ``key`` each and close once they reach
    their cap (so a bucket may exceed it by one tensor); the first bucket of each key is capped
    at ``first_cap_bytes``. Buckets come out ordered by their first tensor.
    """
    open_: dict = {}
    done: List[tuple] = []  # (first position, indices)
    first_seen: dict = {}
    for pos, (idx, nbytes, key) in enumerate(sizes_dtypes):
        cur = open_.get(key)
        if cur is None:
            cur = open_[key] = [pos, [], 0]
        cur[1].append(idx)
        cur[2] += nbytes
        limit = first_cap_bytes if key not in first_seen else cap_bytes
        if cur[2] >= limit:
            done.append((cur[0], cur[1]))
            first_seen[key] = True
            del open_[key]
    done.extend((c[0], c[1]) for c in open_.values())
    done.sort(key=lambda t: t[0])
    return [b for _, b in done]


def _collect_tensors(obj: Any, out: list) -> None:
    if isinstance(obj, Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _collect_tensors(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _collect_tensors(o, out)


class _JoinState:
    """Bookkeeping of one enabled :meth:`DistributedDataParallel.join` context."""

    __slots__ = ("divide_by_initial_world_size", "throw", "step", "xp")

    def __init__(self, divide_by_initial_world_size: bool, throw: bool, xp: Any) -> None:
        self.divide_by_initial_world_size = divide_by_initial_world_size
        self.throw = throw
        self.step = 0  # join all-reduces made so far (the same count on every rank)
        self.xp = xp


def _describe_layout(buckets: Sequence[tuple], limit: int = 8) -> str:
    total = sum(n for n, _ in buckets)
    shown = ", ".join(f"{n} {dt}" for n, dt in buckets[:limit])
    more = f", ... (+{len(buckets) - limit} more)" if len(buckets) > limit else ""
    return f"{len(buckets)} bucket(s) of [{shown}{more}] elements ({total} in all)"


def _fingerprint(arr: Any) -> bytes:
    """An 8-byte digest of an array's bytes (host copy for device arrays)."""
    host = np.ascontiguousarray(_backend.to_numpy(arr))
    return hashlib.blake2b(host.reshape(-1).view(np.uint8), digest_size=8).digest()


def _compare(x: Any, ref: Any, atol: float, rtol: float) -> tuple:
    """``(count, max |x - ref|, index, x there, ref there)`` over the elements beyond tolerance.

    An element is within tolerance when ``|x - ref| <= atol + rtol * |ref|``, when both are
    equal (infinities included) or when both are NaN. ``count`` is 0 when all are.
    """
    xp = _backend.array_module(x)
    wide = np.complex128 if x.dtype.kind == "c" else np.float64
    a = x.astype(wide).reshape(-1)
    b = ref.astype(wide).reshape(-1)
    d = xp.abs(a - b)
    ok = (d <= atol + rtol * xp.abs(b)) | (a == b)
    if x.dtype.kind in "fc":
        ok |= xp.isnan(a) & xp.isnan(b)
    bad = ~ok
    count = int(bad.sum())
    if count == 0:
        return (0, 0.0, None, None, None)
    score = xp.where(bad, xp.where(xp.isnan(d), xp.inf, d), -1.0)
    k = int(score.argmax())
    index = tuple(int(i) for i in np.unravel_index(k, x.shape)) if x.ndim else ()
    return (count, float(d[k]), index, a[k].item(), b[k].item())


def _fmt(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


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
    ) -> None:
        super().__init__()
        self._join_config = _NO_JOIN  # set by an algorithms.join.Join around the loop
        self._join_divide = True
        # every check is local and comes before the first message
        cap = self._checked_options(module, bucket_cap_mb, dim, broadcast_buffers,
                                    find_unused_parameters, gradient_as_bucket_view,
                                    static_graph, overlap, init_sync, forward_sync_buffers)
        pg = member_group(process_group, "DistributedDataParallel")
        params = self._trainable(module, device_ids)
        init_buffers = self._set_options(module, pg, params, device_ids, output_device, dim,
                                         cap, broadcast_buffers, forward_sync_buffers,
                                         find_unused_parameters, gradient_as_bucket_view,
                                         static_graph, overlap)
        self._make_buckets()
        self._sync_replicas(init_sync, init_buffers)
        self._reset()
        self._install_hooks()

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

    def _set_options(self, module: Module, pg: ProcessGroup, params: List[Tensor],
                     device_ids: Any, output_device: Any, dim: int, cap_mb: float,
                     broadcast_buffers: Any, forward_sync_buffers: Any,
                     find_unused_parameters: bool, gradient_as_bucket_view: bool,
                     static_graph: bool, overlap: bool) -> bool:
        """The public attributes (torch's names) and the per-model constants.

        Returns:
            Whether construction broadcasts the buffers: as torch, the older
            ``broadcast_buffers=False`` leaves them out, ``forward_sync_buffers`` never does.
        """
        named = {id(p): n for n, p in module.named_parameters()}
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
        self.find_unused_parameters = bool(find_unused_parameters)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.static_graph = bool(static_graph)
        self.overlap = bool(overlap)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._world = pg.size_
        self._src = pg.ranks[0]
        self._params = params
        self._names = [named.get(id(p), f"<param {i}>") for i, p in enumerate(params)]
        self._divisor = self._world  # what each bucket is divided by (join() may change it)
        self._join: Optional[_JoinState] = None  # set only inside an enabled join()
        self._join_zeros: Optional[List[Any]] = None
        self._comm_hook: Any = None  # register_comm_hook's hook, called as hook(state, bucket)
        self._comm_state: Any = None
        self._static_unused: Optional[List[int]] = None
        # set by a backward that left parameters without gradient; raised by the next forward
        self._unused_error: Optional[RuntimeError] = None
        return init_buffers

    def _make_buckets(self) -> None:
        """Group the parameters into buckets (local), then check every rank made the same."""
        self._build_buckets(min(DEFAULT_FIRST_BUCKET_BYTES, self.bucket_bytes_cap))
        self._layout = [(int(b.buffer.size), b.buffer.dtype.name) for b in self._buckets]
        self.comm_stats = CommStats([b.nbytes for b in self._buckets])
        self._node: Optional[NodeReduce] = None
        if self._world > 1:
            self._check_layout("construction")
            if getattr(self.process_group, "backend_name", None) == "mpi":
                # ranks outnumbering the node's cores: buckets meet in shared memory (agreed by
                # every rank, or by none)
                self._node = NodeReduce.create(self.process_group,
                                               [b.buffer for b in self._buckets])

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

    def _install_hooks(self) -> None:
        """A post-accumulate hook per parameter marks it ready (and may launch its bucket)."""
        ref = weakref.ref(self)
        self._hook_handles = [p.register_post_accumulate_grad_hook(_make_hook(ref, i))
                              for i, p in enumerate(self._params)]

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

    def _build_buckets(self, first_cap: int) -> None:
        order = [(i, p._data.nbytes, (p._data.dtype, device_key(p._data)))
                 for i, p in reversed(list(enumerate(self._params)))]
        groups = _bucket_assignment(order, self.bucket_bytes_cap, first_cap)
        self._buckets: List[_Bucket] = []
        self._where: List[tuple] = [None] * len(self._params)  # type: ignore[list-item]
        for b, idx in enumerate(groups):
            proto = self._params[idx[0]]._data
            xp = _backend.array_module(proto)
            total = sum(self._params[i]._data.size for i in idx)
            buf = xp.zeros_like(proto, shape=(total,), order="C")
            views, off = [], 0
            for k, i in enumerate(idx):
                a = self._params[i]._data
                views.append(buf[off:off + a.size].reshape(a.shape))
                off += a.size
                self._where[i] = (b, k)
            self._buckets.append(_Bucket(b, idx, buf, views))

    # ---------------------------------------------------------------- public API
    @property
    def broadcast_buffers(self) -> bool:
        """Whether forwards broadcast the buffers (torch's older name of
        ``forward_sync_buffers``)."""
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        self.forward_sync_buffers = bool(value)

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
        if self._comm_hook is not None:
            raise RuntimeError("DistributedDataParallel: register_comm_hook or "
                               "_register_builtin_comm_hook may be called once per model")
        self._comm_hook, self._comm_state = hook, state

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

    def _run_comm_hook(self, index: int, buffer: Any) -> Any:
        """Call the hook on bucket ``index`` (its data in ``buffer``); the future it returns."""
        b = self._buckets[index]
        grad_bucket = GradBucket(index, buffer, [v.shape for v in b.views],
                                 [self._params[i] for i in b.params],
                                 index == len(self._buckets) - 1)
        fut = self._comm_hook(self._comm_state, grad_bucket)
        if not (hasattr(fut, "wait") and hasattr(fut, "then")):
            raise RuntimeError(f"DistributedDataParallel: the communication hook must return a "
                               f"mpitensor.futures.Future, got {type(fut).__name__}")
        return fut

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
        xp = _backend.array_module(self._params[0]._data)
        state = _JoinState(divide, throw, xp)
        self._join = state
        try:
            yield
            # this rank's inputs are exhausted: shadow the others until all are done
            self._join_wait(state)
        finally:
            self._join = None
            self._divisor = self._world
            self._join_zeros = None

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
        return self._params[0].device

    @property
    def join_process_group(self) -> ProcessGroup:
        """The process group gradients are averaged over."""
        return self.process_group

    def _generic_join_state(self) -> _JoinState:
        if self._join is None:
            self._join = _JoinState(self._join_divide, False,
                                    _backend.array_module(self._params[0]._data))
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
        self._divisor = self._world
        self._join_zeros = None

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
        self._divisor = w if state.divide_by_initial_world_size else len(active)
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
        if self._join_zeros is None:
            self._join_zeros = [_backend.array_module(b.buffer).zeros_like(b.buffer)
                                for b in self._buckets]
        zeros = self._join_zeros
        works = [_HookWork(self, i, z) if self._comm_hook is not None else self._sum_bucket(i, z)
                 for i, z in enumerate(zeros)]
        if self.find_unused_parameters or self.static_graph:
            used = np.zeros(len(self._params), np.int32)
            works.append(dist.all_reduce(used, op=ReduceOp.MAX, group=pg, async_op=True))
        for work in works:
            work.wait()
        for z in zeros:
            z[...] = 0
        self.comm_stats.shadowed += 1

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
        pg = self.process_group
        op = "DistributedDataParallel.verify_in_sync"
        tensors = self._state_tensors()
        meta = [(kind, name, tuple(a.shape), a.dtype.str) for kind, name, a in tensors]
        mine = {"op": op, "error": None, "ddp": op,
                "meta": hashlib.blake2b(repr(meta).encode(), digest_size=8).digest(),
                "hashes": [_fingerprint(a) for _, _, a in tensors]}
        everyone: list = [None] * pg.size_
        dist.all_gather_object(everyone, mine, group=pg)
        self._check_foreign(everyone, op)
        if any(e["meta"] != everyone[0]["meta"] for e in everyone):
            metas: list = [None] * pg.size_
            dist.all_gather_object(metas, meta, group=pg)
            raise self._structure_error(metas)
        differing = [i for i in range(len(tensors))
                     if any(e["hashes"][i] != everyone[0]["hashes"][i] for e in everyone)]
        if not differing:
            return None
        diffs = self._differences(tensors, differing, everyone, float(atol), float(rtol))
        if not diffs:
            return None  # hashes differ, but every difference is within the tolerance
        raise self._divergence_error(diffs, len(tensors), atol, rtol)

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

    def _differences(self, tensors: List[tuple], differing: List[int], everyone: list,
                     atol: float, rtol: float) -> List[dict]:
        """Compare the tensors whose hashes differ with group rank 0's copy, element-wise."""
        pg = self.process_group
        details = []
        for i in differing:
            arr = tensors[i][2]
            xp = _backend.array_module(arr)
            ref = xp.ascontiguousarray(arr) if pg.rank_ == 0 else xp.empty(arr.shape,
                                                                             dtype=arr.dtype)
            dist.broadcast(ref, src=self._src, group=pg)
            details.append(_compare(arr, ref, atol, rtol))
        per_rank: list = [None] * pg.size_
        dist.all_gather_object(per_rank, details, group=pg)
        diffs = []
        for k, i in enumerate(differing):
            kind, name, arr = tensors[i]
            rows = [(pg.ranks[r], per_rank[r][k]) for r in range(pg.size_)
                    if per_rank[r][k][0]]
            if not rows:
                continue
            classes: dict = {}
            for r, e in enumerate(everyone):
                classes.setdefault(e["hashes"][i], []).append(pg.ranks[r])
            diffs.append({
                "kind": kind, "name": name, "shape": tuple(arr.shape), "dtype": arr.dtype.name,
                "ranks": [g for g, _ in rows],
                "max_abs_diff": max(d[1] for _, d in rows),
                "count": sum(d[0] for _, d in rows),
                "detail": {g: {"count": d[0], "max_abs_diff": d[1], "index": d[2],
                               "value": d[3], "reference": d[4]} for g, d in rows},
                "groups": sorted(classes.values()),
            })
        return diffs

    def _state_tensors(self) -> List[tuple]:
        out = [("parameter", n, p._data) for n, p in self.module.named_parameters()]
        out += [("buffer", n, b._data) for n, b in self.module.named_buffers() if b is not None]
        return out

    def _divergence_error(self, diffs: List[dict], n: int, atol: float,
                          rtol: float) -> ReplicaDivergenceError:
        pg = self.process_group
        src = self._src
        lines = []
        for d in diffs[:20]:
            total = int(np.prod(d["shape"])) if d["shape"] else 1
            head = f"  {d['kind']} '{d['name']}' {d['shape']} {d['dtype']}:"
            parts = []
            for g, e in d["detail"].items():
                parts.append(
                    f"rank {g}: {e['count']} of {total} element(s) differ, max |diff| "
                    f"{_fmt(e['max_abs_diff'])} at index {e['index']} ({_fmt(e['value'])} on "
                    f"rank {g}, {_fmt(e['reference'])} on rank {src})")
            lines.append(head + " " + "; ".join(parts))
            groups = d["groups"]
            if len(groups) == 2 and pg.size_ >= 3 and [src] in groups:
                others = next(gr for gr in groups if gr != [src])
                lines.append(f"    (ranks {others} agree with each other: rank {src} is the "
                             "odd one out)")
        if len(diffs) > 20:
            lines.append(f"  ... and {len(diffs) - 20} more")
        ranks = sorted({g for d in diffs for g in d["ranks"]})
        return ReplicaDivergenceError(
            f"rank {dist.get_rank()}: DistributedDataParallel.verify_in_sync: the replicas on "
            f"{pg.name} have drifted apart: {len(diffs)} of {n} tensor(s) differ from rank "
            f"{src}'s (group rank 0) beyond atol={atol:g}, rtol={rtol:g}; ranks that differ: "
            f"{ranks}\n" + "\n".join(lines) +
            "\nReplicas must stay identical: look for an update made on some ranks only (an "
            "optimizer step outside DDP, a parameter changed by hand, a buffer updated with "
            "broadcast_buffers=False, uneven steps without join()). Re-synchronise with "
            "mpitensor.nn.parallel.broadcast_parameters(ddp.module) or restore a checkpoint.",
            differences=diffs, ranks=ranks, reference_rank=src)

    def _structure_error(self, metas: List[list]) -> ReplicaDivergenceError:
        pg = self.process_group
        ref = metas[0]
        lines = []
        for r, m in enumerate(metas):
            if m == ref:
                continue
            g = pg.ranks[r]
            if len(m) != len(ref):
                lines.append(f"  rank {g} has {len(m)} parameters and buffers, rank "
                             f"{pg.ranks[0]} has {len(ref)}")
            for a, b in zip(m, ref):
                if a != b:
                    lines.append(f"  rank {g}: {a[0]} '{a[1]}' {a[2]} {np.dtype(a[3]).name}; "
                                 f"rank {pg.ranks[0]}: {b[0]} '{b[1]}' {b[2]} "
                                 f"{np.dtype(b[3]).name}")
                    break
        ranks = [pg.ranks[r] for r, m in enumerate(metas) if m != ref]
        return ReplicaDivergenceError(
            f"rank {dist.get_rank()}: DistributedDataParallel.verify_in_sync: the replicas on "
            f"{pg.name} differ in structure (names, shapes or dtypes of their parameters and "
            "buffers):\n" + "\n".join(lines) +
            "\nEvery rank must hold the same model; rebuild it the same way on every rank.",
            differences=[], ranks=ranks, reference_rank=pg.ranks[0])

    def _check_foreign(self, everyone: List[Any], op: str) -> None:
        """Raise where some rank entered another collective instead of this DDP check."""
        pg = self.process_group
        bad = [(pg.ranks[r], e) for r, e in enumerate(everyone)
               if not (isinstance(e, dict) and e.get("ddp") == op)]
        if not bad:
            return
        lines = []
        for r, e in enumerate(everyone):
            what = e.get("op") if isinstance(e, dict) else type(e).__name__
            seq = e.get("seq") if isinstance(e, dict) else None
            lines.append(f"  rank {pg.ranks[r]}: {what}" + (f" (#{seq})" if seq else ""))
        raise CollectiveMismatchError(
            f"rank {dist.get_rank()}: {op} on {pg.name}: the ranks are in different "
            "collectives:\n" + "\n".join(lines) +
            "\nEvery rank must make the same calls in the same order (the same DDP forwards "
            "and backwards, the same checks).")

    def _check_layout(self, when: str) -> None:
        """Check that every rank has the same bucket layout (and, at construction, parameters).

        Raises ``CollectiveMismatchError`` on every rank, listing each rank's layout.
        """
        pg = self.process_group
        op = f"DistributedDataParallel {when} check"
        mine: dict = {"op": op, "error": None, "ddp": op, "buckets": self._layout}
        if when == "construction":
            mine["params"] = [(tuple(p._data.shape), p._data.dtype.name) for p in self._params]
            mine["names"] = self._names
        everyone: list = [None] * pg.size_
        dist.all_gather_object(everyone, mine, group=pg)
        self._check_foreign(everyone, op)
        ref = everyone[0]
        if all(e["buckets"] == ref["buckets"] and e.get("params") == ref.get("params")
               for e in everyone):
            return
        r0 = pg.ranks[0]
        detail = ""
        for r, e in enumerate(everyone):
            if e["buckets"] == ref["buckets"] and e.get("params") == ref.get("params"):
                continue
            g = pg.ranks[r]
            mp, rp = e.get("params"), ref.get("params")
            if mp is not None and mp != rp:
                if len(mp) != len(rp):
                    detail = (f"rank {g} has {len(mp)} parameters that require grad, rank {r0} "
                              f"has {len(rp)}")
                else:
                    i = next(k for k in range(len(rp)) if mp[k] != rp[k])
                    detail = (f"parameter {i} ({e['names'][i]}) is {mp[i][0]} {mp[i][1]} on "
                              f"rank {g} but {rp[i][0]} {rp[i][1]} on rank {r0}")
            else:
                mb, rb = e["buckets"], ref["buckets"]
                if len(mb) != len(rb):
                    detail = f"rank {g} has {len(mb)} buckets, rank {r0} has {len(rb)}"
                else:
                    i = next(k for k in range(len(rb)) if mb[k] != rb[k])
                    detail = (f"bucket {i} holds {mb[i][0]} {mb[i][1]} elements on rank {g} but "
                              f"{rb[i][0]} {rb[i][1]} on rank {r0}")
            break
        lines = [f"  rank {pg.ranks[r]}: {_describe_layout(e['buckets'])}"
                 for r, e in enumerate(everyone)]
        raise CollectiveMismatchError(
            f"rank {dist.get_rank()}: DistributedDataParallel ({when} check) on {pg.name}: the "
            f"replicas' gradient buckets differ across ranks ({detail}):\n" + "\n".join(lines) +
            "\nBuild the same model (same parameters, shapes and dtypes, in the same order) "
            "with the same bucket_cap_mb on every rank, and run forward/backward through the "
            "same DDP on every rank in the same order.")

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
        if self._in_backward:
            self._recover()
        grad_on = _autograd.is_grad_enabled()
        if grad_on and self._unused_error is not None:
            self._raise_unused()
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
            self._expect_hooks = True
            self._prepare_for_backward(out)
        return out

    def _sync_buffers(self, src: int) -> None:
        """Broadcast the module's buffers from group member ``src`` (a global rank)."""
        bufs = [b._data for b in self.module.buffers() if b is not None]
        if bufs:
            coalesced_broadcast(bufs, self.process_group, src)

    def _raise_unused(self) -> None:
        """Raise the error the previous backward left for the next forward, on this rank.

        Raised through the group's guarded path: the other ranks hear of it, and those that did
        not raise the same error in the same call (a parameter unused on some ranks only) get
        PeerFailedError in their next call instead of waiting for this rank.
        """
        err, self._unused_error = self._unused_error, None

        def fail() -> None:
            raise err

        self.process_group.call_guarded("DistributedDataParallel.forward", fail)

    # ---------------------------------------------------------------- the reducer
    def _prepare_for_backward(self, out: Any) -> None:
        tensors: list = []
        _collect_tensors(out, tensors)
        roots = [t.grad_fn for t in tensors if t.grad_fn is not None]
        ref = weakref.ref(self)

        def start(grad: Any) -> None:  # the first node of backward: the reduction begins
            me = ref()
            if me is not None and me._expect_hooks and not me._in_backward:
                me._begin_backward()

        for node in roots:
            node.register_prehook(start)
        if self.find_unused_parameters and not (self.static_graph and
                                                self._static_unused is not None):
            self._forward_unused = self._find_unused(roots)

    def _find_unused(self, roots: List[Node]) -> List[int]:
        seen_nodes = set()
        leaves = set()
        stack = list(roots)
        while stack:
            n = stack.pop()
            if n in seen_nodes:
                continue
            seen_nodes.add(n)
            for nxt in n._next:
                if nxt is None:
                    continue
                if type(nxt) is Node:
                    stack.append(nxt)
                else:
                    leaves.add(id(nxt))
        return [i for i, p in enumerate(self._params) if id(p) not in leaves]

    def _begin_backward(self) -> None:
        self._in_backward = True
        self.comm_stats.launched = 0
        _autograd.queue_callback(self._finalize, self._interrupted)
        unused = self._forward_unused
        if self.static_graph and self._static_unused is not None:
            unused = self._static_unused
        if unused:
            for i in unused:
                self._mark_ready(i, self._params[i], from_hook=False)

    def _on_grad(self, i: int, p: Tensor) -> None:
        self._used[i] = True
        if not self._expect_hooks:
            return  # inside no_sync, or a backward through a graph not made by our forward
        if not self._in_backward:
            self._begin_backward()
        elif self._inflight:
            self._poke()
        self._mark_ready(i, p, from_hook=True)

    def _poke(self) -> None:
        # MPI has no progress thread: a non-blocking collective advances only inside MPI calls.
        # One MPI_Test per gradient keeps launched all-reduces moving while backward computes
        # (a test progresses every pending operation, so testing the oldest one is enough).
        inflight = self._inflight
        while inflight and inflight[0].is_completed():
            inflight.pop(0)

    def _mark_ready(self, i: int, p: Tensor, from_hook: bool) -> None:
        b, k = self._where[i]
        bucket = self._buckets[b]
        if self._ready[i]:
            if bucket.work is None and from_hook:  # not launched yet: take the newer value
                self._fill(bucket, k, p)
                return
            raise RuntimeError(
                f"Expected to mark a variable ready only once. Parameter {i} "
                f"({self._names[i]}) got its gradient after its bucket's all-reduce was launched "
                "(it was taken as unused, or used twice in one backward); if it is used outside "
                "the module's forward, pass static_graph=False and find_unused_parameters=False, "
                "or make every use go through the forward")
        self._ready[i] = True
        self._fill(bucket, k, p)
        bucket.pending -= 1
        if bucket.pending == 0 and self.overlap:
            self._launch_ready()

    def _fill(self, bucket: _Bucket, k: int, p: Tensor) -> None:
        view = bucket.views[k]
        g = p.grad
        if g is None:
            view[...] = 0
            return
        if g._data is view:
            return  # the gradient already lives in the bucket
        view[...] = g._data
        if self.gradient_as_bucket_view:
            g._data = view

    def _launch_ready(self) -> None:
        buckets = self._buckets
        n = len(buckets)
        while self._next_launch < n and buckets[self._next_launch].pending == 0:
            self._launch(buckets[self._next_launch])
            self._next_launch += 1

    def _launch(self, bucket: _Bucket) -> None:
        if self._comm_hook is not None:
            bucket.work = _HookWork(self, bucket.index, bucket.buffer)
        else:
            if self._divisor != 1:
                bucket.buffer /= self._divisor  # pre-divide, as torch's default hook
            bucket.work = self._sum_bucket(bucket.index, bucket.buffer)
        self._inflight.append(bucket.work)
        self.comm_stats.launched += 1

    def _sum_bucket(self, index: int, buffer: Any) -> Any:
        """Start summing bucket ``index`` (held in ``buffer``) over the ranks; its Work. Through
        shared memory where the ranks outnumber the cores (``_node``), else MPI; join()'s
        shadow steps come here too, so that every rank takes the same path."""
        if self._node is not None:
            return self._node.start(index, buffer)
        return dist.all_reduce(buffer, op=ReduceOp.SUM, group=self.process_group, async_op=True)

    def _finalize(self) -> None:
        t0 = time.perf_counter()
        stats = self.comm_stats
        overlapped = stats.launched
        missing = [i for i, r in enumerate(self._ready) if not r]
        learning = self.static_graph and self._static_unused is None
        if learning:  # the first iteration of a static graph: what got no gradient here
            self._static_unused = [i for i, u in enumerate(self._used) if not u]
        tolerate = self.find_unused_parameters or learning
        for i in missing:
            self._mark_ready(i, self._params[i], from_hook=False)
        # every bucket is complete now: launch what is left, in order, on every rank
        self._launch_ready()
        used_work = used = None
        if self.find_unused_parameters or self.static_graph:
            # every rank makes this call, whether or not it has unused parameters
            used = np.fromiter(self._used, dtype=np.int32, count=len(self._used))
            used_work = dist.all_reduce(used, op=ReduceOp.MAX, group=self.process_group,
                                        async_op=True)
        for bucket in self._buckets:
            bucket.work.wait()
        if used_work is not None:
            used_work.wait()
        t1 = time.perf_counter()
        untouched = missing if missing and not tolerate else ()
        self._write_back(used, untouched)
        self._reset()
        stats.steps += 1
        stats.overlapped = overlapped
        stats.last_wait_s = t1 - t0
        stats.total_wait_s += t1 - t0
        stats.last_backward_end_s = t0
        if missing and not tolerate:
            # as torch, the next forward with gradients enabled raises: backward itself returns
            self._unused_error = RuntimeError(_UNUSED_MSG.format(
                rank=dist.get_rank(), count=len(missing),
                names=", ".join(f"{self._names[i]} (index {i})" for i in missing)))

    def _write_back(self, used: Any, untouched: Sequence[int] = ()) -> None:
        params = self._params
        view_mode = self.gradient_as_bucket_view
        skip = set(untouched)
        for bucket in self._buckets:
            for k, i in enumerate(bucket.params):
                if used is not None and not used[i]:
                    continue  # unused on every rank: leave the gradient alone, as torch
                if i in skip:
                    continue  # no gradient here, and the next forward raises: as torch
                p = params[i]
                view = bucket.views[k]
                g = p.grad
                if g is None:
                    p.grad = _new(view if view_mode else view.copy())
                elif g._data is not view:
                    if view_mode:
                        g._data = view
                    else:
                        g._data[...] = view

    def _reset(self) -> None:
        """Start a backward pass afresh: no parameter ready or used, no bucket launched."""
        n = len(self._params)
        self._ready = [False] * n
        self._used = [False] * n
        for bucket in self._buckets:
            bucket.pending = len(bucket.params)
            bucket.work = None
        self._next_launch = 0
        self._inflight = []
        self._in_backward = False
        self._expect_hooks = False
        self._forward_unused = []

    def _interrupted(self, exc: BaseException) -> None:
        """An exception ended this rank's backward before its gradient all-reduces were all
        launched. The other ranks' all-reduces would match this rank's *next* ones (another
        step's gradients, or another call): with more than one rank the process group is
        marked unusable and the others are told, so every rank raises PeerFailedError
        instead of training on with replicas that silently differ (issue 11 §4)."""
        if self._world <= 1:
            return  # nobody to diverge from: the next forward recovers (_recover)
        launched = sum(b.work is not None for b in self._buckets)
        reason = (f"{type(exc).__name__} interrupted its DistributedDataParallel backward "
                  f"after {launched} of {len(self._buckets)} gradient all-reduces; the "
                  f"replicas can no longer be kept equal")
        self.process_group.mark_unusable("DistributedDataParallel backward", reason)
        exc.add_note(f"{self.process_group.name} is unusable from here on: {reason} (every "
                     "rank's next call on it raises PeerFailedError)")

    def _recover(self) -> None:
        """A previous backward stopped half-way (an exception): finish its traffic, start over
        (one rank), or raise the group's PeerFailedError (several: see ``_interrupted``)."""
        self.process_group.check_usable("DistributedDataParallel.forward")
        logger.warning("DistributedDataParallel: the previous backward did not finish (an error "
                       "interrupted it); waiting for its launched all-reduces and starting over")
        for bucket in self._buckets:
            if bucket.work is not None:
                bucket.work.wait()
        self._reset()

    def extra_repr(self) -> str:
        return (f"buckets={len(self._buckets)}, bucket_cap_mb={self.bucket_bytes_cap / _MB:g}, "
                f"world_size={self._world}")


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


class _HookWork:
    """A bucket's communication-hook call, as a work handle: ``wait()`` waits for the hook's
    future and writes its value into the bucket."""

    __slots__ = ("future", "buffer", "index")

    def __init__(self, ddp: DistributedDataParallel, index: int, buffer: Any) -> None:
        self.index = index
        self.buffer = buffer
        self.future = ddp._run_comm_hook(index, buffer)

    def is_completed(self) -> bool:
        """Advance the hook's collective (see ``_poke``); False: only ``wait`` completes it,
        so that hooks' callbacks run in bucket order on every rank."""
        progress(self.future)
        return False

    def wait(self) -> bool:
        value = self.future.wait()
        if isinstance(value, (list, tuple)) and len(value) == 1:
            value = value[0]
        if not isinstance(value, Tensor):
            raise RuntimeError(f"DistributedDataParallel: the communication hook's future must "
                               f"hold a tensor, got {type(value).__name__}")
        arr = value._data
        if arr.size != self.buffer.size:
            raise RuntimeError(
                f"DistributedDataParallel: the communication hook returned {arr.size} elements "
                f"for bucket {self.index}, which holds {self.buffer.size}")
        if arr is not self.buffer:
            self.buffer[...] = arr.reshape(-1)
        return True


def _make_hook(ref: "weakref.ReferenceType[DistributedDataParallel]", i: int) -> Any:
    def hook(p: Tensor) -> None:
        ddp = ref()
        if ddp is not None:
            ddp._on_grad(i, p)

    return hook

