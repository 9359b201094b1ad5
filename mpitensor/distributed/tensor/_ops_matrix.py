"""Sharding rules of the matrix products: ``matmul``/``@``, ``mm``, ``bmm``, ``addmm``,
``nn.functional.linear``.

Each product is described by labels, one per dimension of each operand and of the output
(``mm``: ``x[M, K] @ w[K, N] -> [M, N]``; ``linear``: ``x[..., K], w[N, K] -> [..., N]``;
batch dims broadcast as ``matmul`` broadcasts them). Labels of the operands missing from
the output are contracted. Per mesh dimension, the output takes:

* ``Shard`` of an output label that an operand is sharded on (a batch dim, ``M`` or ``N``):
  the operands holding that label are cut the same way, the others stay replicated and
  their gradient is summed over the mesh dim (Replicate x Shard(0) of a linear weight ->
  Shard(-1); a batch-sharded input -> Shard(0));
* ``Partial("sum")`` when an operand is sharded on a contracted label: the other product
  operands are cut the same way (Shard(-1) input x Shard(1) weight -> Partial); an added
  term (a bias) is made Partial too (each rank adds its ``1/k``);
* ``Partial`` when one product operand is ``Partial("sum")`` and the others replicated
  (the product is linear in it);
* ``Replicate`` otherwise (partial operands reduced first).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import mpitensor.nn.functional as F  # noqa: N812 - linear gets a rule below
from mpitensor.tensor import Tensor

from ._dispatch import OpCall, Sharding, register_sharding_rule
from .placement_types import Partial, Placement, Replicate, Shard

Labels = Tuple[Any, ...]


def _batch(nd: int, out_nd: int, shape: Sequence[int], out_shape: Sequence[int],
           tag: str) -> List[Any]:
    """Labels of an operand's batch dims, right-aligned to the output's; a dim broadcast
    (size 1 against a larger one) gets a label of its own (so it is never shared)."""
    labs: List[Any] = []
    for i in range(nd):
        o = i + out_nd - nd
        labs.append(("b", o) if shape[i] == out_shape[o] else (tag, i))
    return labs


def _matmul_labels(call: OpCall, a: Any, b: Any) -> Tuple[Labels, Labels, Labels, tuple]:
    if a.ndim == 0 or b.ndim == 0:
        raise call.fail("both operands must have at least one dimension")
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise call.fail(f"the inner dimensions differ ({ka} and {kb})")
    if a.ndim == 1 and b.ndim == 1:
        return ("K",), ("K",), (), ()
    if b.ndim == 1:
        return (*[("b", i) for i in range(a.ndim - 2)], "M", "K"), ("K",), \
            (*[("b", i) for i in range(a.ndim - 2)], "M"), tuple(a.shape[:-1])
    if a.ndim == 1:
        return ("K",), (*[("b", i) for i in range(b.ndim - 2)], "K", "N"), \
            (*[("b", i) for i in range(b.ndim - 2)], "N"), tuple(b.shape[:-2]) + (b.shape[-1],)
    try:
        batch = tuple(np.broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-2])))
    except ValueError:
        raise call.fail(f"the batch shapes {tuple(a.shape[:-2])} and {tuple(b.shape[:-2])} "
                        "do not broadcast") from None
    nb = len(batch)
    la = _batch(a.ndim - 2, nb, a.shape[:-2], batch, "x") + ["M", "K"]
    lb = _batch(b.ndim - 2, nb, b.shape[:-2], batch, "y") + ["K", "N"]
    lo = [("b", i) for i in range(nb)] + ["M", "N"]
    return tuple(la), tuple(lb), tuple(lo), batch + (a.shape[-2], b.shape[-1])


def _added(labels_out: Labels, out_shape: Sequence[int], t: Any) -> Labels:
    """Labels of a term added to the product (a bias), broadcast against the output."""
    n = len(labels_out)
    return tuple(labels_out[i + n - t.ndim] if t.shape[i] == out_shape[i + n - t.ndim]
                 else ("bias", i) for i in range(t.ndim))


def _shard_on(dts: Sequence[Any], labels: Sequence[Labels], m: int,
              want: Any) -> Optional[Any]:
    for d, lab in zip(dts, labels):
        p = d.placements[m]
        if isinstance(p, Shard) and want(lab[p.dim]):
            return lab[p.dim]
    return None


def _decide(dts: Sequence[Any], labels: Sequence[Labels], out: Labels, nprod: int,
            m: int) -> Tuple[Placement, List[Placement], List[bool]]:
    """Output placement on mesh dim ``m``, each operand's, and which get grad_sum.
    The first ``nprod`` operands are the product's factors, the rest added terms."""
    contracted = {x for lab in labels[:nprod] for x in lab if x not in out}
    lab = _shard_on(dts, labels, m, lambda x: x in out)
    if lab is not None:
        wants = [Shard(ls.index(lab)) if lab in ls else Replicate() for ls in labels]
        return Shard(out.index(lab)), wants, [lab not in ls for ls in labels]
    lab = _shard_on(dts[:nprod], labels[:nprod], m, lambda x: x in contracted)
    if lab is not None:
        wants = [Shard(ls.index(lab)) if lab in ls else Partial() for ls in labels]
        return Partial(), wants, [False] * len(dts)
    ps = [d.placements[m] for d in dts]
    sums = [i for i in range(nprod) if ps[i] == Partial("sum")]
    if sums:
        i = sums[0]
        wants = [Replicate()] * nprod + [Partial()] * (len(dts) - nprod)
        wants[i] = Partial()
        grads = [j != i for j in range(nprod)] + [False] * (len(dts) - nprod)
        return Partial(), wants, grads
    return Replicate(), [Replicate()] * len(dts), [False] * len(dts)


