"""torch.distributed's collective functions: each finds its group and calls the group's
operation of the same name (the contract is in ``process_group.py``), plus
``monitored_barrier``.
"""

from __future__ import annotations

import time
from typing import Any, List, Optional

import numpy as np

from ..errors import (
    DistributedTimeoutError,
)
from ._p2p import irecv, isend
from ._world import _pg, _state, _timeout_seconds, get_world_size
from .process_group import ProcessGroup, ReduceOp, Work


def broadcast(tensor: Any, src: Optional[int] = None, group: Optional[ProcessGroup] = None,
              async_op: bool = False, group_src: Optional[int] = None) -> Optional[Work]:
    """Copy ``tensor`` from global rank ``src`` to every rank of the group, in place.

    Contract: same shape and dtype on every rank; ``src`` the same everywhere.

    Example:
        >>> t = torch.arange(4) if dist.get_rank() == 0 else torch.zeros(4, dtype=torch.int64)
        >>> dist.broadcast(t, src=0)       # every rank: tensor([0, 1, 2, 3])
    """
    w = _state.world  # (_pg's common case inline: a call of a few bytes is about 1 µs)
    return (w if group is None and w is not None else _pg(group)).broadcast(
        tensor, src, async_op, group_src)


def all_reduce(tensor: Any, op: ReduceOp = ReduceOp.SUM, group: Optional[ProcessGroup] = None,
               async_op: bool = False) -> Optional[Work]:
    """Reduce ``tensor`` across the group with ``op``; every rank gets the result in place.

    Contract: same shape and dtype on every rank. ``AVG`` needs a floating/complex dtype,
    ``BAND``/``BOR``/``BXOR`` an integer or bool one; float16 and bfloat16 are reduced in
    float32 and rounded once.

    Example:
        >>> t = torch.ones(2)
        >>> dist.all_reduce(t)             # on 4 ranks: tensor([4., 4.])
    """
    w = _state.world
    return (w if group is None and w is not None else _pg(group)).all_reduce(tensor, op, async_op)


def reduce(tensor: Any, dst: Optional[int] = None, op: ReduceOp = ReduceOp.SUM,
           group: Optional[ProcessGroup] = None, async_op: bool = False,
           group_dst: Optional[int] = None) -> Optional[Work]:
    """Reduce ``tensor`` across the group into global rank ``dst`` (default: group rank 0).

    Only ``dst``'s tensor is written; the others are left as they were.
    """
    w = _state.world
    return (w if group is None and w is not None else _pg(group)).reduce(
        tensor, dst, op, async_op, group_dst)


def all_gather(tensor_list: List[Any], tensor: Any, group: Optional[ProcessGroup] = None,
               async_op: bool = False) -> Optional[Work]:
    """Gather ``tensor`` from every rank into ``tensor_list`` (one entry per rank) on every rank.

    Contract (as torch's): every entry of ``tensor_list`` has ``tensor``'s shape and dtype, on
    every rank; ``ValueError`` before any traffic otherwise. For different sizes per rank, use
    ``all_gather_object`` for the sizes and pad, or ``all_to_all`` (uneven entries allowed).
    """
    return _pg(group).all_gather(tensor_list, tensor, async_op)


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any,
                           group: Optional[ProcessGroup] = None,
                           async_op: bool = False) -> Optional[Work]:
    """Gather every rank's ``input_tensor`` into one ``output_tensor`` (concatenated on dim 0,
    or stacked: any shape with ``world_size × input.numel()`` elements)."""
    w = _state.world
    return (w if group is None and w is not None else _pg(group)).all_gather_into_tensor(
        output_tensor, input_tensor, async_op)


def gather(tensor: Any, gather_list: Optional[List[Any]] = None, dst: Optional[int] = None,
           group: Optional[ProcessGroup] = None, async_op: bool = False,
           group_dst: Optional[int] = None) -> Optional[Work]:
    """Gather ``tensor`` from every rank into ``gather_list`` on ``dst`` (default group rank 0).

    ``gather_list`` is used only on ``dst``, where it must hold one tensor per rank; other
    ranks may pass ``None`` or ``[]``.
    """
    return _pg(group).gather(tensor, gather_list, dst, async_op, group_dst)


