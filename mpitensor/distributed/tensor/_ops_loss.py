"""The sharding rule of ``nn.functional.cross_entropy`` and the switch of ``loss_parallel``.

* Batch-sharded logits (any Shard but the class dim): each rank computes its samples' losses;
  ``reduction="none"`` keeps the batch sharding, ``"sum"`` gives ``Partial("sum")`` and
  ``"mean"`` the local sum over the global denominator (the count, or the class weights, of
  the non-ignored targets, summed over the ranks with one all_reduce), also
  ``Partial("sum")``. The target is a DTensor sharded like the logits' batch, or a plain
  tensor holding every target (each rank uses its rows).
* Class-sharded logits (``Shard(1)``; ``Shard(0)`` of 1-D ones) are gathered first, unless
  inside :func:`loss_parallel`: there each rank keeps its classes and the log-sum-exp and the
  target's logit are summed over the class shards (the max over them with no gradient, as a
  shift); the loss is then replicated over those mesh dims. The gradient reaches each rank's
  piece of the logits as ``softmax - one_hot`` of its own classes.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Sequence, Tuple

import numpy as np

import mpitensor.distributed as dist
import mpitensor.nn.functional as F  # noqa: N812 - torch's spelling
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import tensor as _tensor
from mpitensor.tensor import where, zeros_like

from ._dispatch import OpCall, Sharding, register_sharding_rule
from ._rules_norms import mesh_dim_roles
from ._utils import compute_local_shape_and_global_offset
from .placement_types import Partial, Placement, Replicate, Shard

_STATE = {"parallel": 0}


@contextlib.contextmanager
def loss_parallel() -> Iterator[None]:
    """Inside it, ``cross_entropy`` on logits sharded on the class dim runs on the shards
    (no gather of the logits); run the backward inside it too, as torch asks."""
    _STATE["parallel"] += 1
    try:
        yield
    finally:
        _STATE["parallel"] -= 1


class _SumOver(Function):
    """Sum over the groups of mesh dims; backward passes the (replicated) gradient on."""

    @staticmethod
    def forward(ctx: Any, x: Any, groups: Tuple[Any, ...]) -> Any:
        out = x.copy(order="C")
        for g in groups:
            dist.all_reduce(out, group=g)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Tuple[Any, None]:
        return grad, None


def _arg(call: OpCall, i: int, name: str, default: Any = None) -> Any:
    return call.args[i] if len(call.args) > i else call.kwargs.get(name, default)


def _denominator(target: Any, weight: Any, ignore_index: int, groups: Sequence[Any]) -> float:
    """The global weight (count) of the non-ignored targets."""
    t = np.asarray(target.detach().numpy())
    if t.dtype.kind == "f":  # class probabilities: every sample counts
        total = np.array([float(t.size // t.shape[1]) if t.ndim > 1 else 1.0])
    else:
        valid = t != ignore_index
        if weight is None:
            total = np.array([float(valid.sum())])
        else:
            w = np.asarray(weight.detach().numpy())
            total = np.array([float(w[np.where(valid, t, 0)][valid].sum())])
    for g in groups:
        dist.all_reduce(total, group=g)
    return float(total[0])


def _class_parallel(lo: int, groups: Tuple[Any, ...], n_classes: int) -> Any:
    """The loss of each sample from this rank's classes [lo, lo + local)."""
    def losses(x: Any, target: Any, ignore_index: int, smoothing: float) -> Any:
        # a rank holding no classes (an uneven split) still joins the max: -inf is its share
        top = np.ascontiguousarray(x.detach().numpy().max(axis=1, keepdims=True,
                                                        initial=-np.inf))
        for g in groups:
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=g)
        z = x - _tensor(top)
        lse = _SumOver.apply(z.exp().sum(1), groups).log()
        local = target - lo
        inside = (local >= 0) & (local < x.shape[1])
        safe = where(inside, local, zeros_like(local))
        if x.shape[1]:
            picked = z.gather(1, safe.unsqueeze(1)).squeeze(1) * inside.to(z.dtype)
        else:  # no class here: its term of the target's logit is a sum of nothing
            picked = z.sum(1)
        loss = lse - _SumOver.apply(picked, groups)
        if smoothing:
            mean_z = _SumOver.apply(z.sum(1), groups) / n_classes
            loss = (1 - smoothing) * loss + smoothing * (lse - mean_z)
        return loss * (target != ignore_index).to(loss.dtype)
    return losses


