"""Moving a DTensor's local pieces from one set of placements to another.

Each mesh dimension's change maps to one collective over that dimension's group:

==================  ==============================================  ====================
from -> to          collective                                      backward (adjoint)
==================  ==============================================  ====================
Shard(i) -> R       all_gather_into_tensor (padded to equal pieces)  local slice
R -> Shard(i)       none: the local chunk                           all_gather
Partial -> R        all_reduce out of place (the Partial's op)      none
Partial -> Shard    reduce_scatter_tensor                           all_gather
Shard(i)->Shard(j)  all_to_all_single (padded to equal blocks)      all_to_all back
R -> Partial        none: sum divides by the dimension's size       none
==================  ==============================================  ====================

The gradient of a DTensor is laid out in the DTensor's own placements: a shard of the
gradient for ``Shard``, the whole gradient (the same on every rank) for ``Replicate`` and
``Partial("sum")``, the whole gradient over the mesh dimension's size for ``Partial("avg")``.
So the backward of a redistribution from A to B is the redistribution of the gradient from
B's layout to A's (:class:`Redistribute`).

On one node, a NumPy swap and a gather move their blocks straight into place instead of
through the collective (``_direct.py``).

Several mesh dimensions sharding one tensor dimension nest in mesh order; a change to one of
them undoes the shards nested inside it first (innermost first) and redoes them after.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

import mpitensor.distributed as dist
from mpitensor import backend as _backend
from mpitensor._base import workspace as _workspace
from mpitensor.autograd import ArrayFunction as Function

from ..device_mesh import DeviceMesh
from . import _direct
from ._blocks import gather_dim, scatter_dim
from ._shard_swap import swap_shards
from .placement_types import Partial, Placement, Replicate, Shard, shard_size_and_offset

__all__ = ["redistribute_array", "Redistribute", "grad_layout", "avg_factor"]

_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}


def _xp(arr: Any) -> Any:
    return _backend.array_module(arr)


def _empty(x: Any, shape: Tuple[int, ...]) -> Any:
    """An uninitialised array of ``x``'s dtype: a recycled buffer for NumPy, as nn's
    activations. A redistribution's staging buffers and outputs are the same multi-megabyte
    sizes at every step; fresh ones would be page-faulted in each time (about as long as
    the collective that fills them, for 64 MiB on two ranks)."""
    return _workspace.empty(_xp(x), shape, x.dtype)


def _coord(mesh: DeviceMesh, m: int) -> int:
    return mesh.get_coordinate()[m]


# ------------------------------------------------------------------ one mesh dimension
def _pad_front(x: Any, dim: int, c: int) -> Any:
    """``x`` with ``dim`` moved to the front and padded (with zeros) to length ``c``."""
    front = _xp(x).moveaxis(x, dim, 0)
    if front.shape[0] == c and front.flags.c_contiguous:
        return front
    buf = _empty(x, (c,) + front.shape[1:])  # the pad is trimmed after
    buf[:front.shape[0]] = front
    return buf


def all_gather_dim(x: Any, dim: int, n: int, mesh: DeviceMesh, m: int) -> Any:
    """Shard(dim) of a dimension of global length ``n`` -> the whole of it (all_gather).

    NumPy: :func:`gather_dim` (blocks in the dims' own order, a C-contiguous result); other
    arrays (CuPy): the dim moved to the front, the result a view that moves it back."""
    if _xp(x) is np:
        return gather_dim(x, dim, n, mesh, m)
    return front_all_gather(x, dim, n, mesh, m)


def front_all_gather(x: Any, dim: int, n: int, mesh: DeviceMesh, m: int) -> Any:
    """:func:`all_gather_dim` with ``dim`` moved to the front (any array module)."""
    k = mesh.size(m)
    c = -(-n // k)
    piece = _pad_front(x, dim, c)
    out = _empty(x, (k * c,) + piece.shape[1:])
    dist.all_gather_into_tensor(out, piece, group=mesh.get_group(m))
    return _xp(x).moveaxis(out[:n], 0, dim)


def chunk_dim(x: Any, dim: int, mesh: DeviceMesh, m: int) -> Any:
    """Replicate -> Shard(dim): this rank's chunk (a view, no communication)."""
    size, start = shard_size_and_offset(x.shape[dim], mesh.size(m), _coord(mesh, m))
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, start + size)
    return x[tuple(index)]


def reduce_scatter_dim(x: Any, dim: int, op: str, mesh: DeviceMesh, m: int) -> Any:
    """Partial -> Shard(dim): reduce every rank's term and keep this rank's chunk (NumPy:
    :func:`scatter_dim`, as :func:`all_gather_dim`)."""
    if _xp(x) is np:
        return scatter_dim(x, dim, _OPS[op], mesh, m)
    return front_reduce_scatter(x, dim, op, mesh, m)


