"""Sharding rules of the network layers' functions: ``softmax``/``log_softmax``,
``layer_norm`` and ``rms_norm``, ``embedding``, ``dropout``, and ``cat``/``stack``.

* softmax, log_softmax: a mesh dim sharding the normalised dim is gathered first, a
  Partial one reduced; every other Shard stays.
* layer_norm, rms_norm: the normalised (trailing) dims must be whole: a mesh dim sharding them is
  gathered first. Weight and bias are replicated; where the input is sharded their
  gradients are summed over that mesh dim.
* embedding: a table sharded on the vocabulary (``Shard(0)``) is looked up locally with the
  indices outside this rank's rows masked to zero: the output is ``Partial("sum")`` (each
  row lives on one rank). A table sharded on the embedding dim (``Shard(1)``) gives
  ``Shard(-1)``. Indices may be a plain tensor (the same on every rank) or a DTensor; a
  batch-sharded index tensor gives a batch-sharded output (the table replicated there).
* dropout: every element's mask is drawn by the rank holding it, so each mesh dim must
  shard the input (a replicated or partial piece would get a different mask per rank);
  outside training, or with ``p=0``, it is the identity.
* cat, stack: operands sharded alike on a dim other than the joined one keep it.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import mpitensor.nn.functional as F  # noqa: N812 - torch's spelling
from mpitensor.tensor import Tensor, where, zeros_like

from ._dispatch import OpCall, Sharding, register_sharding_rule
from ._utils import compute_local_shape_and_global_offset
from .placement_types import Partial, Placement, Replicate, Shard


def _arg(call: OpCall, i: int, name: str, default: Any = None) -> Any:
    return call.args[i] if len(call.args) > i else call.kwargs.get(name, default)


def _whole(placements: Sequence[Placement], dims: Sequence[int]) -> Tuple[Placement, ...]:
    """``placements`` with every Shard of one of ``dims`` and every Partial replicated."""
    return tuple(Replicate() if (isinstance(p, Shard) and p.dim in dims)
                 or isinstance(p, Partial) else p for p in placements)


def _softmax_rule(call: OpCall) -> Sharding:
    t = call.dtensors[0]
    dim = _arg(call, 1, "dim")
    if dim is None:
        raise call.fail("softmax needs dim (torch's implicit choice is deprecated)")
    if not isinstance(dim, int) or not -max(t.ndim, 1) <= dim < max(t.ndim, 1):
        raise call.fail(f"dim {dim!r} is out of range for a {t.ndim}-D tensor")
    want = _whole(t.placements, [dim % max(t.ndim, 1)])
    return Sharding(placements=want, shape=tuple(t.shape), inputs=[want])


def _layer_norm_rule(call: OpCall) -> Sharding:
    x = _arg(call, 0, "input")
    shape = _arg(call, 1, "normalized_shape")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if tuple(x.shape[x.ndim - len(shape):]) != shape:
        raise call.fail(f"normalized_shape {shape} does not match the input's trailing dims "
                        f"{tuple(x.shape)}")
    if not isinstance(x, tuple(type(d) for d in call.dtensors)) or x is not call.dtensors[0]:
        raise call.fail("the input must be a DTensor when the weight or bias is one")
    want = _whole(x.placements, range(x.ndim - len(shape), x.ndim))
    sums = tuple(m for m, p in enumerate(want) if isinstance(p, Shard))
    rep = tuple(Replicate() for _ in want)
    return Sharding(placements=want, shape=tuple(x.shape),
                    inputs=[want] + [rep] * (len(call.dtensors) - 1),
                    grad_sum=[()] + [sums] * (len(call.dtensors) - 1))


def _masked_lookup(lo: int, rows: int, padding_idx: Optional[int]) -> Any:
    """The local call of a vocabulary-sharded table: rows [lo, lo + rows) live here."""
    pad = None if padding_idx is None or not lo <= padding_idx < lo + rows else padding_idx - lo

    def lookup(idx: Any, weight: Any, *rest: Any, **kw: Any) -> Any:
        if rows == 0:  # a trailing rank of an uneven split holds no rows: its share is zero
            # (the dispatcher ties the table to it, so its backward takes part all the same)
            return weight.new_zeros((*idx.shape, weight.shape[-1]))
        local = idx - lo
        inside = (local >= 0) & (local < rows)
        safe = where(inside, local, zeros_like(local))
        out = F.embedding(safe, weight, pad)
        return out * inside.unsqueeze(-1).to(out.dtype)
    return lookup


def _embedding_rule(call: OpCall) -> Sharding:
    idx, w = _arg(call, 0, "input"), _arg(call, 1, "weight")
    if not isinstance(w, type(call.dtensors[-1])) or w is not call.dtensors[-1]:
        raise call.fail("the table (weight) must be a DTensor when the indices are one")
    if w.ndim != 2:
        raise call.fail(f"the table must be 2-D, got shape {tuple(w.shape)}")
    if _arg(call, 3, "max_norm") is not None and any(isinstance(p, Shard) for p in w.placements):
        raise call.fail("max_norm renormalises rows in place; use it on a replicated table")
    ip = idx.placements if len(call.dtensors) == 2 else (Replicate(),) * call.mesh.ndim
    wi: List[Placement] = []
    ww: List[Placement] = []
    out: List[Placement] = []
    sums: List[int] = []
    for m, (pi, pw) in enumerate(zip(ip, w.placements)):
        if isinstance(pi, Shard):
            wi.append(pi)
            ww.append(Replicate())
            out.append(pi)
            sums.append(m)
        elif isinstance(pw, Shard):
            wi.append(Replicate())
            ww.append(pw)
            out.append(Partial() if pw.dim == 0 else Shard(idx.ndim))
        else:
            wi.append(Replicate())
            ww.append(Replicate())
            out.append(Replicate())
    shape = tuple(idx.shape) + (w.shape[1],)
    inputs: List[Any] = [tuple(wi), tuple(ww)] if len(call.dtensors) == 2 else [tuple(ww)]
    grads: List[Any] = [(), tuple(sums)] if len(call.dtensors) == 2 else [tuple(sums)]
    fn = None
    if any(isinstance(p, Shard) and p.dim == 0 for p in ww):
        local, off = compute_local_shape_and_global_offset(tuple(w.shape), call.mesh, ww)
        fn = _masked_lookup(off[0], local[0], _arg(call, 2, "padding_idx"))
    return Sharding(placements=tuple(out), shape=shape, inputs=inputs, grad_sum=grads, fn=fn)


def _dropout_rule(call: OpCall) -> Sharding:
    t = call.dtensors[0]
    p = _arg(call, 1, "p", 0.5)
    training = _arg(call, 2, "training", True)
    if _arg(call, 3, "inplace", False):
        raise call.fail("in-place dropout on a DTensor is not supported; use inplace=False")
    if training and p > 0:
        bad = [m for m, q in enumerate(t.placements) if not isinstance(q, Shard)]
        if bad:
            raise call.fail(f"dropout in training needs every mesh dim to shard the input (mesh "
                            f"dims {bad} hold copies or partial terms, which would each draw "
                            "their own mask); shard it first or call it on .to_local()")
    return Sharding(placements=t.placements, shape=tuple(t.shape), inputs=[t.placements])


def _join_rule(stack: bool) -> Any:
    def rule(call: OpCall) -> Sharding:
        ts = _arg(call, 0, "tensors")
        dim = _arg(call, 1, "dim", 0)
        if any(t is not d for t, d in zip(ts, call.dtensors)) or len(ts) != len(call.dtensors):
            raise call.fail("every joined tensor must be a distinct DTensor")
        nd = ts[0].ndim + (1 if stack else 0)
        d = dim % nd
        outs: List[Placement] = []
        for m in range(call.mesh.ndim):
            ps = {t.placements[m] for t in ts}
            p = next(iter(ps))
            same = len(ps) == 1 and not (isinstance(p, Partial) and p.reduce_op not in
                                         ("sum", "avg"))
            if same and isinstance(p, Shard) and p.dim != d and not stack:
                outs.append(p)
            elif same and isinstance(p, Shard) and stack:
                outs.append(Shard(p.dim + (1 if p.dim >= d else 0)))
            else:
                outs.append(p if same and not isinstance(p, Shard) else Replicate())
        want = tuple(Shard(p.dim - (1 if stack and p.dim > d else 0)) if isinstance(p, Shard)
                     else p for p in outs)
        shape = list(ts[0].shape)
        if stack:
            shape.insert(d, len(ts))
        else:
            shape[d] = sum(t.shape[d] for t in ts)
        return Sharding(placements=tuple(outs), shape=tuple(shape), inputs=[want] * len(ts))
    return rule


def _register() -> None:
    for path in ("softmax", "log_softmax", "mpitensor.softmax", "mpitensor.log_softmax",
                 "mpitensor.nn.functional.softmax", "mpitensor.nn.functional.log_softmax"):
        if "." in path or hasattr(Tensor, path):
            register_sharding_rule(path, _softmax_rule)
    for name in ("layer_norm", "rms_norm"):  # the same placements: trailing dims whole
        register_sharding_rule(f"mpitensor.nn.functional.{name}", _layer_norm_rule)
    register_sharding_rule("mpitensor.nn.functional.embedding", _embedding_rule,
                           allow_plain_tensors=True)
    register_sharding_rule("mpitensor.nn.functional.dropout", _dropout_rule)
    register_sharding_rule("mpitensor.cat", _join_rule(False))
    register_sharding_rule("mpitensor.stack", _join_rule(True))


_register()

__all__: Sequence[str] = []