def _opts(call: OpCall) -> Tuple[Any, int, str, float]:
    weight = _arg(call, 2, "weight")
    ignore = _arg(call, 5, "ignore_index", -100)
    reduction = _arg(call, 7, "reduction", "mean")
    smoothing = float(_arg(call, 8, "label_smoothing", 0.0))
    if _arg(call, 3, "size_average") is not None or _arg(call, 4, "reduce") is not None:
        raise call.fail("size_average and reduce are deprecated; use reduction=")
    if reduction not in ("none", "sum", "mean"):
        raise call.fail(f"reduction {reduction!r} is not one of 'none', 'sum', 'mean'")
    return weight, ignore, reduction, smoothing


def _layout(call: OpCall, x: Any, cdim: int,
            parallel: bool) -> Tuple[List[Placement], List[Placement], List[int], List[int]]:
    """The logits' placements to compute in, the target's, and the mesh dims sharding the
    batch and the classes."""
    roles = mesh_dim_roles(x.placements, {cdim}, parallel)
    wx = [p if role else Replicate() for p, role in zip(x.placements, roles)]
    wt = [Shard(p.dim - (1 if p.dim > cdim else 0)) if role == "kept" else Replicate()
          for p, role in zip(x.placements, roles)]
    batch = [m for m, role in enumerate(roles) if role == "kept"]
    classes = [m for m, role in enumerate(roles) if role == "combined"]
    return wx, wt, batch, classes


def _local_target(call: OpCall, target: Any, wt: Sequence[Placement]) -> Any:
    """A plain target's rows for this rank (a DTensor target is redistributed instead)."""
    if not any(isinstance(p, Shard) for p in wt):
        return target
    shape, off = compute_local_shape_and_global_offset(tuple(target.shape), call.mesh, wt)
    return target[tuple(slice(o, o + s) for o, s in zip(off, shape))]


def _cross_entropy_rule(call: OpCall) -> Sharding:
    x, target = _arg(call, 0, "input"), _arg(call, 1, "target")
    if x is not call.dtensors[0]:
        raise call.fail("the logits (input) must be a DTensor when the target is one")
    weight, ignore, reduction, smoothing = _opts(call)
    cdim = 1 if x.ndim > 1 else 0
    parallel = _STATE["parallel"] > 0 and x.ndim > 1
    wx, wt, batch, classes = _layout(call, x, cdim, parallel)
    if classes and (weight is not None or target.is_floating_point()):
        raise call.fail("loss_parallel takes class-index targets and no class weights")
    t_is_d = any(target is d for d in call.dtensors)
    inputs: List[Any] = [tuple(wx)] + [None] * (len(call.dtensors) - 1)
    for i, d in enumerate(call.dtensors[1:], 1):
        inputs[i] = tuple(wt) if d is target else tuple(Replicate() for _ in wx)
    groups = tuple(call.mesh.get_group(m) for m in batch)
    out_shape = tuple(s for i, s in enumerate(x.shape) if i != cdim)
    out = [Shard(p.dim) if isinstance(p, Shard) else Replicate() for p in wt]
    ce = None
    if classes:
        _, off = compute_local_shape_and_global_offset(tuple(x.shape), call.mesh, wx)
        ce = _class_parallel(off[1], tuple(call.mesh.get_group(m) for m in classes),
                             x.shape[1])

    def local(xl: Any, tl: Any, *rest: Any, **kw: Any) -> Any:
        tl = tl if t_is_d else _local_target(call, tl, wt)
        wl = kw.get("weight", rest[0] if rest else None)
        if ce is not None:
            each = ce(xl, tl, ignore, smoothing)
            summed = each.sum()
        else:
            each = F.cross_entropy(xl, tl, weight=wl, ignore_index=ignore, reduction="none",
                                   label_smoothing=smoothing)
            summed = each.sum()
        if reduction == "none":
            return each
        if reduction == "sum":
            return summed
        return summed / _denominator(tl, wl, ignore, groups)

    if reduction != "none":
        out = [Partial() if m in batch else Replicate() for m in range(len(wx))]
        out_shape = ()
    return Sharding(placements=tuple(out), shape=out_shape, inputs=inputs,
                    args=(x, target), kwargs={"weight": weight} if weight is not None else {},
                    fn=local)


register_sharding_rule("mpitensor.nn.functional.cross_entropy", _cross_entropy_rule,
                       allow_plain_tensors=True)

__all__: Sequence[str] = ["loss_parallel"]
