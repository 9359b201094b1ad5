"""``ZeroRedundancyOptimizer``: optimizer state sharded across the ranks (ZeRO stage 1).

Every rank keeps the whole model and all its gradients, but only the optimizer state of its
own *partition* of the parameters: the parameters of each group, largest first, are given one
by one to the rank holding the fewest elements so far (ties to the lowest rank), as torch does.
``step()`` runs the wrapped optimizer on the local partition only, then the updated parameters
travel in buckets, one collective per bucket (never one per tensor):

* ``parameters_as_bucket_view=False`` (default): each rank's updated parameters of one dtype are
  packed into one flat buffer and broadcast from that rank (one broadcast per rank and dtype,
  into a buffer reused from rank to rank, so the extra memory is one rank's share);
* ``parameters_as_bucket_view=True``: the parameters *are* views into one flat buffer per dtype,
  laid out rank by rank (each rank's segment padded to the longest), and one
  ``all_gather_into_tensor`` per dtype refreshes them all in place, with no copy out.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from mpitensor.autograd import no_grad
from mpitensor.optim import Optimizer
from mpitensor.tensor import Tensor

from ..algorithms.join import Join, Joinable, JoinHook
from ._agreement import check_same_everywhere

__all__ = ["ZeroRedundancyOptimizer"]

_HYPER_SKIP = ("params",)


def _dist() -> Any:
    import mpitensor.distributed as dist

    return dist


def partition_sizes(numels_per_group: List[List[int]], world: int) -> List[List[List[int]]]:
    """Greedy size-balanced assignment: for each group, the parameter indices (into that group)
    each rank owns, in the order they were assigned (largest first, stable among equals).

    The running totals carry over from one group to the next, so adding a group never moves
    the parameters of the earlier ones.

    Example:
        >>> partition_sizes([[4, 10, 3, 3]], 2)
        [[[1], [0, 2, 3]]]
    """
    totals = [0] * world
    out: List[List[List[int]]] = []
    for numels in numels_per_group:
        owned: List[List[int]] = [[] for _ in range(world)]
        for i in sorted(range(len(numels)), key=lambda k: numels[k], reverse=True):
            r = totals.index(min(totals))
            owned[r].append(i)
            totals[r] += numels[i]
        out.append(owned)
    return out


class _ZeroJoinHook(JoinHook):
    """A rank out of inputs still takes part in every step's parameter exchange."""

    def __init__(self, zero: "ZeroRedundancyOptimizer") -> None:
        self.zero = zero

    def main_hook(self) -> None:
        self.zero._shadowing = True
        try:
            self.zero.step()
        finally:
            self.zero._shadowing = False


class _Bucket:
    """The parameters of one dtype, grouped by owning rank, with their flat buffers."""

    def __init__(self, per_rank: List[List[Any]], rank: int, as_view: bool) -> None:
        self.per_rank = per_rank
        self.sizes = [sum(p.numel() for p in ps) for ps in per_rank]
        self.seg = max(self.sizes)
        self.rank = rank
        self.as_view = as_view
        ref = next(p for ps in per_rank for p in ps)
        if as_view:
            self.flat = ref.new_zeros(self.seg * len(per_rank))
            with no_grad():
                for r, ps in enumerate(per_rank):
                    off = r * self.seg
                    for p in ps:
                        view = self.flat[off:off + p.numel()].view(p.shape)
                        view.copy_(p.detach())
                        p.data = view
                        off += p.numel()
            self.send = ref.new_empty(self.seg)
        else:
            self.flat = ref.new_empty(self.seg)

    def nbytes(self) -> int:
        """Bytes of the flat buffers this bucket holds beyond the parameters themselves."""
        extra = self.send if self.as_view else self.flat
        return extra.numel() * extra.element_size()

    def _pack(self, r: int, into: Any) -> None:
        off = 0
        for p in self.per_rank[r]:
            into[off:off + p.numel()].copy_(p.detach().reshape(-1))
            off += p.numel()

    def _unpack(self, r: int) -> None:
        off = 0
        for p in self.per_rank[r]:
            p.detach().copy_(self.flat[off:off + p.numel()].view(p.shape))
            off += p.numel()

    def sync(self, group: Any) -> None:
        dist = _dist()
        with no_grad():
            if self.as_view:
                start = self.rank * self.seg
                self.send.copy_(self.flat[start:start + self.seg])
                dist.all_gather_into_tensor(self.flat, self.send, group=group)
                return
            for r, ps in enumerate(self.per_rank):
                if not ps:
                    continue
                size = self.sizes[r]
                if r == self.rank:
                    self._pack(r, self.flat)
                dist.broadcast(self.flat[:size], src=dist.get_global_rank(group, r),
                               group=group)
                if r != self.rank:
                    self._unpack(r)


