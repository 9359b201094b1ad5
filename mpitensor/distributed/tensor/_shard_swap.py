"""Shard(i) -> Shard(j) of a NumPy piece: one all_to_all with exact (uneven) split sizes.

Rank ``r`` sends every other rank ``s`` its block ``x[j-chunk s]`` (all of its dim-``i`` rows)
and receives from each its rows of this rank's ``j``-chunk; the received blocks, in rank order,
are dim ``i`` whole. The blocks travel in a *wire order* of the dims chosen so that one side
needs no copy at all and the other exactly one pass (``copyto`` of strided views):

- ``i`` before ``j``: the wire order moves dim ``i`` to the front, so the blocks received in
  rank order are the output itself (returned as a view that moves ``i`` back); the sender
  packs each destination's block (its contiguous runs are the dims from ``j`` on).
- ``j`` before ``i``: the original order; a sender whose ``j``-chunks are contiguous in
  memory (``j`` leading, a C-contiguous piece) sends its piece as it is, and the receiver
  copies each block into place.

No padding: the pieces are torch.chunk's (``shard_size_and_offset``), empty ones included,
and split sizes say so where they differ (``MPI_Alltoallv``); equal pieces go without them
(``MPI_Alltoall``, several times faster here than the same exchange with split sizes).

MPI derived datatypes (``Alltoallw`` with subarray or vector types, which would make even
that one pass MPI's) and reading the peers' pieces directly (``process_vm_readv`` over one
iovec per run) were measured slower than this pass plus the plain all_to_all on MPICH 5
here: see docs/sharding.md.
"""

from __future__ import annotations

import math
from typing import Any, List, Tuple

import numpy as np

import mpitensor.distributed as dist
from mpitensor._base import workspace as _workspace

from ..device_mesh import DeviceMesh
from ._blocks import along, leading
from .placement_types import shard_size_and_offset

__all__ = ["swap_shards"]


def _chunks(n: int, k: int) -> List[Tuple[int, int]]:
    """(start, size) of each rank's chunk of a dimension of length ``n``."""
    out = []
    for r in range(k):
        size, start = shard_size_and_offset(n, k, r)
        out.append((start, size))
    return out


def _pack(v: Any, axis: int, cuts: List[Tuple[int, int]]) -> Tuple[Any, List[int]]:
    """``v``'s chunks along ``axis`` end to end in one flat buffer, and their sizes.

    No copy where they already are (a C-contiguous ``v`` split along a leading dim)."""
    row = math.prod(v.shape) // v.shape[axis] if v.shape[axis] else 0
    counts = [size * row for _, size in cuts]
    if v.flags.c_contiguous and leading(v.shape, axis):
        return v.reshape(-1), counts
    flat = _workspace.empty(np, (sum(counts),), v.dtype)
    at = 0
    for (start, size), c in zip(cuts, counts):
        part = along(v, axis, start, size)
        np.copyto(flat[at:at + c].reshape(part.shape), part)
        at += c
    return flat, counts


def swap_shards(x: np.ndarray, i: int, j: int, n_i: int, mesh: DeviceMesh, m: int) -> Any:
    """Shard(i) -> Shard(j) over mesh dim ``m``: gather dim ``i`` (global ``n_i``), split ``j``.

    Every rank of the mesh dimension's group calls it with the same ``i``, ``j``, ``n_i``
    and a piece of the same global shape; the result is this rank's piece, laid out in memory
    as the wire order leaves it (C-contiguous where ``i`` leads).
    """
    k, me = mesh.size(m), mesh.get_coordinate()[m]
    gather, split = _chunks(n_i, k), _chunks(x.shape[j], k)
    order = [i] + [d for d in range(x.ndim) if d != i] if i < j else list(range(x.ndim))
    wire = np.transpose(x, order)  # a view
    send, scounts = _pack(wire, order.index(j), split)
    shape = list(wire.shape)
    qi = order.index(i)
    shape[qi], shape[order.index(j)] = n_i, split[me][1]
    out = _workspace.empty(np, tuple(shape), x.dtype)
    direct = leading(shape, qi)
    row = math.prod(shape) // n_i if n_i else 0
    rcounts = [size * row for _, size in gather]
    recv = out.reshape(-1) if direct else _workspace.empty(np, (sum(rcounts),), x.dtype)
    if n_i % k == 0 and x.shape[j] % k == 0:  # (the global shape decides: every rank alike)
        # even pieces, so every count is the same: MPI_Alltoall, no split sizes
        dist.all_to_all_single(recv, send, group=mesh.get_group(m))
    else:
        dist.all_to_all_single(recv, send, output_split_sizes=rcounts,
                               input_split_sizes=scounts, group=mesh.get_group(m))
    if not direct:
        at = 0
        for (start, size), c in zip(gather, rcounts):
            part = along(out, qi, start, size)
            np.copyto(part, recv[at:at + c].reshape(part.shape))
            at += c
    return np.transpose(out, np.argsort(order))
