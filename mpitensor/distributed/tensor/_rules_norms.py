"""Norms of DTensors: the sharding rules of ``Tensor.norm``, ``linalg.vector_norm`` and
``linalg.matrix_norm`` (so ``linalg.norm``), and the per-tensor norm terms that gradient
clipping combines.

A p-norm over a sharded dimension is a norm of the pieces' norms: each rank computes the norm
of its piece, and the pieces' norms combine over the mesh dimensions that shard a reduced
tensor dimension (the sum of their p-th powers, then the p-th root). So per mesh dimension:

* a ``Shard(d)`` whose dim ``d`` survives stays ``Shard`` of ``d``'s place in the output;
* a ``Shard(d)`` whose dim is reduced, for a finite ``p > 0``: the local norms combine with
  one all_reduce over that mesh dimension (backward: each piece's norm gets
  ``g * (n_r / n)^(p-1)``, no collective); for ``inf``, ``-inf``, 0 and ``p < 0`` that
  mesh dim is gathered first (the ties of a max and the counts are not sums);
* ``Partial`` is reduced first (a norm is not linear in the terms); ``Replicate`` stays,
  counted once.

The output is Replicate on the mesh dims that combined. Matrix norms (see
:func:`matrix_norm_sharding`) keep a batch dim's Shard; ``"fro"`` is the vector rule over the
two matrix dims; 1/-1/inf/-inf combine sums of ``|x|`` and then take a max or min; ``"nuc"``
and 2/-2 gather the matrix dims first (singular values need the whole matrix).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import mpitensor.distributed as dist
from mpitensor import backend as _backend
from mpitensor._ops.norms import matrix_norm as _local_matrix_norm
from mpitensor._ops.norms import vector_norm as _local_vector_norm
from mpitensor.autograd import ArrayFunction as Function

from ._dispatch import OpCall, Sharding, register_sharding_rule
from ._redistribute import avg_factor, redistribute_array
from .placement_types import Partial, Placement, Replicate, Shard

__all__ = ["norm_pieces", "combine_terms", "local_grads", "replicated", "vector_norm_sharding",
           "matrix_norm_sharding", "mesh_dim_roles"]

_ALL_REDUCE = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


# ------------------------------------------------------------------ gradient clipping
def _is_dtensor(t: Any) -> bool:
    from ._api import DTensor

    return isinstance(t, DTensor)


def norm_pieces(tensors: Sequence[Any]) -> Tuple[List[Any], List[Any], Any]:
    """The arrays whose norms are this rank's terms of each tensor's norm.

    Returns:
        ``(arrays, where, mesh)``: per tensor, the array (a DTensor's local piece, a
        ``Partial`` reduced first; a plain tensor's own array), and ``(mesh, dims)``: the mesh
        dims over which the terms combine (those that shard the tensor; ``None`` for a plain
        tensor, counted once); ``mesh`` is the first DTensor's mesh (None: none).
    """
    arrays, where, first = [], [], None
    for t in tensors:
        if not _is_dtensor(t):
            arrays.append(t._data)
            where.append(None)
            continue
        mesh, placements = t.device_mesh, t.placements
        first = first if first is not None else mesh
        local = t.to_local()._data
        if any(isinstance(p, Partial) for p in placements):
            whole = tuple(Replicate() if isinstance(p, Partial) else p for p in placements)
            local = redistribute_array(local, tuple(t.shape), mesh, placements, whole)
        arrays.append(local)
        where.append((mesh, tuple(m for m, p in enumerate(placements)
                                  if isinstance(p, Shard))))
    return arrays, where, first


def combine_terms(terms: List[Any], where: List[Any], op: str) -> List[Any]:
    """Each tensor's terms (0-d arrays) reduced with ``op`` over its mesh dims: one
    all_reduce per mesh dim and group of tensors alike (mesh, dims, dtype), the same calls in
    the same order on every rank whatever its pieces hold. For ``max``/``min`` a NaN term
    makes the result NaN on every rank (MPI's max and min drop NaNs in an order that may
    differ from rank to rank)."""
    groups: Dict[Any, Tuple[Any, Tuple[int, ...], List[int]]] = {}
    for i, w in enumerate(where):
        if w is not None and w[1]:
            key = (id(w[0]), w[1], terms[i].dtype.str)
            groups.setdefault(key, (w[0], w[1], []))[2].append(i)
    out = list(terms)
    for mesh, dims, idx in groups.values():
        xp = _backend.array_module(terms[idx[0]])
        vals = xp.stack([terms[i] for i in idx])
        nan = xp.isnan(vals)
        if op != "sum":
            fill = math.inf if op == "max" else -math.inf
            sign = 1.0 if op == "max" else -1.0
            vals = xp.concatenate([xp.where(nan, fill, vals), sign * nan.astype(vals.dtype)])
        for m in dims:
            dist.all_reduce(vals, op=_ALL_REDUCE[op], group=mesh.get_group(m))
        if op != "sum":
            k = len(idx)
            vals = xp.where(vals[k:] != 0, math.nan, vals[:k])
        for j, i in enumerate(idx):
            out[i] = vals[j]
    return out


def replicated(value: Any, mesh: Any) -> Any:
    """``value`` (the same on every rank) as a DTensor replicated over ``mesh``."""
    from ._api import DTensor

    return DTensor.from_local(value, mesh, [Replicate()] * mesh.ndim)


def local_grads(parameters: Sequence[Any]) -> List[Tuple[Any, float]]:
    """Per parameter with a gradient: the array that holds it on this rank and the factor
    its values carry there (the gradient is ``array * factor``: ``Partial("avg")`` keeps
    the gradient over the mesh dim's size), for the in-place clipping writes."""
    out = []
    for p in parameters:
        if _is_dtensor(p):
            g = p.to_local().grad
            if g is not None:
                out.append((g._data, float(avg_factor(p.placements, p.device_mesh))))
        elif p.grad is not None:
            g = p.grad
            out.append((g.to_local()._data if _is_dtensor(g) else g._data, 1.0))
    return out


# ------------------------------------------------------------------ the norm rule
class _CombineNorms(Function):
    """The pieces' p-norms (finite ``p > 0``) -> the norm of the whole: all_reduce of their
    p-th powers over the mesh dims, then the root. Backward: ``g * (n_r / n)^(p-1)``."""

    @staticmethod
    def forward(ctx: Any, n: Any, p: float, mesh: Any, dims: Tuple[int, ...]) -> Any:
        xp = _backend.array_module(n)
        work = n.astype("float32") if n.dtype.itemsize < 4 else n
        s = xp.array(work ** p)  # a C-contiguous copy that keeps a 0-d shape (not 1-d)
        for m in dims:
            dist.all_reduce(s, group=mesh.get_group(m))
        total = s ** (1.0 / p)
        ctx.meta = p
        ctx.save_for_backward(work, total)
        return xp.asarray(total.astype(n.dtype, copy=False))

    @staticmethod
    def backward(ctx: Any, g: Any) -> Tuple[Any, ...]:
        xp = _backend.array_module(g)
        p = ctx.meta
        n, total = ctx.saved_tensors
        zero = (total == 0) | (n == 0)
        with np.errstate(all="ignore"):
            share = (n / xp.where(zero, 1, total)) ** (p - 1)
        gn = xp.where(zero, 0, g * share)
        return gn.astype(g.dtype, copy=False), None, None, None


def _raw_order(call: OpCall, default: Any) -> Any:
    a = call.args
    return a[1] if len(a) > 1 else call.kwargs.get("p", call.kwargs.get("ord", default))


def _order(call: OpCall) -> float:
    """The call's p as a float: ``norm``'s ``p`` (``"fro"``/None: 2) or ``ord``."""
    raw = _raw_order(call, 2)
    if raw is None or raw == "fro":
        return 2.0
    if isinstance(raw, str):
        raise ValueError(f"{call.op}: p must be 'fro', 'nuc' or a number, got {raw!r}")
    return float(raw)


def _reduced(call: OpCall, ndim: int) -> Tuple[Optional[Tuple[int, ...]], bool, Any]:
    a, kw = call.args, call.kwargs
    dim = a[2] if len(a) > 2 else kw.get("dim")
    keep = bool(a[3] if len(a) > 3 else kw.get("keepdim", False))
    dtype = a[4] if len(a) > 4 else kw.get("dtype")
    if dim is None:
        return None, keep, dtype
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if not dims:
        return None, keep, dtype
    nd = max(ndim, 1)
    for d in dims:
        if not isinstance(d, int) or not -nd <= d < nd:
            raise call.fail(f"dim {d!r} is out of range for a {ndim}-D tensor")
    return tuple(sorted({d % nd for d in dims})), keep, dtype


def mesh_dim_roles(placements: Sequence[Placement], reduced: Any,
                   keep_reduced: bool) -> List[Optional[str]]:
    """Each mesh dim's role for an op that reduces the tensor dims ``reduced``: ``"kept"``
    (a Shard of a dim that survives: the op runs on the pieces), ``"combined"`` (a Shard of a
    reduced dim, where ``keep_reduced``: the op runs on the pieces and combines their results
    across that mesh dim) or None (the op needs the mesh dim replicated first)."""
    roles: List[Optional[str]] = []
    for pl in placements:
        sharded = isinstance(pl, Shard)
        roles.append("kept" if sharded and pl.dim not in reduced
                     else "combined" if sharded and keep_reduced else None)
    return roles


def _layout(t: Any, dims: Optional[Tuple[int, ...]], keep: bool, keep_reduced: bool
            ) -> Tuple[List[Placement], List[Placement], Tuple[int, ...]]:
    """Each mesh dim's input placement, output placement, and the mesh dims that combine."""
    reduced = set(range(t.ndim)) if dims is None else set(dims)
    roles = mesh_dim_roles(t.placements, reduced, keep_reduced)
    wants = [pl if role else Replicate() for pl, role in zip(t.placements, roles)]
    outs = [Shard(pl.dim if keep else pl.dim - sum(1 for r in reduced if r < pl.dim))
            if role == "kept" else Replicate() for pl, role in zip(t.placements, roles)]
    return wants, outs, tuple(m for m, role in enumerate(roles) if role == "combined")


def _first_operand(call: OpCall) -> Any:
    t = call.dtensors[0]
    a, kw = call.args, call.kwargs
    if (a[0] if a else kw.get("input", kw.get("x", kw.get("A", kw.get("a"))))) is not t:
        raise call.fail("the DTensor must be the first argument")
    return t


def _out_shape(t: Any, dims: Optional[Tuple[int, ...]], keep: bool) -> Tuple[int, ...]:
    return tuple(1 if dims is None or i in dims else s for i, s in enumerate(t.shape)
                 if keep or (dims is not None and i not in dims))


def vector_norm_sharding(call: OpCall) -> Sharding:
    """The rule of ``Tensor.norm`` and ``linalg.vector_norm`` (see the module's notes);
    ``Tensor.norm(p="nuc")`` goes to :func:`matrix_norm_sharding`."""
    t = _first_operand(call)
    if _raw_order(call, 2) == "nuc":
        return matrix_norm_sharding(call)
    dims, keep, dtype = _reduced(call, t.ndim)
    return _vector_sharding(call, t, _order(call), dims, keep, dtype)


def _vector_sharding(call: OpCall, t: Any, p: float, dims: Optional[Tuple[int, ...]],
                     keep: bool, dtype: Any) -> Sharding:
    wants, outs, combine = _layout(t, dims, keep, math.isfinite(p) and p > 0)
    shape = _out_shape(t, dims, keep)
    mesh = call.mesh

    def local(x: Any) -> Any:
        # an empty piece (a trailing rank of an uneven split) has an empty output piece, or
        # terms that are zero: its 1-norm has the shape, where inf's would refuse it
        n = _local_vector_norm(x, p if x.numel() else 1.0, dims, keep, dtype=dtype)
        return _CombineNorms.apply(n, p, mesh, combine) if combine else n

    return Sharding(placements=tuple(outs), shape=shape, inputs=[tuple(wants)], args=(t,),
                    kwargs={}, fn=local)


# ------------------------------------------------------------------ matrix norms
_MATRIX_ORDS = ("fro", "nuc", 1, -1, 2, -2, math.inf, -math.inf)


def _matrix_args(call: OpCall, t: Any) -> Tuple[Any, Tuple[int, int], bool, Any]:
    """``(ord, (d0, d1), keepdim, dtype)`` of a matrix-norm call, checked as the plain op
    checks them (``ValueError`` on every rank alike)."""
    a, kw = call.args, call.kwargs
    order = _raw_order(call, "fro")
    dim = a[2] if len(a) > 2 else kw.get("dim")
    keep = bool(a[3] if len(a) > 3 else kw.get("keepdim", False))
    dtype = a[4] if len(a) > 4 else kw.get("dtype")
    if t.ndim < 2:
        raise ValueError(f"{call.op}: a matrix norm needs at least 2 dimensions, the DTensor "
                         f"has shape {tuple(t.shape)}")
    pair = (-2, -1) if dim is None else tuple(dim)
    if len(pair) != 2 or not all(isinstance(d, int) and -t.ndim <= d < t.ndim for d in pair) \
            or pair[0] % t.ndim == pair[1] % t.ndim:
        raise ValueError(f"{call.op}: dim must name two different dimensions of a "
                         f"{t.ndim}-D tensor, got {dim!r}")
    if isinstance(order, bool) or order not in _MATRIX_ORDS:
        raise ValueError(f"{call.op}: ord must be 'fro', 'nuc', inf, -inf, 1, -1, 2 or -2, "
                         f"got {order!r}")
    return order, (pair[0] % t.ndim, pair[1] % t.ndim), keep, dtype


def _sums_then_extreme(x: Any, order: float, pair: Tuple[int, int], keep: bool, shape: Any,
                       mesh: Any, placements: Sequence[Placement]) -> Any:
    """ord 1/-1/inf/-inf on this rank's piece: the sums of |x| over one matrix dim (partial
    where a mesh dim shards it), made whole with one differentiable redistribution (the
    partial sums reduced, the pieces along the other matrix dim gathered: small, one entry
    per row or column), then the max or min over the other matrix dim."""
    sum_dim, pick_dim = pair if order in (1, -1) else pair[::-1]
    sums = x.abs().sum(sum_dim, keepdim=True)
    src = tuple(Partial() if isinstance(pl, Shard) and pl.dim == sum_dim else pl
                for pl in placements)
    dst = tuple(Replicate() if isinstance(pl, Shard) and pl.dim in pair else pl
                for pl in placements)
    if src != dst:
        from ._redistribute import Redistribute

        whole = tuple(1 if i == sum_dim else n for i, n in enumerate(shape))
        sums = Redistribute.apply(sums, whole, mesh, src, dst)
    if sums.numel() == 0:  # an empty piece of a batch dim: nothing to pick from
        out = sums.sum(pick_dim, keepdim=True)
    else:
        out = sums.amax(pick_dim, keepdim=True) if order > 0 else \
            sums.amin(pick_dim, keepdim=True)
    return out if keep else out.squeeze(pair)


def matrix_norm_sharding(call: OpCall) -> Sharding:
    """The rule of ``linalg.matrix_norm`` (so of ``linalg.norm``'s matrix case) and of
    ``Tensor.norm(p="nuc")``.

    A Shard of a batch dim stays (each rank computes its matrices' norms). Over the matrix
    dims: ``"fro"`` is the vector 2-norm of the pair (local norms, one all_reduce of their
    squares); 1/-1/inf/-inf sum |x| over one matrix dim on the pieces and take the max or min
    over the other after one redistribution of those sums; ``"nuc"``/2/-2 need every
    singular value, so a mesh dim that shards a matrix dim is gathered first (torch also
    replicates the matrices there). ``Partial`` is reduced first (no norm is linear).
    """
    t = _first_operand(call)
    order, pair, keep, dtype = _matrix_args(call, t)
    if order == "fro":
        return _vector_sharding(call, t, 2.0, tuple(sorted(pair)), keep, dtype)
    svd = order in ("nuc", 2, -2)
    wants, outs, _ = _layout(t, pair, keep, not svd)
    shape = _out_shape(t, pair, keep)
    mesh, whole = call.mesh, tuple(t.shape)

    def local(x: Any) -> Any:
        if dtype is not None:
            x = x.to(dtype)
        if svd:
            return _local_matrix_norm(x, order, pair, keep)
        return _sums_then_extreme(x, order, pair, keep, whole, mesh, wants)

    return Sharding(placements=tuple(outs), shape=shape, inputs=[tuple(wants)], args=(t,),
                    kwargs={}, fn=local)


def _register() -> None:
    register_sharding_rule("norm", vector_norm_sharding)
    register_sharding_rule("mpitensor.linalg.vector_norm", vector_norm_sharding)
    register_sharding_rule("mpitensor.linalg.matrix_norm", matrix_norm_sharding)


_register()
