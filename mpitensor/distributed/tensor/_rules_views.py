"""Sharding rules of the view and shape ops: ``view``/``reshape``, ``flatten``/``unflatten``,
``transpose``/``permute``/``t``, ``squeeze``/``unsqueeze``; ``view_as_complex``/``view_as_real``.

A sharded dimension keeps its Shard when it survives the reshape whole, or when it becomes
the outermost part of a merged dimension (or is split and keeps its outermost part) and the
mesh divides it evenly: then every rank's piece is still a contiguous block of the new
dimension. Otherwise ``reshape``-like ops gather that mesh dimension first (all_gather) and
``view`` refuses, as a view cannot move data. Replicate and Partial pass through.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from mpitensor.tensor import Tensor

from ._dispatch import OpCall, Sharding, register_sharding_rule
from ._utils import compute_local_shape_and_global_offset
from .placement_types import Placement, Replicate, Shard


def _prod(xs: Sequence[int]) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _target_shape(call: OpCall, shape: Sequence[Any]) -> Tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    shape = [int(s) for s in shape]
    total = call.dtensors[0].numel()
    if shape.count(-1) > 1:
        raise call.fail(f"shape {tuple(shape)} has more than one -1")
    if -1 in shape:
        rest = _prod([s for s in shape if s != -1])
        if rest == 0 or total % rest:
            raise call.fail(f"shape {tuple(shape)} is invalid for {total} elements")
        shape[shape.index(-1)] = total // rest
    if _prod(shape) != total:
        raise call.fail(f"shape {tuple(shape)} is invalid for {total} elements")
    return tuple(shape)


def _mesh_share(placements: Sequence[Placement], dim: int, mesh: Any) -> int:
    """How many pieces the mesh cuts tensor dim ``dim`` into."""
    return _prod([mesh.size(m) for m, p in enumerate(placements)
                  if isinstance(p, Shard) and p.dim == dim])


def _map_dim(src: Sequence[int], dst: Sequence[int], d: int, pieces: int) -> Optional[int]:
    """The dim of ``dst`` that input dim ``d`` (cut in ``pieces``) maps to, or None."""
    before = _prod(src[:d])
    starts = [o for o in range(len(dst)) if _prod(dst[:o]) == before]
    for o in starts:  # the dim kept whole
        if dst[o] == src[d]:
            return o
    for o in starts:  # merged or split: the pieces stay blocks when both divide evenly
        if dst[o] != 1:
            return o if src[d] % pieces == 0 and dst[o] % pieces == 0 else None
    return None


def reshape_sharding(call: OpCall, out_shape: Tuple[int, ...], may_move: bool,
                     fn: Any) -> Sharding:
    """The sharding of a reshape of the first operand to ``out_shape`` (global)."""
    t = call.dtensors[0]
    src = tuple(t.shape)
    wants: List[Placement] = []
    outs: List[Placement] = []
    for m, p in enumerate(t.placements):
        if not isinstance(p, Shard):
            wants.append(p)
            outs.append(p)
            continue
        o = _map_dim(src, out_shape, p.dim, _mesh_share(t.placements, p.dim, call.mesh))
        if o is None:
            if not may_move:
                raise call.fail(f"a view to {out_shape} cannot keep {p!r} on mesh dim {m} "
                                "(the pieces would not be blocks of the new shape); use "
                                "reshape, or redistribute first")
            wants.append(Replicate())
            outs.append(Replicate())
            continue
        wants.append(p)
        outs.append(Shard(o))
    local, _ = compute_local_shape_and_global_offset(out_shape, call.mesh, outs)
    return Sharding(placements=tuple(outs), shape=out_shape, inputs=[tuple(wants)],
                    args=(t, local), kwargs={}, fn=fn)


def _view(may_move: bool, fn: Any) -> Any:
    def rule(call: OpCall) -> Sharding:
        shape = call.args[1:] or (call.kwargs.get("size") or call.kwargs.get("shape"),)
        if shape == (None,):
            raise call.fail("no shape given")
        return reshape_sharding(call, _target_shape(call, shape), may_move, fn)

    return rule


def _norm(d: int, n: int, call: OpCall) -> int:
    if not -max(n, 1) <= d < max(n, 1):
        raise call.fail(f"dim {d} is out of range for {n} dimensions")
    return d % max(n, 1)


def _flatten_rule(call: OpCall) -> Sharding:
    t = call.dtensors[0]
    args = list(call.args[1:]) + [None, None]
    start = call.kwargs.get("start_dim", args[0] if args[0] is not None else 0)
    end = call.kwargs.get("end_dim", args[1] if args[1] is not None else -1)
    shape = list(t.shape)
    if not shape:
        return reshape_sharding(call, (1,), True, Tensor.reshape)
    s, e = _norm(start, len(shape), call), _norm(end, len(shape), call)
    out = tuple(shape[:s]) + (_prod(shape[s:e + 1]),) + tuple(shape[e + 1:])
    return reshape_sharding(call, out, True, Tensor.reshape)


def _unflatten_rule(call: OpCall) -> Sharding:
    t = call.dtensors[0]
    args = list(call.args[1:])
    dim = call.kwargs.get("dim", args[0] if args else None)
    sizes = list(call.kwargs.get("sizes", args[1] if len(args) > 1 else ()))
    shape = list(t.shape)
    d = _norm(dim, len(shape), call)
    if -1 in sizes:
        rest = _prod([x for x in sizes if x != -1])
        sizes[sizes.index(-1)] = shape[d] // rest if rest else 0
    if _prod(sizes) != shape[d]:
        raise call.fail(f"sizes {sizes} do not multiply to dim {d}'s {shape[d]}")
    return reshape_sharding(call, tuple(shape[:d] + sizes + shape[d + 1:]), True,
                            Tensor.reshape)


def _squeeze_rule(call: OpCall) -> Sharding:
    t = call.dtensors[0]
    shape = list(t.shape)
    dim = call.kwargs.get("dim", call.args[1] if len(call.args) > 1 else None)
    if dim is None:
        drop = [i for i, s in enumerate(shape) if s == 1]
    else:
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        drop = [i for i in (_norm(x, len(shape), call) for x in dims) if shape[i] == 1]
    out = tuple(s for i, s in enumerate(shape) if i not in drop)
    return reshape_sharding(call, out, True, Tensor.reshape)


def _unsqueeze_rule(call: OpCall) -> Sharding:
    t = call.dtensors[0]
    dim = call.kwargs.get("dim", call.args[1] if len(call.args) > 1 else None)
    d = _norm(dim, t.ndim + 1, call)
    out = tuple(t.shape)[:d] + (1,) + tuple(t.shape)[d:]
    outs = tuple(Shard(p.dim + (p.dim >= d)) if isinstance(p, Shard) else p
                 for p in t.placements)
    return Sharding(placements=outs, shape=out)


def _permuted(call: OpCall, perm: Sequence[int]) -> Sharding:
    t = call.dtensors[0]
    outs = tuple(Shard(list(perm).index(p.dim)) if isinstance(p, Shard) else p
                 for p in t.placements)
    return Sharding(placements=outs, shape=tuple(t.shape[i] for i in perm))


def _permute_rule(call: OpCall) -> Sharding:
    t = call.dtensors[0]
    dims = call.args[1:] or (call.kwargs.get("dims"),)
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    perm = [_norm(d, t.ndim, call) for d in dims]
    if sorted(perm) != list(range(t.ndim)):
        raise call.fail(f"dims {tuple(dims)} are not a permutation of {t.ndim} dims")
    return _permuted(call, perm)


def _transpose_rule(call: OpCall) -> Sharding:
    t = call.dtensors[0]
    args = list(call.args[1:])
    a = call.kwargs.get("dim0", args[0] if args else None)
    b = call.kwargs.get("dim1", args[1] if len(args) > 1 else None)
    perm = list(range(t.ndim))
    if t.ndim:
        i, j = _norm(a, t.ndim, call), _norm(b, t.ndim, call)
        perm[i], perm[j] = perm[j], perm[i]
    return _permuted(call, perm)


def _t_rule(call: OpCall) -> Sharding:
    t = call.dtensors[0]
    if t.ndim > 2:
        raise call.fail(f"t() expects at most 2 dimensions, got {t.ndim}")
    return _permuted(call, list(range(t.ndim))[::-1])


def _complex_rule(to_complex: bool) -> Any:
    """``view_as_complex`` (drops the last dim of pairs) or ``view_as_real`` (adds one): a
    Shard of another dim keeps its place; the pairs' dim, sharded, is gathered first."""

    def rule(call: OpCall) -> Sharding:
        t = call.dtensors[0]
        shape, last = tuple(t.shape), t.ndim - 1
        ins = tuple(Replicate() if to_complex and isinstance(p, Shard) and p.dim % t.ndim == last
                    else Shard(p.dim % t.ndim) if isinstance(p, Shard) else p
                    for p in t.placements)
        out = shape[:-1] if to_complex else shape + (2,)
        return Sharding(placements=ins, shape=out,
                        inputs=None if ins == tuple(t.placements) else [ins])

    return rule


def _register() -> None:
    rules = {"view": _view(False, Tensor.view), "reshape": _view(True, Tensor.reshape),
             "flatten": _flatten_rule, "unflatten": _unflatten_rule,
             "squeeze": _squeeze_rule, "unsqueeze": _unsqueeze_rule,
             "permute": _permute_rule, "transpose": _transpose_rule,
             "swapaxes": _transpose_rule, "swapdims": _transpose_rule, "t": _t_rule}
    for name, rule in rules.items():
        if hasattr(Tensor, name):
            register_sharding_rule(name, rule)
    register_sharding_rule("mpitensor.view_as_complex", _complex_rule(True))
    register_sharding_rule("mpitensor.view_as_real", _complex_rule(False))


_register()

__all__ = ["reshape_sharding"]