def front_reduce_scatter(x: Any, dim: int, op: str, mesh: DeviceMesh, m: int) -> Any:
    """:func:`reduce_scatter_dim` with ``dim`` moved to the front (any array module)."""
    k, n = mesh.size(m), x.shape[dim]
    c = -(-n // k)
    full = _pad_front(x, dim, k * c)
    out = _empty(x, (c,) + full.shape[1:])
    dist.reduce_scatter_tensor(out, full, op=_OPS[op], group=mesh.get_group(m))
    size, _ = shard_size_and_offset(n, k, _coord(mesh, m))
    return _xp(x).moveaxis(out[:size], 0, dim)


def all_reduce_dim(x: Any, op: str, mesh: DeviceMesh, m: int) -> Any:
    """Partial -> Replicate: the reduction of every rank's term, on every rank, into a new
    array (the terms ``x`` stay as they are). On one node the ranks write the reduction
    straight into one another's results (:func:`._direct.all_reduce`); otherwise the group
    reads ``x`` where it lies where it can (the MPI group's ``all_reduce_into``), and a group
    without that reduces a copy."""
    if _xp(x) is np:
        direct = _direct.all_reduce(x, _OPS[op], mesh, m)
        if direct is not None:
            return direct
    out = _empty(x, tuple(x.shape))
    group = mesh.get_group(m)
    into = getattr(group, "all_reduce_into", None)
    if into is not None:
        into(out, x, _OPS[op])
        return out
    _xp(x).copyto(out, x)
    dist.all_reduce(out, op=_OPS[op], group=group)
    return out


def all_to_all_dim(x: Any, i: int, j: int, n_i: int, mesh: DeviceMesh, m: int) -> Any:
    """Shard(i) -> Shard(j) (one all_to_all): gather dim ``i`` (global ``n_i``), split ``j``.

    NumPy pieces: :func:`swap_shards` (blocks in a wire order that needs one copy pass).
    Other arrays (CuPy): :func:`padded_all_to_all`."""
    if _xp(x) is np:
        return swap_shards(x, i, j, n_i, mesh, m)
    return padded_all_to_all(x, i, j, n_i, mesh, m)


def padded_all_to_all(x: Any, i: int, j: int, n_i: int, mesh: DeviceMesh, m: int) -> Any:
    """:func:`all_to_all_dim` through equal blocks padded to the longest chunk (any array
    module): each destination's slab packed, one all_to_all_single, a view of the result."""
    xp = _xp(x)
    k, me = mesh.size(m), _coord(mesh, m)
    n_j = x.shape[j]
    c_i, c_j = -(-n_i // k), -(-n_j // k)
    moved = xp.moveaxis(x, (i, j), (0, 1))  # (l_i, n_j, rest...)
    # block r: this rank's rows of rank r's columns; padding is never read, so left as is
    send = _empty(x, (k, c_i, c_j) + moved.shape[2:])
    for r in range(k):  # k slab copies
        size, start = shard_size_and_offset(n_j, k, r)
        send[r, :moved.shape[0], :size] = moved[:, start:start + size]
    recv = _empty(x, send.shape)
    dist.all_to_all_single(recv, send, group=mesh.get_group(m))
    size, _ = shard_size_and_offset(n_j, k, me)
    # recv[r] holds rank r's rows of this rank's columns: end to end they are dim i whole
    # (the padded rows trail), so a reshape lines them up without a copy
    joined = recv.reshape((k * c_i, c_j) + moved.shape[2:])
    return xp.moveaxis(joined[:n_i, :size], (0, 1), (i, j))


def partition_value(x: Any, op: str, mesh: DeviceMesh, m: int) -> Any:
    """Replicate -> Partial(op): terms whose reduction is ``x`` (sum: x / k, as torch)."""
    if op == "sum":
        return x / x.dtype.type(mesh.size(m)) if x.dtype.kind in "fc" else _sum_terms(x, mesh, m)
    if op == "product" and _coord(mesh, m) != 0:
        return _xp(x).ones_like(x)
    return x


def _sum_terms(x: Any, mesh: DeviceMesh, m: int) -> Any:
    # integers cannot be divided exactly: the first rank keeps the value, the others zero
    return x if _coord(mesh, m) == 0 else _xp(x).zeros_like(x)


# ------------------------------------------------------------------ a whole change
def _shards_of(placements: Sequence[Placement], dim: int) -> List[int]:
    return [m for m, p in enumerate(placements) if isinstance(p, Shard) and p.dim == dim]


def _direct_swaps(src: Sequence[Placement], dst: Sequence[Placement]) -> List[int]:
    """Mesh dims whose Shard(i) -> Shard(j) can be one all_to_all (no other shard of i or j)."""
    out = []
    for m, (a, b) in enumerate(zip(src, dst)):
        if isinstance(a, Shard) and isinstance(b, Shard) and a.dim != b.dim:
            users = set(_shards_of(src, a.dim) + _shards_of(dst, a.dim)
                        + _shards_of(src, b.dim) + _shards_of(dst, b.dim))
            if users == {m}:
                out.append(m)
    return out


def _kept(src: Sequence[Placement], dst: Sequence[Placement], skip: List[int]) -> set:
    """Mesh dims whose Shard stays: the common prefix of each tensor dim's nesting."""
    kept = set()
    dims = {p.dim for p in list(src) + list(dst) if isinstance(p, Shard)}
    for d in dims:
        a = [m for m in _shards_of(src, d) if m not in skip]
        b = [m for m in _shards_of(dst, d) if m not in skip]
        for x, y in zip(a, b):
            if x != y:
                break
            kept.add(x)
    return kept


def redistribute_array(x: Any, shape: Sequence[int], mesh: DeviceMesh,
                       src: Sequence[Placement], dst: Sequence[Placement]) -> Any:
    """This rank's local array of a tensor of global ``shape`` moved from ``src`` to ``dst``.

    Every rank of the mesh calls it with the same arguments (apart from ``x``); each changed
    mesh dimension costs one collective over its group (two for a Shard whose nesting
    changes: undone, then redone).
    """
    cur = list(src)
    single = [m for m in range(mesh.ndim) if mesh.size(m) == 1 and cur[m] != dst[m]]
    if single:
        # a mesh dim of one rank: its only piece is the whole, its only term the sum, so the
        # change is no collective at all (as torch skips it); a copy keeps the result apart
        for m in single:
            cur[m] = dst[m]
        x = x.copy()
    swaps = _direct_swaps(cur, dst)
    for m in swaps:
        x = all_to_all_dim(x, cur[m].dim, dst[m].dim, shape[cur[m].dim], mesh, m)
        cur[m] = dst[m]
    kept = _kept(cur, dst, [])
    for m in reversed(range(mesh.ndim)):  # undo shards, innermost first
        p = cur[m]
        if isinstance(p, Shard) and m not in kept:
            n = _partial_length(shape, mesh, cur, m)
            x = all_gather_dim(x, p.dim, n, mesh, m)
            cur[m] = Replicate()
    for m, (p, q) in enumerate(zip(cur, dst)):  # reductions that end replicated
        if isinstance(p, Partial) and p != q and not isinstance(q, Shard):
            x = all_reduce_dim(x, p.reduce_op, mesh, m)
            cur[m] = Replicate()
    for m, q in enumerate(dst):  # shards and partial terms, outermost first
        p = cur[m]
        if p == q:
            continue
        if isinstance(q, Shard):
            x = (reduce_scatter_dim(x, q.dim, p.reduce_op, mesh, m) if isinstance(p, Partial)
                 else chunk_dim(x, q.dim, mesh, m))
        elif isinstance(q, Partial):
            x = partition_value(x, q.reduce_op, mesh, m)
        cur[m] = q
    return x


def _partial_length(shape: Sequence[int], mesh: DeviceMesh, cur: Sequence[Placement],
                    m: int) -> int:
    """The length of tensor dim ``cur[m].dim`` after the mesh dims before ``m`` cut it."""
    d = cur[m].dim
    n = shape[d]
    for m0 in range(m):
        if isinstance(cur[m0], Shard) and cur[m0].dim == d:
            n, _ = shard_size_and_offset(n, mesh.size(m0), _coord(mesh, m0))
    return n


# ------------------------------------------------------------------ autograd
def grad_layout(placements: Sequence[Placement]) -> Tuple[Placement, ...]:
    """The placements a DTensor's gradient is kept in (Partial's gradient is replicated)."""
    return tuple(Replicate() if isinstance(p, Partial) else p for p in placements)


def avg_factor(placements: Sequence[Placement], mesh: DeviceMesh) -> int:
    f = 1
    for m, p in enumerate(placements):
        if isinstance(p, Partial) and p.reduce_op == "avg":
            f *= mesh.size(m)
    return f


def _check_differentiable(placements: Sequence[Placement], where: str) -> None:
    bad = [p for p in placements if isinstance(p, Partial) and p.reduce_op not in
           Partial.LINEAR_REDUCE_OPS]
    if bad:
        raise RuntimeError(f"{where}: no gradient through {bad[0]!r}: only Partial('sum') and "
                           "Partial('avg') are linear in their terms; reduce to Replicate "
                           "outside autograd (or under no_grad) first")


class Redistribute(Function):
    """Differentiable redistribution of a local tensor (backward: the gradient moved back)."""

    @staticmethod
    def forward(ctx: Any, x: Any, shape: Tuple[int, ...], mesh: DeviceMesh,
                src: Tuple[Placement, ...], dst: Tuple[Placement, ...]) -> Any:
        ctx.spec = (shape, mesh, src, dst)
        return redistribute_array(x, shape, mesh, src, dst)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Tuple[Optional[Any], ...]:
        shape, mesh, src, dst = ctx.spec
        _check_differentiable(tuple(src) + tuple(dst), "DTensor.redistribute backward")
        g = redistribute_array(grad, shape, mesh, grad_layout(dst), grad_layout(src))
        scale = avg_factor(dst, mesh) / avg_factor(src, mesh)
        if scale != 1:
            g = g * g.dtype.type(scale)
        return g, None, None, None, None
