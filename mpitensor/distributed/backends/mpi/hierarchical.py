"""Hierarchical all_reduce for MPI groups whose ranks span several nodes.

A flat all-reduce sends each rank's data over the network as if every rank had a link of its
own. Where ``p`` ranks share a node they share its link, and MPI's algorithms can send up to
``p`` times the bytes the node needs to: recursive doubling (small messages) sends each rank's
whole buffer to a partner on another node at one of its steps, and so does recursive halving
(large messages) as soon as the ranks are not numbered node by node (round-robin placement, a
sub-group). Here, as in NCCL's and Horovod's hierarchical all-reduce, a call of ``N`` bytes on
``m`` nodes of ``p`` ranks each runs in three steps:

1. *within each node*, a reduce-scatter: local rank ``k`` gets the node's reduction of the
   ``k``-th ``1/p`` of the buffer (``reduce_scatter_tensor`` on the node's sub-group, so that
   a shared-memory path for groups on one node, where there is one, is taken);
2. *across nodes*, local rank ``k`` of every node all-reduces its piece with the other nodes'
   rank ``k`` (``all_reduce`` on the sub-group of the ranks with that local rank): ``p``
   all-reduces of ``N/p`` bytes side by side, so a node's link carries what one rank's ``N``
   bytes need, and every rank does ``1/p`` of the cross-node arithmetic;
3. *within each node*, an all-gather of the ``p`` reduced pieces into every rank's buffer.

Why not one leader per node: the leader's reduce and broadcast move all ``N`` bytes through
one rank while the others wait, and the leader alone reduces across nodes. The split above
sends the same bytes across nodes and shares the traffic and the arithmetic. A group whose
nodes hold different numbers of its ranks uses the leader scheme (node ``reduce`` to local
rank 0, the leaders' ``all_reduce``, node ``broadcast``), where the pieces would not line up.
The last ``size % p`` elements, too few to split, are reduced flat.

Results are bitwise identical on every rank: each element is reduced within its node on one
rank and across nodes in one all-reduce (whose members MPICH gives the same bits), then
copied. They equal the flat path's result up to the re-association of the reduction: exactly
for integers, within the rounding of the ``n - 1`` additions for floats.

When: the sub-groups are made lazily, at the group's first ``all_reduce`` whose dtype and op
MPI reduces as they are (AVG too: a SUM, then divided; no bool or half precision, which MPI
reduces through a view or in float32: those stay flat), or at its first
``all_gather_into_tensor`` or ``reduce_scatter_tensor``, and freed with the group. Where the
group lies on one node, or no node holds two of its ranks, nothing more is made and every call
is flat. Else the path is chosen per call by a cost model measured then: both paths are timed,
collectively, at two sizes; every rank takes the slowest rank's times, models each path as
``a + b * bytes`` and goes hierarchical from the size where that path's modelled time is the lower.
The crossover is the same on every rank, and so is a call's size, so every rank takes the same
path. ``MPITENSOR_HIERARCHICAL``: ``auto`` (the model), ``on`` (always, where the group spans
nodes: tests), ``off`` (flat); ``MPITENSOR_SHM_COLLECTIVES=off`` turns it off too. Both are
read when the sub-groups are made and must be set alike on every rank.
``all_gather_into_tensor`` and ``reduce_scatter_tensor`` across nodes use the same sub-groups
(made by whichever of the three comes first): :mod:`hierarchical_gather`,
:mod:`hierarchical_scatter`.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ...._base import config as _config
from ....backend import array_module
from ...health import watchdog as W
from ...process_group import ReduceOp, _Completed
from . import buffers as B
from .shm_coll import best_time

__all__ = ["PENDING", "Hierarchy", "initial", "takes", "hierarchy", "fit", "reduction", "staged",
           "all_reduce", "ended", "split_takes", "free"]

#: a group's ``hier`` before its first all_reduce has found out whether it spans nodes
PENDING = object()
_NEVER = 1 << 62  # a crossover no buffer reaches
# the cost model's probe sizes (float64 elements: 4 KiB, 4 MiB; the larger must be large
# enough that the bandwidth terms show through a loaded machine's latency noise) and timed
# repetitions per size
_PROBES = (512, 1 << 19)
_REPS = 3
_SUM = ReduceOp.SUM


class Hierarchy:
    """A group's node and cross-node sub-groups, and its measured crossover."""

    def __init__(self, node: Any, cross: Any, ppn: int, nodes: int, even: bool,
                 mode: str) -> None:
        self.node = node        # this rank's node (an MPIGroup)
        self.cross = cross      # every node's rank with this rank's local rank (where nodes
        #                         hold different numbers of ranks: the leaders; None elsewhere)
        self.ppn = ppn          # ranks on this node
        self.nodes = nodes      # nodes the group spans
        self.even = even        # every node holds ppn ranks: the split scheme, else leaders
        self.mode = mode
        self.crossover = 0 if mode == "on" else _NEVER  # bytes from which to go hierarchical
        self.model: tuple = ()  # (a_flat, b_flat, a_hier, b_hier): seconds, seconds per byte
        self.calls = 0          # calls that took the hierarchical path
        # all_gather_into_tensor and reduce_scatter_tensor (hierarchical_gather.py,
        # hierarchical_scatter.py): group ranks in the order the node all-gather of the cross
        # all-gathers leaves their blocks; per operation its crossover (once measured) and
        # model; their calls
        self.order: Any = None
        self.crossovers: dict = {}
        self.models: dict = {}
        self.gathers = self.scatters = 0

    def wants(self, size: int, nbytes: int) -> bool:
        # the split needs an element per local rank (ppn is the same on every node there);
        # the leaders' scheme takes any size
        return nbytes >= self.crossover and (size >= self.ppn or not self.even)

    def close(self) -> None:
        for sub in (self.cross, self.node):
            if sub is not None and not sub.destroyed:
                sub.free()
        self.cross = self.node = None


