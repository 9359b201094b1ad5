"""Hierarchical ``all_gather_into_tensor`` for MPI groups whose ranks span several nodes.

The sub-groups and the switches are ``all_reduce``'s (:mod:`hierarchical`). With ``m``
nodes of ``p`` ranks each, a call gathering ``b`` elements from every rank runs in two steps:

1. *across nodes*, local rank ``k`` of every node all-gathers its block with the other nodes'
   rank ``k`` (``all_gather_into_tensor`` on the cross sub-group): each block crosses the
   network once per other node, and a node's link carries its own ``p`` blocks per other node;
2. *within each node*, an all-gather of the ``p`` results (``m * b`` elements each; the
   shared-memory path for groups on one node, where it pays);

then one copy puts the ``n`` blocks in group-rank order (``Hierarchy.order``). MPI's flat
all-gather sends more across nodes where its algorithm pairs ranks on different nodes:
recursive doubling sends every rank's accumulated half across at its last step (twice a
node's own blocks with two nodes). Only the split layout (every node the same number of ranks)
takes this path. The choice is per call, by a model timed at the group's first
``all_gather_into_tensor`` (both paths at two sizes, the slowest member's times, a line each;
``MPITENSOR_HIERARCHICAL=on`` skips it), so every member takes the same path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...health import watchdog as W
from . import buffers as B
from . import hierarchical as _hier

__all__ = ["takes", "all_gather", "host_in"]

def takes(g: Any, out: Any) -> bool:
    """Whether this all_gather_into_tensor into ``out`` goes the hierarchical way (see
    ``hierarchical.split_takes``)."""
    return _hier.split_takes(g, out, "all_gather_into_tensor", _probe)


def _flat(g: Any, out: np.ndarray, inp: np.ndarray) -> None:
    mt = B.MOVE_TYPES[inp.dtype]
    req = g.comm.Iallgather([inp, mt], [out, mt])
    W.wait(g.health, req, "all_gather_into_tensor", g.seq)


def _probe(g: Any, h: Any, b: int) -> tuple:
    """The cost model's calls gathering ``b`` float64 from each rank (bytes: the output's)."""
    inp, out = np.ones(b, np.float64), np.empty(b * g.size_, np.float64)
    return out.nbytes, lambda: _flat(g, out, inp), lambda: _run(h, out, inp)


def _run(h: Any, out: np.ndarray, inp: np.ndarray) -> None:
    """The two steps and the copy into ``out`` (contiguous, ``n * b`` elements) from ``inp``
    (contiguous, ``b`` elements, apart from ``out``)."""
    b = inp.size
    mine = np.empty(h.nodes * b, inp.dtype)
    h.cross.all_gather_into_tensor(mine, inp)
    every = np.empty(h.ppn * h.nodes * b, inp.dtype)
    h.node.all_gather_into_tensor(every, mine)
    out.reshape(-1, b)[h.order] = every.reshape(-1, b)


def host_in(inp: Any) -> np.ndarray:
    """``inp`` as a contiguous NumPy array (a CuPy array copied to the host)."""
    return np.ascontiguousarray(inp if isinstance(inp, np.ndarray) else inp.get())


def all_gather(g: Any, output: Any, out: np.ndarray, finish: Any, inp: np.ndarray,
               async_op: bool) -> Any:
    """``g``'s all_gather_into_tensor the hierarchical way (``out`` contiguous and writable,
    ``inp`` contiguous: the caller staged them and counted the call), then ``finish``."""
    g.hier.gathers += 1
    _run(g.hier, out.reshape(-1), inp.reshape(-1))
    return _hier.ended(g, out, False, finish, output, async_op)
