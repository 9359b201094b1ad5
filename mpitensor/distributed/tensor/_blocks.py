"""all_gather and reduce_scatter along any dim of a NumPy piece, its blocks in the dims'
own order.

The collectives take equal contiguous blocks end to end. Along dim 0 of a C-contiguous piece
they are the piece itself (no copy at all). Along a later dim, each block is laid out in the
piece's own dim order (``x[..., chunk r, ...]``): one ``copyto`` pass puts them in place, its
contiguous runs a chunk's length times the dims after it, and the result is C-contiguous.
(Moving the dim to the front instead, as the CuPy path does, makes the runs the dims after
it only: single elements when it is the last dim, a transposing copy.) Uneven pieces are
padded to the longest chunk, ``ceil(n / k)``, as torch pads them; the pad is zeros.

A gather of at least 1 MiB, along any dim, takes the direct path where the group allows it
(:mod:`._direct`): each rank's piece goes straight into its place in every rank's result
(written into the peers' mapped results, else read by cross-memory attach), with no
collective and no reorder pass.
"""

from __future__ import annotations

import math
from typing import Any, Sequence, Tuple

import numpy as np

import mpitensor.distributed as dist
from mpitensor._base import workspace as _workspace

from ..device_mesh import DeviceMesh
from . import _direct
from .placement_types import shard_size_and_offset

__all__ = ["along", "leading", "gather_dim", "scatter_dim"]


def along(a: Any, axis: int, start: int, size: int) -> Any:
    """The view ``a[..., start:start + size, ...]`` along ``axis``."""
    index = [slice(None)] * a.ndim
    index[axis] = slice(start, start + size)
    return a[tuple(index)]


def leading(shape: Sequence[int], axis: int) -> bool:
    """Whether chunks along ``axis`` of a C-contiguous array of ``shape`` are contiguous and
    consecutive (every dim before ``axis`` has length 1)."""
    return math.prod(shape[:axis]) == 1


def _with(shape: Sequence[int], axis: int, length: int) -> Tuple[int, ...]:
    out = list(shape)
    out[axis] = length
    return tuple(out)


def _padded(x: np.ndarray, dim: int, c: int) -> np.ndarray:
    """``x`` padded with zeros to length ``c`` along ``dim``, C-contiguous (``x`` itself where
    it already is)."""
    if x.shape[dim] == c and x.flags.c_contiguous:
        return x
    block = _workspace.empty(np, _with(x.shape, dim, c), x.dtype)
    np.copyto(along(block, dim, 0, x.shape[dim]), x)
    along(block, dim, x.shape[dim], c - x.shape[dim]).fill(0)
    return block


def gather_dim(x: np.ndarray, dim: int, n: int, mesh: DeviceMesh, m: int) -> np.ndarray:
    """Shard(dim) of global length ``n`` -> the whole dim (one all_gather_into_tensor)."""
    direct = _direct.gather(x, dim, n, mesh, m)
    if direct is not None:
        return direct
    k = mesh.size(m)
    c = -(-n // k)
    block = _padded(x, dim, c)
    got = _workspace.empty(np, (k,) + block.shape, x.dtype)
    dist.all_gather_into_tensor(got, block, group=mesh.get_group(m))
    if leading(x.shape, dim):  # the blocks end to end are the dim whole (and the pad)
        return along(got.reshape(_with(x.shape, dim, k * c)), dim, 0, n)
    out = _workspace.empty(np, _with(x.shape, dim, n), x.dtype)
    for r in range(k):
        size, start = shard_size_and_offset(n, k, r)
        np.copyto(along(out, dim, start, size), along(got[r], dim, 0, size))
    return out


def scatter_dim(x: np.ndarray, dim: int, op: Any, mesh: DeviceMesh, m: int) -> np.ndarray:
    """Every rank's whole term -> this rank's chunk of their reduction along ``dim`` (one
    reduce_scatter_tensor with ``op``)."""
    k, n = mesh.size(m), x.shape[dim]
    c = -(-n // k)
    if leading(x.shape, dim):
        full = _padded(x, dim, k * c)  # chunk r is rows r*c.. end to end: no reorder
    else:
        full = _workspace.empty(np, (k,) + _with(x.shape, dim, c), x.dtype)
        for r in range(k):
            size, start = shard_size_and_offset(n, k, r)
            np.copyto(along(full[r], dim, 0, size), along(x, dim, start, size))
            along(full[r], dim, size, c - size).fill(0)
    out = _workspace.empty(np, _with(x.shape, dim, c), x.dtype)
    dist.reduce_scatter_tensor(out, full, op=op, group=mesh.get_group(m))
    size, _ = shard_size_and_offset(n, k, mesh.get_coordinate()[m])
    return along(out, dim, 0, size)
