"""DDP's ``Reducer``: the gradient buckets and the all-reduces that average them.

:class:`~mpitensor.nn.parallel.DistributedDataParallel` is the module a user sees: its options,
its forward, ``no_sync``, ``join`` and the replica checks. Everything that happens to gradients
during backward lives here, as torch keeps it in its ``Reducer``:

- **bucketing**: the parameters that require grad are laid out, in reverse registration order,
  in flat buffers of at most ``bucket_cap_mb`` (the first one capped at 1 MiB);
- **readiness**: a post-accumulate-grad hook per parameter copies its gradient into its slot
  and counts down its bucket;
- **launching**: a full bucket is divided by the world size and its non-blocking all-reduce
  (or the registered communication hook) starts at once, strictly in bucket order on every rank;
- **finishing**: a callback at the end of backward launches the rest, waits, and writes the
  averaged gradients back into ``param.grad``;
- **unused parameters**: those that get no gradient count as zeros (``find_unused_parameters``,
  ``static_graph``), or leave an error for the next forward.

The Reducer holds no reference to its module: the hooks reach it through a weak reference.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import distributed as dist
from mpitensor._core.opkit import wrap
from mpitensor.autograd.function import graph_leaves
from mpitensor.distributed import ProcessGroup, ReduceOp
from mpitensor.distributed._grad_bucket import GradBucket
from mpitensor.distributed._work_future import progress
from mpitensor.distributed.backends.mpi.node_reduce import NodeReduce
from mpitensor.distributed.model_sync import device_key
from mpitensor.tensor import Tensor

from ._outputs import collect_tensors

__all__ = ["Reducer", "CommStats", "DEFAULT_FIRST_BUCKET_BYTES"]

logger = logging.getLogger("mpitensor.nn.parallel")

#: torch caps the first bucket at 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``) so that the first
#: all-reduce starts as early as possible in backward; mpitensor does the same.
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024

_UNUSED_MSG = (
    "rank {rank}: DistributedDataParallel: the previous backward pass gave no gradient to "
    "{count} parameter(s) that require one: {names}. Their buckets were "
    "all-reduced with zeros in their place, so that no rank waited for the others. DDP without "
    "find_unused_parameters=True expects every parameter to take part in the loss of every "
    "synchronised step. Pass find_unused_parameters=True (or static_graph=True when the same "
    "parameters go unused at every step), or make every parameter, and every output of "
    "forward, contribute to the loss"
)


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
        self.params = params  # indices into Reducer.params
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


class Reducer:
    """The gradient buckets of one DDP model and the all-reduces that average them.

    Args:
        params: the parameters to synchronise (those that require grad), in registration order.
        names: their names in the module, for error messages.
        process_group: the group to average over.
        cap_bytes: the bucket cap in bytes (the first bucket is capped at
            ``min(1 MiB, cap_bytes)``).
        find_unused_parameters, static_graph, gradient_as_bucket_view, overlap: DDP's options
            of those names (see :class:`DistributedDataParallel`).

    Attributes:
        buckets: the :class:`_Bucket` list, in launch order.
        layout: ``(elements, dtype name)`` per bucket (what the ranks compare).
        stats: the :class:`CommStats` (DDP's ``comm_stats``).
        divisor: what each bucket is divided by before its all-reduce (``join`` changes it).
        comm_hook, comm_state: the registered communication hook and its state, or None.
        node: the shared-memory reduction of the buckets (``connect``), or None.
        static_unused: with ``static_graph``, the parameters the first backward left unused.
        unused_error: the error a backward that left parameters without gradient leaves for
            the next forward, or None.
        in_backward: a synchronised backward has started and not finished.
        join_zeros: zero buckets for ``join``'s shadow steps (made on first use).
    """

    def __init__(self, params: List[Tensor], names: List[str], process_group: ProcessGroup,
                 cap_bytes: int, *, find_unused_parameters: bool, static_graph: bool,
                 gradient_as_bucket_view: bool, overlap: bool) -> None:
        self.params = params
        self.names = names
        self.process_group = process_group
        self.world = process_group.size_
        self.find_unused_parameters = find_unused_parameters
        self.static_graph = static_graph
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.overlap = overlap
        self.divisor = self.world
        self.comm_hook: Optional[Callable[[Any, GradBucket], Any]] = None
        self.comm_state: Any = None
        self.static_unused: Optional[List[int]] = None
        self.unused_error: Optional[RuntimeError] = None
        self.join_zeros: Optional[List[Any]] = None
        self.node: Optional[NodeReduce] = None
        self._build_buckets(cap_bytes, min(DEFAULT_FIRST_BUCKET_BYTES, cap_bytes))
        self.layout = [(int(b.buffer.size), b.buffer.dtype.name) for b in self.buckets]
        self.stats = CommStats([b.nbytes for b in self.buckets])
        self._hook_handles: list = []
        self.reset()

    # ---------------------------------------------------------------- construction
    def _build_buckets(self, cap_bytes: int, first_cap: int) -> None:
        order = [(i, p._data.nbytes, (p._data.dtype, device_key(p._data)))
                 for i, p in reversed(list(enumerate(self.params)))]
        groups = _bucket_assignment(order, cap_bytes, first_cap)
        self.buckets: List[_Bucket] = []
        self._where: List[tuple] = [None] * len(self.params)  # type: ignore[list-item]
        for b, idx in enumerate(groups):
            proto = self.params[idx[0]]._data
            xp = _backend.array_module(proto)
            total = sum(self.params[i]._data.size for i in idx)
            buf = xp.zeros_like(proto, shape=(total,), order="C")
            views, off = [], 0
            for k, i in enumerate(idx):
                a = self.params[i]._data
                views.append(buf[off:off + a.size].reshape(a.shape))
                off += a.size
                self._where[i] = (b, k)
            self.buckets.append(_Bucket(b, idx, buf, views))

    def connect(self) -> None:
        """Sum the buckets in shared memory where the ranks outnumber the node's cores
        (collective: agreed by every rank of an MPI group, or by none)."""
        if self.world > 1 and getattr(self.process_group, "backend_name", None) == "mpi":
            self.node = NodeReduce.create(self.process_group, [b.buffer for b in self.buckets])

    def install_hooks(self) -> None:
        """A post-accumulate hook per parameter marks it ready (and may launch its bucket)."""
        ref = weakref.ref(self)
        self._hook_handles = [p.register_post_accumulate_grad_hook(_make_hook(ref, i))
                              for i, p in enumerate(self.params)]

    # ---------------------------------------------------------------- forward's side
    def prepare_for_backward(self, out: Any) -> None:
        """A synchronising forward produced ``out``: the next backward through it reduces."""
        self._expect_hooks = True
        tensors: list = []
        collect_tensors(out, tensors)
        roots = [t.grad_fn for t in tensors if t.grad_fn is not None]
        ref = weakref.ref(self)

        def start(grad: Any) -> None:  # the first node of backward: the reduction begins
            me = ref()
            if me is not None and me._expect_hooks and not me.in_backward:
                me._begin_backward()

        for node in roots:
            node.register_prehook(start)
        if self.find_unused_parameters and not (self.static_graph and
                                                self.static_unused is not None):
            leaves = graph_leaves(roots)
            self._forward_unused = [i for i, p in enumerate(self.params) if id(p) not in leaves]

    def raise_unused(self) -> None:
        """Raise the error the previous backward left for the next forward, on this rank.

        Raised through the group's guarded path: the other ranks hear of it, and those that did
        not raise the same error in the same call (a parameter unused on some ranks only) get
        PeerFailedError in their next call instead of waiting for this rank.
        """
        err, self.unused_error = self.unused_error, None

        def fail() -> None:
            raise err

        self.process_group.call_guarded("DistributedDataParallel.forward", fail)

    # ---------------------------------------------------------------- during backward
    def _begin_backward(self) -> None:
        self.in_backward = True
        self.stats.launched = 0
        _autograd.queue_callback(self._finalize, self._interrupted)
        unused = self._forward_unused
        if self.static_graph and self.static_unused is not None:
            unused = self.static_unused
        if unused:
            for i in unused:
                self._mark_ready(i, self.params[i], from_hook=False)

    def _on_grad(self, i: int, p: Tensor) -> None:
        self._used[i] = True
        if not self._expect_hooks:
            return  # inside no_sync, or a backward through a graph not made by our forward
        if not self.in_backward:
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
        bucket = self.buckets[b]
        if self._ready[i]:
            if bucket.work is None and from_hook:  # not launched yet: take the newer value
                self._fill(bucket, k, p)
                return
            raise RuntimeError(
                f"Expected to mark a variable ready only once. Parameter {i} "
                f"({self.names[i]}) got its gradient after its bucket's all-reduce was launched "
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
        buckets = self.buckets
        n = len(buckets)
        while self._next_launch < n and buckets[self._next_launch].pending == 0:
            self._launch(buckets[self._next_launch])
            self._next_launch += 1

    def _launch(self, bucket: _Bucket) -> None:
        if self.comm_hook is not None:
            bucket.work = _HookWork(self, bucket.index, bucket.buffer)
        else:
            if self.divisor != 1:
                bucket.buffer /= self.divisor  # pre-divide, as torch's default hook
            bucket.work = self._sum_bucket(bucket.index, bucket.buffer)
        self._inflight.append(bucket.work)
        self.stats.launched += 1

    def _sum_bucket(self, index: int, buffer: Any) -> Any:
        """Start summing bucket ``index`` (held in ``buffer``) over the ranks; its Work. Through
        shared memory where the ranks outnumber the cores (``node``), else MPI; join()'s
        shadow steps come here too, so that every rank takes the same path."""
        if self.node is not None:
            return self.node.start(index, buffer)
        return dist.all_reduce(buffer, op=ReduceOp.SUM, group=self.process_group, async_op=True)

    def run_comm_hook(self, index: int, buffer: Any) -> Any:
        """Call the hook on bucket ``index`` (its data in ``buffer``); the future it returns."""
        b = self.buckets[index]
        grad_bucket = GradBucket(index, buffer, [v.shape for v in b.views],
                                 [self.params[i] for i in b.params],
                                 index == len(self.buckets) - 1)
        fut = self.comm_hook(self.comm_state, grad_bucket)  # type: ignore[misc]
        if not (hasattr(fut, "wait") and hasattr(fut, "then")):
            raise RuntimeError(f"DistributedDataParallel: the communication hook must return a "
                               f"mpitensor.futures.Future, got {type(fut).__name__}")
        return fut

    # ---------------------------------------------------------------- when backward ends
    def _finalize(self) -> None:
        t0 = time.perf_counter()
        stats = self.stats
        overlapped = stats.launched
        missing = [i for i, r in enumerate(self._ready) if not r]
        learning = self.static_graph and self.static_unused is None
        if learning:  # the first iteration of a static graph: what got no gradient here
            self.static_unused = [i for i, u in enumerate(self._used) if not u]
        tolerate = self.find_unused_parameters or learning
        for i in missing:
            self._mark_ready(i, self.params[i], from_hook=False)
        # every bucket is complete now: launch what is left, in order, on every rank
        self._launch_ready()
        used_work = used = None
        if self.find_unused_parameters or self.static_graph:
            # every rank makes this call, whether or not it has unused parameters
            used = np.fromiter(self._used, dtype=np.int32, count=len(self._used))
            used_work = dist.all_reduce(used, op=ReduceOp.MAX, group=self.process_group,
                                        async_op=True)
        for bucket in self.buckets:
            bucket.work.wait()
        if used_work is not None:
            used_work.wait()
        t1 = time.perf_counter()
        untouched = missing if missing and not tolerate else ()
        self._write_back(used, untouched)
        self.reset()
        stats.steps += 1
        stats.overlapped = overlapped
        stats.last_wait_s = t1 - t0
        stats.total_wait_s += t1 - t0
        stats.last_backward_end_s = t0
        if missing and not tolerate:
            # as torch, the next forward with gradients enabled raises: backward itself returns
            self.unused_error = RuntimeError(_UNUSED_MSG.format(
                rank=dist.get_rank(), count=len(missing),
                names=", ".join(f"{self.names[i]} (index {i})" for i in missing)))

    def _write_back(self, used: Any, untouched: Sequence[int] = ()) -> None:
        params = self.params
        view_mode = self.gradient_as_bucket_view
        skip = set(untouched)
        for bucket in self.buckets:
            for k, i in enumerate(bucket.params):
                if used is not None and not used[i]:
                    continue  # unused on every rank: leave the gradient alone, as torch
                if i in skip:
                    continue  # no gradient here, and the next forward raises: as torch
                p = params[i]
                view = bucket.views[k]
                g = p.grad
                if g is None:
                    p.grad = wrap(view if view_mode else view.copy())
                elif g._data is not view:
                    if view_mode:
                        g._data = view
                    else:
                        g._data[...] = view

    def reset(self) -> None:
        """Start a backward pass afresh: no parameter ready or used, no bucket launched."""
        n = len(self.params)
        self._ready = [False] * n
        self._used = [False] * n
        for bucket in self.buckets:
            bucket.pending = len(bucket.params)
            bucket.work = None
        self._next_launch = 0
        self._inflight: list = []
        self.in_backward = False
        self._expect_hooks = False
        self._forward_unused: List[int] = []

    # ---------------------------------------------------------------- interrupted backward
    def _interrupted(self, exc: BaseException) -> None:
        """An exception ended this rank's backward before its gradient all-reduces were all
        launched. The other ranks' all-reduces would match this rank's *next* ones (another
        step's gradients, or another call): with more than one rank the process group is
        marked unusable and the others are told, so every rank raises PeerFailedError
        instead of training on with replicas that silently differ (issue 11 §4)."""
        if self.world <= 1:
            return  # nobody to diverge from: the next forward recovers (recover)
        launched = sum(b.work is not None for b in self.buckets)
        reason = (f"{type(exc).__name__} interrupted its DistributedDataParallel backward "
                  f"after {launched} of {len(self.buckets)} gradient all-reduces; the "
                  f"replicas can no longer be kept equal")
        self.process_group.mark_unusable("DistributedDataParallel backward", reason)
        exc.add_note(f"{self.process_group.name} is unusable from here on: {reason} (every "
                     "rank's next call on it raises PeerFailedError)")

    def recover(self) -> None:
        """A previous backward stopped half-way (an exception): finish its traffic, start over
        (one rank), or raise the group's PeerFailedError (several: see ``_interrupted``)."""
        self.process_group.check_usable("DistributedDataParallel.forward")
        logger.warning("DistributedDataParallel: the previous backward did not finish (an error "
                       "interrupted it); waiting for its launched all-reduces and starting over")
        for bucket in self.buckets:
            if bucket.work is not None:
                bucket.work.wait()
        self.reset()

    # ---------------------------------------------------------------- join's shadow steps
    def reduce_zeros(self) -> None:
        """Match the active ranks' gradient all-reduces of one step with zero buckets (and the
        unused-parameter all-reduce where they make one): a joined rank's shadow backward."""
        if self.join_zeros is None:
            self.join_zeros = [_backend.array_module(b.buffer).zeros_like(b.buffer)
                               for b in self.buckets]
        zeros = self.join_zeros
        works = [_HookWork(self, i, z) if self.comm_hook is not None else self._sum_bucket(i, z)
                 for i, z in enumerate(zeros)]
        if self.find_unused_parameters or self.static_graph:
            used = np.zeros(len(self.params), np.int32)
            works.append(dist.all_reduce(used, op=ReduceOp.MAX, group=self.process_group,
                                         async_op=True))
        for work in works:
            work.wait()
        for z in zeros:
            z[...] = 0
        self.stats.shadowed += 1

    def end_join(self) -> None:
        """Leave ``join``: divide by the whole group again, drop the zero buckets."""
        self.divisor = self.world
        self.join_zeros = None


class _HookWork:
    """A bucket's communication-hook call, as a work handle: ``wait()`` waits for the hook's
    future and writes its value into the bucket."""

    __slots__ = ("future", "buffer", "index")

    def __init__(self, reducer: Reducer, index: int, buffer: Any) -> None:
        self.index = index
        self.buffer = buffer
        self.future = reducer.run_comm_hook(index, buffer)

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


def _make_hook(ref: "weakref.ReferenceType[Reducer]", i: int) -> Any:
    def hook(p: Tensor) -> None:
        reducer = ref()
        if reducer is not None:
            reducer._on_grad(i, p)

    return hook