class ZeroRedundancyOptimizer(Optimizer, Joinable):
    """Wrap ``optimizer_class`` so that each rank keeps the state of its share of the parameters.

    Args:
        params: the parameters (Tensors) or parameter groups (dicts), the same on every rank.
        optimizer_class: an :class:`mpitensor.optim.Optimizer` subclass (``Adam``, ``SGD``...).
        process_group: the group that shares the state (default: the world).
        parameters_as_bucket_view: make the parameters views into one flat buffer per dtype,
            so the exchange after a step writes them in place (see the module doc).
        overlap_with_ddp: torch overlaps the step with DDP's backward through a DDP
            communication hook; not available here (raises ``NotImplementedError``).
        **defaults: the hyper-parameters passed to ``optimizer_class`` (``lr=...``).

    Raises:
        TypeError: ``optimizer_class`` is not an Optimizer subclass.
        NotImplementedError: ``overlap_with_ddp=True``.
        ValueError: the parameters differ across ranks (count, shapes or dtypes); raised on
            every rank, before the first exchange.

    Example:
        >>> opt = ZeroRedundancyOptimizer(model.parameters(), optim.Adam, lr=1e-3)
        >>> loss.backward(); opt.step()            # each rank updates its share, then shares it
        >>> opt.consolidate_state_dict(to=0)       # every rank calls it
        >>> if dist.get_rank() == 0: torch.save(opt.state_dict(), "opt.pt")
    """

    def __init__(self, params: Any, optimizer_class: type,
                 process_group: Any = None, parameters_as_bucket_view: bool = False,
                 overlap_with_ddp: bool = False, **defaults: Any) -> None:
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)):
            raise TypeError(f"ZeroRedundancyOptimizer: optimizer_class must be an "
                            f"mpitensor.optim.Optimizer subclass (e.g. optim.Adam), got "
                            f"{optimizer_class!r}")
        if overlap_with_ddp:
            raise NotImplementedError(
                "ZeroRedundancyOptimizer(overlap_with_ddp=True) needs DDP's "
                "hook_with_zero_step communication hooks, which mpitensor does not have; "
                "construct it with overlap_with_ddp=False and call step() after backward()")
        self._ready = False
        self._shadowing = False
        Optimizer.__init__(self, params, dict(defaults))
        Joinable.__init__(self)
        dist = _dist()
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.world_size = dist.get_world_size(self.process_group)
        self.rank = dist.get_rank(self.process_group)
        self.global_rank = dist.get_global_rank(self.process_group, self.rank)
        self.optimizer_class = optimizer_class
        self.parameters_as_bucket_view = bool(parameters_as_bucket_view)
        self._defaults = dict(defaults)
        self._all_params = [p for g in self.param_groups for p in g["params"]]
        self._check_same_everywhere()
        self._owned_idx = partition_sizes(
            [[p.numel() for p in g["params"]] for g in self.param_groups], self.world_size)
        self.optim = optimizer_class(self._local_groups(), **self._defaults)
        self._consolidated: Optional[Dict[str, Any]] = None
        self._build_buckets()
        self._ready = True

    # ---- partition -------------------------------------------------------------------------

    def _check_same_everywhere(self) -> None:
        check_same_everywhere([(tuple(p.shape), str(p.dtype)) for p in self._all_params],
                              self.process_group, "ZeroRedundancyOptimizer")

    def _partition_parameters(self) -> List[List[Dict[str, Any]]]:
        """Per rank, the parameter groups it owns (torch's layout: one dict per group)."""
        out: List[List[Dict[str, Any]]] = [[] for _ in range(self.world_size)]
        for g, owned in zip(self.param_groups, self._owned_idx):
            hyper = {k: v for k, v in g.items() if k not in _HYPER_SKIP}
            for r in range(self.world_size):
                out[r].append(dict(hyper, params=[g["params"][i] for i in owned[r]]))
        return out

    def _local_groups(self) -> List[Dict[str, Any]]:
        return self._partition_parameters()[self.rank]

    def _build_buckets(self) -> None:
        by_dtype: Dict[Any, List[List[Any]]] = {}
        for g, owned in zip(self.param_groups, self._owned_idx):
            for r in range(self.world_size):
                for i in owned[r]:
                    p = g["params"][i]
                    key = (str(p.dtype), str(p.device))
                    by_dtype.setdefault(key, [[] for _ in range(self.world_size)])[r].append(p)
        if self.parameters_as_bucket_view and self.world_size > 1:
            self._check_plain_storage()
        self._buckets = [_Bucket(per_rank, self.rank, self.parameters_as_bucket_view)
                         for per_rank in by_dtype.values()] if self.world_size > 1 else []

    def _check_plain_storage(self) -> None:
        for i, p in enumerate(self._all_params):
            if not p.is_leaf:
                raise ValueError(f"ZeroRedundancyOptimizer(parameters_as_bucket_view=True): "
                                 f"parameter {i} is not a leaf; its storage cannot be moved")

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Add a group (e.g. unfrozen layers); its parameters are shared out among the ranks
        after the existing ones, which keep their owners and their state."""
        Optimizer.add_param_group(self, param_group)
        if not getattr(self, "_ready", False):
            return
        self._all_params = [p for g in self.param_groups for p in g["params"]]
        self._check_same_everywhere()
        self._owned_idx = partition_sizes(
            [[p.numel() for p in g["params"]] for g in self.param_groups], self.world_size)
        self.optim.add_param_group(self._local_groups()[-1])
        self._build_buckets()

    # ---- step ------------------------------------------------------------------------------

    def _sync_hyper(self, src: List[Dict[str, Any]], dst: List[Dict[str, Any]]) -> None:
        for a, b in zip(src, dst):
            for k, v in a.items():
                if k not in _HYPER_SKIP:
                    b[k] = v

    def step(self, closure: Optional[Callable[[], Any]] = None, **kwargs: Any) -> Any:
        """Step the local partition with the wrapped optimizer, then share the updated
        parameters with every rank (bucketed). Hyper-parameters changed on
        ``self.param_groups`` (a scheduler's ``lr``) reach the wrapped optimizer first.

        Returns:
            what the wrapped optimizer's ``step`` returns (the closure's loss, if any).
        """
        if not self._shadowing:
            Join.notify_join_context(self)
        self._sync_hyper(self.param_groups, self.optim.param_groups)
        loss = self.optim.step(closure, **kwargs) if closure is not None or kwargs \
            else self.optim.step()
        self._sync_hyper(self.optim.param_groups, self.param_groups)
        for b in self._buckets:
            b.sync(self.process_group)
        return loss

    def bucket_bytes(self) -> int:
        """Bytes of the exchange buffers held beyond the parameters (for memory accounting)."""
        return sum(b.nbytes() for b in self._buckets)

    # ---- state dicts -----------------------------------------------------------------------

    def _global_index(self) -> Dict[int, int]:
        return {id(p): i for i, p in enumerate(self._all_params)}

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's optimizer state on rank ``to`` (of the process group); call it
        on every rank, then :meth:`state_dict` on ``to``.

        Raises:
            ValueError: ``to`` is not a rank of the group (on every rank, before any traffic).
        """
        if not isinstance(to, int) or not 0 <= to < self.world_size:
            raise ValueError(f"consolidate_state_dict(to={to!r}): to must be a rank of the "
                             f"process group, 0..{self.world_size - 1}")
        index = self._global_index()
        local_params = [p for g in self.optim.param_groups for p in g["params"]]
        mine = {index[id(p)]: dict(self.optim.state[p])
                for p in local_params if p in self.optim.state}
        dist = _dist()
        got: Optional[List[Any]] = [None] * self.world_size if self.rank == to else None
        dist.gather_object(mine, got, dst=dist.get_global_rank(self.process_group, to),
                           group=self.process_group)
        self._consolidated = None
        if got is not None:
            state: Dict[int, Any] = {}
            for part in got:
                state.update(part)
            self._consolidated = {"state": dict(sorted(state.items()))}

    def state_dict(self) -> Dict[str, Any]:
        """The whole optimizer's state, in a plain optimizer's layout (indices over all
        parameters), on the rank that :meth:`consolidate_state_dict` gathered it to.

        Raises:
            RuntimeError: this rank holds no consolidated state.
        """
        if self._consolidated is None:
            raise RuntimeError(f"ZeroRedundancyOptimizer.state_dict() on rank {self.rank}: "
                               f"no consolidated state here; call consolidate_state_dict(to=r) "
                               f"on every rank first, then state_dict() on rank r")
        index = self._global_index()
        groups = [dict({k: v for k, v in g.items() if k != "params"},
                       params=[index[id(p)] for p in g["params"]]) for g in self.param_groups]
        return {"state": dict(self._consolidated["state"]), "param_groups": groups}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a whole state dict (as :meth:`state_dict` returns, or a plain optimizer's over
        the same parameters) on every rank; each keeps the state of the parameters it owns."""
        if not isinstance(state_dict, dict) or "state" not in state_dict \
                or "param_groups" not in state_dict:
            raise TypeError("ZeroRedundancyOptimizer.load_state_dict takes a dict with 'state' "
                            "and 'param_groups', as state_dict() returns")
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ValueError(f"ZeroRedundancyOptimizer.load_state_dict: the state dict has "
                             f"{len(saved)} parameter groups, this optimizer "
                             f"{len(self.param_groups)}")
        local_groups, local_state, n = [], {}, 0
        for gi, (g, sg, lg) in enumerate(zip(self.param_groups, saved,
                                             self.optim.param_groups)):
            if len(sg["params"]) != len(g["params"]):
                raise ValueError(f"ZeroRedundancyOptimizer.load_state_dict: group {gi} has "
                                 f"{len(sg['params'])} parameters in the state dict and "
                                 f"{len(g['params'])} here")
            for i in self._owned_idx[gi][self.rank]:
                if sg["params"][i] in state_dict["state"]:
                    local_state[n] = state_dict["state"][sg["params"][i]]
                n += 1
            hyper = {k: v for k, v in sg.items() if k != "params"}
            local_groups.append(dict(hyper, params=list(range(n - len(lg["params"]), n))))
            g.update(hyper)
        self.optim.load_state_dict({"state": local_state, "param_groups": local_groups})

    # ---- join ------------------------------------------------------------------------------

    def join_hook(self, **kwargs: Any) -> JoinHook:
        """A joined rank keeps stepping with the others (its gradients as the ranks still
        training leave them, e.g. DDP's join), so every exchange is matched."""
        return _ZeroJoinHook(self)

    join_device = property(lambda self: self._all_params[0].device,
                           doc="The device of the parameters (the join's counting runs there).")
    join_process_group = property(lambda self: self.process_group,
                                  doc="The process group the state is sharded over.")

    def _local_state_bytes(self) -> int:
        total = 0
        for s in self.optim.state.values():
            for v in s.values():
                if isinstance(v, Tensor):
                    total += v.numel() * v.element_size()
        return total