def _mode() -> str:
    """``off`` where either switch turns the node-aware paths off, else ``auto`` or ``on``."""
    if _config.shm_collectives() == "off":
        return "off"
    return _config.hierarchical()


def initial(g: Any) -> Any:
    """A new group's ``hier``: PENDING where it may span nodes (the sub-groups are made at its
    first qualifying call), None where it cannot: under 3 members, the switches off, or every
    member on this node. Collective: run while every member makes the group, so that on one
    node a first call that meets a mismatched call on another rank (a user's error) is
    reported as a mismatch, instead of waiting in a constructor the other ranks never call."""
    if g.size_ < 3 or _mode() == "off":
        return None
    if g.one_node is None:  # shm_coll.floor did not ask (its switch off, no shared slots)
        from mpi4py import MPI

        local = g.comm.Split_type(MPI.COMM_TYPE_SHARED)
        g.one_node = local.Get_size() == g.size_
        local.Free()
    return None if g.one_node else PENDING


def takes(g: Any, arr: Any) -> bool:
    """Whether this all_reduce of ``arr`` (a dtype and op MPI reduces as they are) goes the
    hierarchical way. Depends only on what every member agrees on (the group, the size), so
    every member answers alike; the first call makes the sub-groups (collective)."""
    h = hierarchy(g)
    return h is not None and h.wants(arr.size, arr.nbytes)


def hierarchy(g: Any) -> Optional[Hierarchy]:
    """``g``'s Hierarchy, made at the first call that asks (collective), or None."""
    h = g.hier
    if h is PENDING:
        h = g.hier = _build(g)
    return h