def contraction_sharding(call: OpCall, operands: Sequence[Any], labels: Sequence[Labels],
                         out: Labels, out_shape: tuple, nprod: int) -> Sharding:
    """The sharding of a product of ``operands[:nprod]`` plus the terms after them."""
    idx = {id(d): i for i, d in enumerate(call.dtensors)}
    pos = [idx.get(id(o)) for o in operands]
    dts = [o for o, p in zip(operands, pos) if p is not None]
    labs = [lab for lab, p in zip(labels, pos) if p is not None]
    nprod_d = sum(1 for p in pos[:nprod] if p is not None)
    wants: List[List[Placement]] = [[] for _ in dts]
    sums: List[List[int]] = [[] for _ in dts]
    outs: List[Placement] = []
    for m in range(call.mesh.ndim):
        target, w, s = _decide(dts, labs, out, nprod_d, m)
        outs.append(target)
        for i in range(len(dts)):
            wants[i].append(w[i])
            if s[i]:
                sums[i].append(m)
    inputs: List[Optional[tuple]] = [None] * len(call.dtensors)
    grads: List[tuple] = [()] * len(call.dtensors)
    for d, w, s in zip(dts, wants, sums):
        inputs[idx[id(d)]] = tuple(w)
        grads[idx[id(d)]] = tuple(s)
    return Sharding(placements=tuple(outs), shape=tuple(out_shape), inputs=inputs,
                    grad_sum=grads)


def _arg(call: OpCall, i: int, name: str, default: Any = None) -> Any:
    return call.args[i] if len(call.args) > i else call.kwargs.get(name, default)


def _matmul_rule(call: OpCall) -> Sharding:
    a, b = _arg(call, 0, "input"), _arg(call, 1, "other", _arg(call, 1, "mat2"))
    la, lb, lo, shape = _matmul_labels(call, a, b)
    return contraction_sharding(call, [a, b], [la, lb], lo, shape, 2)


def _two_d(call: OpCall, *ts: Any) -> None:
    for t in ts:
        if t.ndim != 2:
            raise call.fail(f"{call.op} takes 2-D matrices, got {t.ndim}-D")


def _mm_rule(call: OpCall) -> Sharding:
    a, b = call.args[0], _arg(call, 1, "mat2")
    _two_d(call, a, b)
    return _matmul_rule(call)


def _bmm_rule(call: OpCall) -> Sharding:
    a, b = call.args[0], _arg(call, 1, "mat2")
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0]:
        raise call.fail("bmm takes two 3-D tensors with the same batch size")
    return _matmul_rule(call)


def _addmm_rule(call: OpCall) -> Sharding:
    bias, a, b = call.args[0], _arg(call, 1, "mat1"), _arg(call, 2, "mat2")
    _two_d(call, a, b)
    la, lb, lo, shape = _matmul_labels(call, a, b)
    return contraction_sharding(call, [a, b, bias], [la, lb, _added(lo, shape, bias)],
                                lo, shape, 2)


def _local_linear(x: Any, w: Any, b: Any = None) -> Any:
    """``linear`` on the local pieces; an empty piece of the inner dim (a trailing rank of an
    uneven split) goes through ``@``, which takes empty operands."""
    if x.shape[-1] == 0:
        out = x @ w.t()
        return out if b is None else out + b
    plain = F.linear
    return getattr(plain, "__dtensor_original__", plain)(x, w, b)


def _linear_rule(call: OpCall) -> Sharding:
    x, w = _arg(call, 0, "input"), _arg(call, 1, "weight")
    bias = _arg(call, 2, "bias")
    if w.ndim != 2 or x.ndim == 0 or x.shape[-1] != w.shape[1]:
        raise call.fail(f"linear needs input (..., {w.shape[-1]}) and a 2-D weight, got "
                        f"{tuple(x.shape)} and {tuple(w.shape)}")
    lx = tuple(("b", i) for i in range(x.ndim - 1)) + ("K",)
    lo = tuple(("b", i) for i in range(x.ndim - 1)) + ("N",)
    shape = tuple(x.shape[:-1]) + (w.shape[0],)
    ops: List[Any] = [x, w]
    labels: List[Labels] = [lx, ("N", "K")]
    if bias is not None:
        ops.append(bias)
        labels.append(_added(lo, shape, bias))
    sh = contraction_sharding(call, ops, labels, lo, shape, 2)
    sh.args, sh.kwargs, sh.fn = (x, w, bias), {}, _local_linear
    return sh


_RULES: Dict[str, Any] = {
    "matmul": _matmul_rule, "__matmul__": _matmul_rule, "mm": _mm_rule, "bmm": _bmm_rule,
    "addmm": _addmm_rule, "mpitensor.matmul": _matmul_rule, "mpitensor.mm": _mm_rule,
    "mpitensor.bmm": _bmm_rule, "mpitensor.addmm": _addmm_rule,
    "mpitensor.nn.functional.linear": _linear_rule,
}


def _register() -> None:
    for op, rule in _RULES.items():
        module, _, name = op.rpartition(".")
        if not module and not hasattr(Tensor, op):
            continue
        register_sharding_rule(op, rule)


_register()

__all__ = ["contraction_sharding"]