def scatter(tensor: Any, scatter_list: Optional[List[Any]] = None, src: Optional[int] = None,
            group: Optional[ProcessGroup] = None, async_op: bool = False,
            group_src: Optional[int] = None) -> Optional[Work]:
    """Send ``scatter_list[i]`` from ``src`` (default group rank 0) into ``tensor`` on rank i.

    ``scatter_list`` is used only on ``src``; other ranks may pass ``None`` or ``[]``.

    Example:
        >>> lst = [torch.tensor([float(i + 1)]) for i in range(4)] if rank == 0 else None
        >>> out = torch.zeros(1)
        >>> dist.scatter(out, lst, src=0)   # rank r: tensor([r + 1.])
    """
    return _pg(group).scatter(tensor, scatter_list, src, async_op, group_src)


def reduce_scatter(output: Any, input_list: List[Any], op: ReduceOp = ReduceOp.SUM,
                   group: Optional[ProcessGroup] = None,
                   async_op: bool = False) -> Optional[Work]:
    """Reduce ``input_list[i]`` across ranks into ``output`` on rank i."""
    return _pg(group).reduce_scatter(output, input_list, op, async_op)


def reduce_scatter_tensor(output: Any, input: Any, op: ReduceOp = ReduceOp.SUM,
                          group: Optional[ProcessGroup] = None,
                          async_op: bool = False) -> Optional[Work]:
    """Reduce ``input`` (``world_size × output.numel()`` elements) across ranks; rank i gets
    block i of the result in ``output``."""
    w = _state.world
    return (w if group is None and w is not None else _pg(group)).reduce_scatter_tensor(
        output, input, op, async_op)


def all_to_all(output_tensor_list: List[Any], input_tensor_list: List[Any],
               group: Optional[ProcessGroup] = None, async_op: bool = False) -> Optional[Work]:
    """Send ``input_tensor_list[j]`` to rank j; receive rank j's into ``output_tensor_list[j]``."""
    return _pg(group).all_to_all(output_tensor_list, input_tensor_list, async_op)


def all_to_all_single(output: Any, input: Any, output_split_sizes: Optional[List[int]] = None,
                      input_split_sizes: Optional[List[int]] = None,
                      group: Optional[ProcessGroup] = None,
                      async_op: bool = False) -> Optional[Work]:
    """All-to-all on single tensors split along dimension 0 (evenly when no split sizes)."""
    return _pg(group).all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                        async_op)


def barrier(group: Optional[ProcessGroup] = None, async_op: bool = False,
            device_ids: Any = None) -> Optional[Work]:
    """Block until every rank of the group has entered the barrier."""
    return _pg(group).barrier(async_op)


#: the tag of monitored_barrier's messages, apart from a program's own small tags
_TAG = 0x6D6F6E  # "mon"


def monitored_barrier(group: Any = None, timeout: Any = None,
                      wait_all_ranks: bool = False) -> None:
    """A barrier that names the ranks that did not come, as torch's.

    Every rank other than the group's rank 0 reports to it; rank 0 waits up to ``timeout``
    (default: the group's) for all of them, then releases them. Where some are missing, rank 0
    raises :class:`~mpitensor.errors.DistributedTimeoutError` naming the first one (all of them
    with ``wait_all_ranks=True``); the group is then broken, as after any timeout, and the
    waiting ranks raise too.
    """
    pg = _pg(group)
    size = get_world_size(pg)
    if size == 1:
        return
    seconds = _timeout_seconds(timeout) if timeout is not None else float(pg.timeout)
    me = pg.rank_
    token = np.zeros(1, np.int8)
    if me != 0:
        isend(token, dst=pg.ranks[0], group=pg, tag=_TAG).wait()
        irecv(token, src=pg.ranks[0], group=pg, tag=_TAG).wait()
        return
    arrivals = {r: irecv(np.zeros(1, np.int8), src=pg.ranks[r], group=pg, tag=_TAG)
                for r in range(1, size)}
    deadline = time.monotonic() + seconds
    missing: List[int] = []
    for r, work in arrivals.items():
        left = deadline - time.monotonic()
        try:
            work.wait(timeout=max(left, 0.0))
        except DistributedTimeoutError:
            missing.append(pg.ranks[r])
            if not wait_all_ranks:
                break
    if missing:
        who = (f"ranks {missing} did not" if wait_all_ranks and len(missing) > 1
               else f"rank {missing[0]} did not")
        raise DistributedTimeoutError(
            f"monitored_barrier on {pg.name}: {who} reach the barrier within {seconds:g} s"
            f"{'' if wait_all_ranks else ' (wait_all_ranks=True names every missing rank)'}")
    for r in range(1, size):
        isend(token, dst=pg.ranks[r], group=pg, tag=_TAG).wait()