def _build(g: Any) -> Optional[Hierarchy]:
    """Collective over ``g``: its Hierarchy where it spans nodes and a node holds two of its
    ranks, else None (and nothing made)."""
    from mpi4py import MPI

    if g.size_ < 3:
        return None  # no node can hold two ranks while another holds one
    mode = _mode()
    if mode == "off":
        return None
    comm = g.comm
    # the constructors below block until every member calls them: meet first, timed
    W.rendezvous(g.health, list(range(g.size_)), ("hierarchical", g.name), g.timeout,
                 "all_reduce (finding the group's nodes)")
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=g.rank_)
    local, ppn = node_comm.Get_rank(), node_comm.Get_size()
    first = node_comm.allreduce(g.rank_, op=MPI.MIN)  # names the node
    layout = comm.allgather((first, ppn, local))
    nodes = len({f for f, _, _ in layout})
    if nodes < 2 or max(p for _, p, _ in layout) < 2:
        node_comm.Free()
        return None
    even = len({p for _, p, _ in layout}) == 1
    cross_comm = comm.Split(local if (even or local == 0) else MPI.UNDEFINED, key=g.rank_)
    make = type(g)
    node = make(node_comm, node_comm.allgather(g.global_rank), g.global_rank,
                f"{g.name}/node{first}", g.timeout, g.debug, g.world_size)
    cross = None
    if cross_comm != MPI.COMM_NULL:
        cross = make(cross_comm, cross_comm.allgather(g.global_rank), g.global_rank,
                     f"{g.name}/local{local}", g.timeout, g.debug, g.world_size)
    h = Hierarchy(node, cross, ppn, nodes, even, mode)
    # (Split orders each sub-group by group rank: cross group k's rank j is the j-th group
    # rank whose local rank is k, and node rank k is local rank k)
    h.order = np.array([r for k in range(ppn) for r, lay in enumerate(layout) if lay[2] == k])
    if mode == "auto":
        _measure(g, h)
    return h


def _timed(run: Any) -> float:
    run()  # warm-up: first-touch pages, MPI's connections
    return best_time(run, _REPS)


def fit(g: Any, what: str, probes: list) -> "tuple[tuple, int]":
    """Time a collective's flat and hierarchical paths (collective over ``g``): ``probes``
    holds two ``(bytes, flat, hierarchical)``, the two sizes and a call of each path at that
    size. With the slowest member's times, ``a + b * bytes`` is fitted to each path: returns
    the model and the crossover every member shares (see _crossover)."""
    from mpi4py import MPI

    times = np.empty(4)
    for i, (_, flat, hier) in enumerate(probes):
        times[i] = _timed(flat)
        times[2 + i] = _timed(hier)
    req = g.comm.Iallreduce(MPI.IN_PLACE, times, MPI.MAX)
    W.wait(g.health, req, f"{what} (cost model)", g.seq)
    return _crossover(times, [nbytes for nbytes, _, _ in probes])


def _measure(g: Any, h: Hierarchy) -> None:
    """all_reduce's model and crossover (see fit), at 4 KiB and 4 MiB."""
    bufs = [np.ones(n, np.float64) for n in _PROBES]
    h.model, h.crossover = fit(g, "all_reduce", [
        (b.nbytes, lambda b=b: _flat(g, b, _SUM), lambda b=b: _run(g, h, b, _SUM))
        for b in bufs])


def _crossover(times: Any, nbytes: list) -> "tuple[tuple, int]":
    """``((a_flat, b_flat, a_hier, b_hier), crossover in bytes)`` from the flat path's times at
    the two sizes ``nbytes`` and the hierarchical path's (``times``: flat, flat, hier, hier)."""
    span = nbytes[1] - nbytes[0]
    b_f = max(0.0, (times[1] - times[0]) / span)
    b_h = max(0.0, (times[3] - times[2]) / span)
    a_f, a_h = times[0] - b_f * nbytes[0], times[2] - b_h * nbytes[0]
    if a_h <= a_f and b_h <= b_f:
        cross = 0
    elif b_h < b_f:
        cross = int((a_h - a_f) / (b_f - b_h)) + 1
    else:
        cross = _NEVER
    return (a_f, b_f, a_h, b_h), cross


