"""Shard(i) -> Shard(j) of a NumPy piece: one all_to_all of equal blocks (MPI_Alltoall).

Rank ``r`` sends every rank ``s`` its block ``x[j-chunk s]`` (all of its dim-``i`` rows) and
receives from each its rows of this rank's ``j``-chunk; the received blocks, in rank order,
are dim ``i`` whole. The blocks travel in a *wire order* of the dims chosen so that one side
needs no copy at all and the other exactly one pass (``copyto`` of strided views, whose
contiguous runs are a chunk times the dims after it):

- ``i`` before ``j``: the wire order moves dim ``i`` to the front, so the blocks received in
  rank order are the output itself (returned as a view that moves ``i`` back); the sender
  packs each destination's block.
- ``j`` before ``i``: the original order; a sender whose ``j``-chunks are contiguous in
  memory (``j`` leading, a C-contiguous piece) sends its piece as it is, and the receiver
  copies each block into place.

Uneven pieces (torch.chunk's: ``ceil(n / k)`` each, the last ones shorter or empty) travel in
blocks padded to ``ceil(n_i / k) x ceil(n_j / k)``; the pad is never read. Only the ranks'
chunk starts, ``r * ceil(n / k)``, make the received blocks end to end the whole dim ``i``
followed by the pad. Exact split sizes (``MPI_Alltoallv``) were 2-4x slower here for the
same bytes.

Where the group's ranks may read and write one another's memory (one node; see
:mod:`._direct`), a swap of at least 1 MiB whose blocks' runs are long enough (64 bytes into
the peers' mapped results; through cross-memory attach 512 bytes, 2 KiB where the sender
writes) skips the all_to_all and the pass: each block goes straight from the sender's piece
into its place in the receiver's result, this rank's own block in the same pass. Otherwise
the path below runs. MPI derived datatypes (``Alltoallw`` with subarray or vector types,
which would make even the pass MPI's) were measured slower than the pass plus the plain
all_to_all on MPICH 5 here: see docs/sharding.md.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np

import mpitensor.distributed as dist
from mpitensor._base import workspace as _workspace

from ..device_mesh import DeviceMesh
from . import _direct
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


def _pack(wire: np.ndarray, qi: int, qj: int, block: Tuple[int, ...],
          split: List[Tuple[int, int]], even: bool) -> np.ndarray:
    """The blocks to send, end to end (``k`` of shape ``block``, padded where uneven): each
    rank's ``j``-chunk of ``wire``; ``wire`` itself where they already lie so."""
    if even and wire.flags.c_contiguous and leading(wire.shape, qj):
        return wire
    send = _workspace.empty(np, (len(split),) + block, wire.dtype)
    for r, (start, size) in enumerate(split):
        np.copyto(along(along(send[r], qi, 0, wire.shape[qi]), qj, 0, size),
                  along(wire, qj, start, size))
    return send


def swap_shards(x: np.ndarray, i: int, j: int, n_i: int, mesh: DeviceMesh, m: int) -> Any:
    """Shard(i) -> Shard(j) over mesh dim ``m``: gather dim ``i`` (global ``n_i``), split ``j``.

    Every rank of the mesh dimension's group calls it with the same ``i``, ``j``, ``n_i``
    and a piece of the same global shape; the result is this rank's piece, laid out in memory
    as the wire order leaves it (C-contiguous where ``i`` leads).
    """
    direct = _direct.swap(x, i, j, n_i, mesh, m)
    if direct is not None:
        return direct
    k, me = mesh.size(m), mesh.get_coordinate()[m]
    n_j = x.shape[j]
    gather, split = _chunks(n_i, k), _chunks(n_j, k)
    c_i, c_j = -(-n_i // k), -(-n_j // k)
    even = c_i * k == n_i and c_j * k == n_j  # (the global shape decides: every rank alike)
    order = [i] + [d for d in range(x.ndim) if d != i] if i < j else list(range(x.ndim))
    qi, qj = order.index(i), order.index(j)
    wire = np.transpose(x, order)  # a view
    block = list(wire.shape)
    block[qi], block[qj] = c_i, c_j
    block = tuple(block)
    send = _pack(wire, qi, qj, block, split, even)
    recv = _workspace.empty(np, (k,) + block, x.dtype)
    dist.all_to_all_single(recv.reshape(-1), send.reshape(-1), group=mesh.get_group(m))
    size = split[me][1]
    if qi == 0:  # rank r's rows start at r * c_i: end to end they are dim i, then the pad
        joined = recv.reshape((k * c_i,) + block[1:])
        out = along(along(joined, 0, 0, n_i), qj, 0, size)
    else:
        out = _workspace.empty(np, tuple(n_i if d == qi else size if d == qj else e
                                         for d, e in enumerate(wire.shape)), x.dtype)
        for r, (start, rows) in enumerate(gather):
            np.copyto(along(out, qi, start, rows), along(along(recv[r], qi, 0, rows), qj, 0, size))
    return np.transpose(out, np.argsort(order))
