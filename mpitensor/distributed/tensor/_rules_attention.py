"""Sharding rule of ``F.scaled_dot_product_attention``.

Attention mixes positions (the last two dims) and nothing else: where query, key and value
are sharded alike on one batch or head dim (a dim before the last two), every rank attends
over its own heads (or batch rows) and the output keeps that Shard; the tensor-parallel
attention of llama-style models (``ColwiseParallel`` projections viewed as heads) is this
case. Any other placement of a mesh dim (a sequence or feature dim, operands placed
differently, Partial) is gathered first. A DTensor mask is gathered whole. With dropout every
element's draw is made by the rank holding it, so a mesh dim left replicated refuses
``dropout_p > 0`` (each rank would drop different weights of the same values), as
``F.dropout``'s rule does.
"""

from __future__ import annotations

from typing import Any, List, Optional

from ._dispatch import OpCall, Sharding, register_sharding_rule
from .placement_types import Placement, Replicate, Shard

_NAMES = ("query", "key", "value", "attn_mask", "dropout_p")  # the positional order


def _arg(call: OpCall, i: int) -> Any:
    return call.args[i] if len(call.args) > i else call.kwargs.get(_NAMES[i])


def _kept(q: Any, k: Any, v: Any, m: int) -> Optional[Placement]:
    """The Shard that mesh dim ``m`` keeps, or None where it must be gathered."""
    ps = [t.placements[m] for t in (q, k, v)]
    if not all(isinstance(p, Shard) for p in ps) or len({q.ndim, k.ndim, v.ndim}) != 1:
        return None
    dims = {p.dim % q.ndim for p in ps}
    if len(dims) != 1:
        return None
    d = dims.pop()
    if d >= q.ndim - 2 or len({q.shape[d], k.shape[d], v.shape[d]}) != 1:
        return None  # a position or feature dim, or broadcast heads (GQA): gather
    return Shard(d)


def _sdpa_rule(call: OpCall) -> Sharding:
    q, k, v = (_arg(call, i) for i in range(3))
    p_drop = _arg(call, 4) or 0.0
    if not all(any(t is d for d in call.dtensors) for t in (q, k, v)):
        raise call.fail("query, key and value must all be DTensors on one mesh")
    out: List[Placement] = []
    for m in range(call.mesh.ndim):
        keep = _kept(q, k, v, m)
        if keep is None and p_drop > 0:
            raise call.fail(f"dropout_p={p_drop} with mesh dim {m} not sharding a batch or "
                            f"head dim: each rank would drop different attention weights")
        out.append(keep if keep is not None else Replicate())
    place = tuple(out)
    # a DTensor mask (the only other operand) is gathered whole
    inputs = [place if t is q or t is k or t is v else (Replicate(),) * call.mesh.ndim
              for t in call.dtensors]
    return Sharding(placements=place, shape=tuple(q.shape[:-1]) + (v.shape[-1],),
                    inputs=inputs)


register_sharding_rule("mpitensor.nn.functional.scaled_dot_product_attention", _sdpa_rule)