def _run(g: Any, h: Hierarchy, buf: np.ndarray, op: Any) -> None:
    """The three steps on ``buf``, a contiguous writable 1-D array (see the module)."""
    node, cross = h.node, h.cross
    if not h.even:
        leader = node.ranks[0]
        node.reduce(buf, dst=leader, op=op)
        if cross is not None:  # this node's leader
            cross.all_reduce(buf, op=op)
        node.broadcast(buf, src=leader)
        return
    c = buf.size // h.ppn
    body = buf[:c * h.ppn]
    piece = np.empty(c, buf.dtype)
    node.reduce_scatter_tensor(piece, body, op=op)
    cross.all_reduce(piece, op=op)
    node.all_gather_into_tensor(body, piece)
    if body.size < buf.size:
        _flat(g, buf[body.size:], op)


def _flat(g: Any, buf: np.ndarray, op: Any) -> None:
    """MPI's all-reduce of ``buf`` over all of ``g`` (bounded by its timeout)."""
    from mpi4py import MPI

    plan = B.reduce_plan(buf.dtype, op, "all_reduce")
    req = g.comm.Iallreduce(MPI.IN_PLACE, [buf, plan.mpi_type], plan.mpi_op)
    W.wait(g.health, req, "all_reduce", g.seq)


def staged(arr: Any) -> "tuple[np.ndarray, Any]":
    """A contiguous writable NumPy buffer holding ``arr`` (itself where it is one), and the
    step that copies the result back into ``arr`` (None where none is needed)."""
    if isinstance(arr, np.ndarray):
        return B.stage_out(arr)
    host = np.ascontiguousarray(arr.get())  # a CuPy array: reduced on the host

    def write_back() -> None:
        arr[...] = array_module(arr).asarray(host)

    return host, write_back


def reduction(plan: Any, op: Any, where: str) -> Any:
    """The op the hierarchical steps run for a call reduced as ``plan`` says: its own, SUM for
    AVG (divided after, as the flat path does); None where the plan views or widens the data
    (bool, float16, bfloat16: those calls stay flat)."""
    if plan.view is not None or plan.upcast is not None:
        return None
    return _SUM if plan.average else B.coerce_op(op, where)


def all_reduce(g: Any, tensor: Any, buf: np.ndarray, finish: Any, op: Any,
               async_op: bool, average: bool = False) -> Any:
    """``g``'s all_reduce of ``buf`` (contiguous and writable: the caller staged it and
    counted the call) the hierarchical way, divided by the group's size for AVG
    (``average``), then ``finish`` (a staged buffer's write-back). Blocking; with
    ``async_op`` its Work is returned complete."""
    g.hier.calls += 1
    _run(g, g.hier, buf.reshape(-1), op)
    return ended(g, buf, average, finish, tensor, async_op)


def ended(g: Any, buf: np.ndarray, average: bool, finish: Any, result: Any,
          async_op: bool) -> Any:
    """A hierarchical call's end: ``buf`` divided by the group's size for AVG, ``finish``
    run; what the call returns (a complete Work for ``async_op``)."""
    if average:
        np.divide(buf, g.size_, out=buf)
    if finish is not None:
        finish()
    return _Completed([result]) if async_op else None


def split_takes(g: Any, arr: Any, kind: str, probe: Any) -> bool:
    """Whether a ``kind`` call (all_gather_into_tensor or reduce_scatter_tensor) whose larger
    buffer is ``arr`` goes the hierarchical way: the split layout only (every node the same
    number of ranks), from its crossover. That is timed at its first call (collective; ``on``:
    0): ``probe(g, h, b)`` gives ``(bytes, flat call, hierarchical call)`` for blocks of ``b``
    float64 a rank, 4 KiB and 1 MiB (see fit). Decided from the group and the size alone,
    alike on every member."""
    h = hierarchy(g)
    if h is None or not h.even:
        return False
    cross = h.crossovers.get(kind)
    if cross is None:
        cross = 0
        if h.mode != "on":
            h.models[kind], cross = fit(g, kind, [probe(g, h, b) for b in (512, 1 << 17)])
        h.crossovers[kind] = cross
    return arr.nbytes >= cross and arr.size > 0


def free(g: Any) -> None:
    """Free ``g``'s sub-groups, if it made any (called when ``g`` is freed)."""
    h = g.__dict__.get("hier")
    if isinstance(h, Hierarchy):
        h.close()
    g.hier = None
