"""Hierarchical ``reduce_scatter_tensor`` for MPI groups whose ranks span several nodes.

The mirror of :mod:`hierarchical_gather`, on the same sub-groups and switches
(:mod:`hierarchical`). With ``m`` nodes of ``p`` ranks each and ``b`` elements per rank:

1. one copy puts the input's ``n`` blocks in the order ``Hierarchy.order`` (local rank ``k``'s
   cross group's blocks together);
2. *within each node*, a reduce-scatter: local rank ``k`` gets the node's reduction of the
   ``m`` blocks meant for the ranks of its cross group (the shared-memory path, where it
   pays);
3. *across nodes*, a reduce-scatter on the cross group: each rank gets its own block, reduced
   over the nodes. A node sends ``(m - 1) / m`` of one rank's input across, whatever MPI's
   flat algorithm would have paired.

Each element is reduced within its node on one rank and across nodes on one rank, so the
result equals the flat one up to the order of the reduction. Only the split layout (every
node the same number of ranks) takes this path; AVG is the sum, divided after (as on the flat
path); bool and half precision stay flat. The choice is per call, by a model timed at the
group's first ``reduce_scatter_tensor`` (``MPITENSOR_HIERARCHICAL=on`` skips it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...health import watchdog as W
from ...process_group import ReduceOp
from . import buffers as B
from . import hierarchical as _hier

__all__ = ["takes", "reduce_scatter"]

def takes(g: Any, inp: Any) -> bool:
    """Whether this reduce_scatter_tensor of ``inp`` goes the hierarchical way (see
    ``hierarchical.split_takes``)."""
    return _hier.split_takes(g, inp, "reduce_scatter_tensor", _probe)


def _flat(g: Any, out: np.ndarray, inp: np.ndarray) -> None:
    from mpi4py import MPI

    mt = B.MOVE_TYPES[inp.dtype]
    req = g.comm.Ireduce_scatter_block([inp, mt], [out, mt], MPI.SUM)
    W.wait(g.health, req, "reduce_scatter_tensor", g.seq)


def _probe(g: Any, h: Any, b: int) -> tuple:
    """The cost model's calls scattering ``b`` float64 to each rank (bytes: the input's)."""
    out, inp = np.empty(b, np.float64), np.ones(b * g.size_, np.float64)
    return inp.nbytes, lambda: _flat(g, out, inp), lambda: _run(h, out, inp, ReduceOp.SUM)


def _run(h: Any, out: np.ndarray, inp: np.ndarray, op: Any) -> None:
    """The copy and the two steps, from ``inp`` (contiguous, ``n * b`` elements) into ``out``
    (contiguous, ``b`` elements)."""
    b = out.size
    arranged = inp.reshape(-1, b)[h.order].reshape(-1)
    mine = np.empty(h.nodes * b, inp.dtype)
    h.node.reduce_scatter_tensor(mine, arranged, op=op)
    h.cross.reduce_scatter_tensor(out, mine, op=op)


def reduce_scatter(g: Any, output: Any, out: np.ndarray, finish: Any, inp: np.ndarray,
                   op: Any, async_op: bool, average: bool = False) -> Any:
    """``g``'s reduce_scatter_tensor the hierarchical way (``out`` contiguous and writable,
    ``inp`` contiguous: the caller staged them and counted the call), divided by the group's
    size for AVG (``average``), then ``finish``."""
    g.hier.scatters += 1
    _run(g.hier, out.reshape(-1), inp.reshape(-1), op)
    return _hier.ended(g, out, average, finish, output, async_op)
