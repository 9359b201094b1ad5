"""Sharding rules of the reductions: ``sum``, ``mean``, ``max``/``min`` (with or without a
dim), ``amax``/``amin``, ``argmax``/``argmin``, ``prod``, over any dims, with ``keepdim``.

Per mesh dimension:

* a ``Shard(d)`` whose dim ``d`` survives the reduction stays ``Shard`` of ``d``'s place in
  the output;
* a ``Shard(d)`` whose dim is reduced gives ``Partial("sum")`` for ``sum`` and ``mean``
  (``mean`` is run as the local sum over the global count, so uneven pieces weigh right);
  the other reductions are not sums of per-rank results that autograd can follow (and
  ``argmax`` names local positions), so that mesh dim is gathered first;
* ``Partial("sum"/"avg")`` passes through ``sum`` and ``mean`` (they are linear); the other
  reductions reduce it first; ``Replicate`` stays.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from mpitensor.tensor import Tensor
from mpitensor.tensor import __all__ as _TOP_LEVEL

from ._dispatch import OpCall, Sharding, register_sharding_rule
from ._rules_pointwise import pointwise_sharding
from .placement_types import Partial, Placement, Replicate, Shard

LINEAR = ("sum", "mean")
NOT_LINEAR = ("max", "min", "amax", "amin", "argmax", "argmin", "prod")


def _dims(call: OpCall, t: Any) -> Tuple[Optional[Tuple[int, ...]], bool]:
    """The reduced dims (None: all) and keepdim of a reduction call."""
    dim = call.args[1] if len(call.args) > 1 else call.kwargs.get("dim")
    keep = call.args[2] if len(call.args) > 2 else call.kwargs.get("keepdim", False)
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return None, bool(keep)
    dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    nd = max(t.ndim, 1)
    out = []
    for d in dims:
        if not isinstance(d, int) or not -nd <= d < nd:
            raise call.fail(f"dim {d!r} is out of range for a {t.ndim}-D tensor")
        out.append(d % nd)
    return tuple(sorted(set(out))), bool(keep)


def _out_shape(shape: Sequence[int], dims: Optional[Tuple[int, ...]],
               keep: bool) -> Tuple[int, ...]:
    if dims is None:
        return tuple(1 for _ in shape) if keep else ()
    return tuple(1 if i in dims else s for i, s in enumerate(shape)
                 if keep or i not in dims)


def _placements(call: OpCall, t: Any, dims: Optional[Tuple[int, ...]],
                keep: bool) -> Tuple[List[Placement], List[Placement]]:
    """Each mesh dim's input placement (after any gather) and output placement."""
    linear = call.op.rpartition(".")[2] in LINEAR
    reduced = set(range(t.ndim)) if dims is None else set(dims)
    wants: List[Placement] = []
    outs: List[Placement] = []
    for p in t.placements:
        if isinstance(p, Shard) and p.dim not in reduced:
            wants.append(p)
            outs.append(Shard(p.dim if keep else p.dim - sum(1 for r in reduced if r < p.dim)))
        elif isinstance(p, Shard) and linear:
            wants.append(p)
            outs.append(Partial("sum"))
        elif isinstance(p, Partial) and linear and p.reduce_op in ("sum", "avg"):
            wants.append(p)
            outs.append(p)
        else:
            wants.append(Replicate())
            outs.append(Replicate())
    return wants, outs


def _global_mean(count: int) -> Any:
    def mean(x: Any, dim: Any = None, keepdim: bool = False, **kw: Any) -> Any:
        if dim is None:
            return Tensor.sum(x, **kw) / count
        return Tensor.sum(x, dim, keepdim, **kw) / count
    return mean


def reduction_sharding(call: OpCall) -> Sharding:
    t = call.dtensors[0]
    other = call.args[1] if len(call.args) > 1 else call.kwargs.get("other")
    if isinstance(other, Tensor):  # max(a, b): the element-wise form
        return pointwise_sharding(call, None)
    first = call.args[0] if call.args else call.kwargs.get("input")
    if first is not t:
        raise call.fail("the reduced tensor must be the first argument")
    if not call.args:  # input= by keyword: the local calls take it first
        kw = {k: v for k, v in call.kwargs.items() if k != "input"}
        call = OpCall(call.op, (t,), kw, call.mesh, call.dtensors)
    dims, keep = _dims(call, t)
    wants, outs = _placements(call, t, dims, keep)
    shape = _out_shape(t.shape, dims, keep)
    name = call.op.rpartition(".")[2]
    fn = None
    if name == "mean" and any(isinstance(o, Partial) and isinstance(w, Shard)
                              for o, w in zip(outs, wants)):
        count = 1
        for i in (range(t.ndim) if dims is None else dims):
            count *= t.shape[i]
        fn = _global_mean(count)
    if name in ("max", "min") and dims is not None:  # values and indices
        return Sharding(placements=[tuple(outs)] * 2, shape=[shape] * 2, inputs=[tuple(wants)],
                        args=call.args, kwargs=call.kwargs, fn=_empty_safe(call.op, True))
    if name in NOT_LINEAR:
        fn = _empty_safe(call.op, False)
    return Sharding(placements=tuple(outs), shape=shape, inputs=[tuple(wants)], args=call.args,
                    kwargs=call.kwargs, fn=fn)


def _empty_safe(op: str, pair: bool) -> Any:
    """The local reduction; an empty piece (a trailing rank of an uneven split, whose
    output piece is empty too) is reduced by ``sum``, which takes empty operands."""
    name = op.rpartition(".")[2]
    method = getattr(Tensor, name)

    def run(x: Any, *a: Any, **kw: Any) -> Any:
        if x.numel() == 0:
            out = Tensor.sum(x, *a, **kw)
            out = out.long() if name.startswith("arg") else out
            return (out, out.long()) if pair else out
        if pair:
            values, indices = method(x, *a, **kw)
            return values, indices
        return method(x, *a, **kw)
    return run


def _register() -> None:
    for name in LINEAR + NOT_LINEAR:
        if hasattr(Tensor, name):
            register_sharding_rule(name, reduction_sharding)
        if name in _TOP_LEVEL:
            register_sharding_rule(f"mpitensor.{name}", reduction_sharding)


_register()

__all__ = ["reduction_sharding"]
