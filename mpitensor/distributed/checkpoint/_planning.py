"""What a save writes and a load reads: flattened entries, chunks, who writes which, overlaps.

A state dict is flattened as torch's ``dcp`` flattens it (so that either side reads the other's
checkpoints): a dict's items are entries ``"<key>.<subkey>"`` (keys turned into strings); a list
is walked by index when it holds a tensor, a dict or such a list, and is stored whole
otherwise; every other value (tuples included) is one entry, pickled whole; an empty dict
stores nothing.

Every tensor entry is cut into chunks, each a box of the global tensor given by its offsets and
sizes. A plain tensor is one chunk (the whole tensor), held by every rank that has it; a
``DTensor`` or a :class:`LocalShard` is this rank's box. The same box held by several ranks
(a replicated tensor, a DTensor replicated over a mesh dimension) is written once: every rank
computes the same assignment from the gathered plans, giving each box to the holder with the
fewest bytes so far, biggest boxes first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mpitensor.distributed.checkpoint import _format
from mpitensor.tensor import Tensor

Box = Tuple[Tuple[int, ...], Tuple[int, ...]]  # (offsets, sizes)


class LocalShard:
    """This rank's part of a tensor sharded without a DTensor: a box of the global tensor.

    ``save`` writes ``tensor`` as the chunk of the global tensor that starts at ``offsets``;
    ``load`` fills ``tensor`` in place from whatever chunks of the checkpoint overlap it, so a
    checkpoint written with one sharding loads into another.

    Args:
        tensor: the local data, of the chunk's shape.
        global_shape: the shape of the whole tensor.
        offsets: the global index of ``tensor``'s first element, one per dimension.

    Example:
        >>> w = LocalShard(mpitensor.zeros(2, 4), (8, 4), (2 * rank, 0))  # doctest: +SKIP
    """

    def __init__(self, tensor: Tensor, global_shape: Sequence[int],
                 offsets: Sequence[int]) -> None:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"LocalShard takes an mpitensor Tensor, got {type(tensor).__name__}")
        shape, offs = tuple(int(s) for s in global_shape), tuple(int(o) for o in offsets)
        local = tuple(tensor.shape)
        if len(shape) != len(local) or len(offs) != len(local):
            raise ValueError(f"LocalShard: a {len(local)}-d tensor needs a {len(local)}-d "
                             f"global_shape and offsets, got {shape} and {offs}")
        if any(o < 0 or o + n > s for o, n, s in zip(offs, local, shape)):
            raise ValueError(f"LocalShard: a chunk of shape {local} at offsets {offs} does not "
                             f"fit in the global shape {shape}")
        self.tensor, self.global_shape, self.offsets = tensor, shape, offs

    def __repr__(self) -> str:
        return (f"LocalShard(shape={tuple(self.tensor.shape)}, global_shape={self.global_shape}, "
                f"offsets={self.offsets})")


def _dtensor_type() -> Optional[type]:
    try:
        from mpitensor.distributed.tensor import DTensor
    except ImportError:  # the DTensor layer is not there: no value can be one
        return None
    return DTensor


@dataclass
class Leaf:
    """One flattened entry of a state dict, with where it sits (to replace it on load)."""

    fqn: str
    path: Tuple[Any, ...]
    parent: Any
    key: Any
    value: Any


def _is_tensorish(x: Any) -> bool:
    dt = _dtensor_type()
    return isinstance(x, (Tensor, LocalShard)) or (dt is not None and isinstance(x, dt))


def _walks(x: Any) -> bool:
    """Whether a list is flattened item by item (it holds a tensor, a dict or such a list)."""
    return any(_is_tensorish(v) or isinstance(v, dict) or (isinstance(v, list) and _walks(v))
               for v in x)


def flatten(state_dict: Any) -> List[Leaf]:
    """The entries of a nested state dict, in order, named as torch's ``dcp`` names them."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"a state_dict must be a dict, got {type(state_dict).__name__}")
    out: List[Leaf] = []
    stack: List[Tuple[Tuple[Any, ...], Any, Any, Any]] = [((), None, None, state_dict)]
    while stack:
        path, parent, key, value = stack.pop()
        if isinstance(value, dict):
            items = [((*path, str(k)), value, k, v) for k, v in value.items()]
        elif isinstance(value, list) and _walks(value):
            items = [((*path, i), value, i, v) for i, v in enumerate(value)]
        else:
            out.append(Leaf(".".join(str(p) for p in path), path, parent, key, value))
            continue
        stack.extend(reversed(items))
    seen: Dict[str, Tuple[Any, ...]] = {}
    for leaf in out:
        if leaf.fqn in seen:
            raise ValueError(f"state_dict entries {seen[leaf.fqn]} and {leaf.path} both flatten "
                             f"to the name {leaf.fqn!r}; rename one of the keys")
        seen[leaf.fqn] = leaf.path
    return out


# ------------------------------------------------------------------ tensors: global view
@dataclass
class TensorEntry:
    """A tensor leaf seen globally: shape, dtype, this rank's box and its local data."""

    shape: Tuple[int, ...]
    dtype: np.dtype
    box: Optional[Box]  # None: this rank holds no part (a rank outside a DTensor's mesh)
    local: Optional[Tensor]
    replicated: bool  # a plain tensor: every holder has all of it


def _dtensor_entry(x: Any, for_load: bool) -> TensorEntry:
    from mpitensor.distributed.tensor import Partial, Replicate
    from mpitensor.distributed.tensor._utils import compute_local_shape_and_global_offset

    if any(isinstance(p, Partial) for p in x.placements):
        if for_load:
            raise ValueError(f"cannot load into a DTensor with Partial placements "
                             f"{tuple(x.placements)}: a partial sum has no single value to "
                             f"set; redistribute it to Replicate or Shard first")
        x = x.redistribute(x.device_mesh, [Replicate() if isinstance(p, Partial) else p
                                           for p in x.placements])
    shape = tuple(int(s) for s in x.shape)
    local_shape, offsets = compute_local_shape_and_global_offset(shape, x.device_mesh,
                                                                 x.placements)
    if x.device_mesh.get_coordinate() is None:
        return TensorEntry(shape, np.dtype(x.dtype), None, None, False)
    local = x.to_local()
    return TensorEntry(shape, np.dtype(x.dtype), (tuple(offsets), tuple(local_shape)), local,
                       False)


def tensor_entry(x: Any, for_load: bool = False) -> Optional[TensorEntry]:
    """The :class:`TensorEntry` of a leaf, or None when the leaf is not a tensor."""
    if isinstance(x, LocalShard):
        return TensorEntry(x.global_shape, np.dtype(x.tensor.dtype),
                           (x.offsets, tuple(int(s) for s in x.tensor.shape)), x.tensor, False)
    if isinstance(x, Tensor):
        dtensor = _dtensor_type()
        if dtensor is not None and isinstance(x, dtensor):
            return _dtensor_entry(x, for_load)
        shape = tuple(int(s) for s in x.shape)
        return TensorEntry(shape, np.dtype(x.dtype), ((0,) * len(shape), shape), x, True)
    dtensor = _dtensor_type()
    if dtensor is not None and isinstance(x, dtensor):
        return _dtensor_entry(x, for_load)
    return None


# ------------------------------------------------------------------ boxes
def volume(sizes: Sequence[int]) -> int:
    return math.prod(sizes)


def overlap(a: Box, b: Box) -> Optional[Box]:
    """The box where ``a`` and ``b`` meet (offsets and sizes), or None when they do not."""
    lo = tuple(max(x, y) for x, y in zip(a[0], b[0]))
    hi = tuple(min(x + n, y + m) for x, n, y, m in zip(a[0], a[1], b[0], b[1]))
    if any(h <= lo_ for lo_, h in zip(lo, hi)):
        return None
    return lo, tuple(h - lo_ for lo_, h in zip(lo, hi))


def within(box: Box, origin: Sequence[int]) -> Tuple[slice, ...]:
    """The slices of ``box`` inside an array whose first element sits at ``origin``."""
    return tuple(slice(o - z, o - z + n) for o, n, z in zip(box[0], box[1], origin))


# ------------------------------------------------------------------ the save plan
@dataclass(frozen=True)
class PlanItem:
    """One entry of a rank's save plan, as sent to the other ranks (small and picklable)."""

    fqn: str
    path: Tuple[Any, ...]
    tensor: bool
    shape: Tuple[int, ...] = ()
    dtype: str = ""
    box: Optional[Box] = None

    @property
    def nbytes(self) -> int:
        if not self.tensor or self.box is None:
            return 64
        return volume(self.box[1]) * _format._BY_TORCH_NAME[self.dtype].itemsize


def check_plans(plans: Sequence[Sequence[PlanItem]]) -> List[str]:
    """What is inconsistent between the ranks' plans (the same on every rank)."""
    problems: List[str] = []
    first: Dict[str, Tuple[int, PlanItem]] = {}
    for rank, plan in enumerate(plans):
        for item in plan:
            if item.fqn not in first:
                first[item.fqn] = (rank, item)
                continue
            r0, other = first[item.fqn]
            if (item.tensor, item.shape, item.dtype) != (other.tensor, other.shape, other.dtype):
                def what(p: PlanItem) -> str:
                    return f"a {p.dtype} tensor of shape {p.shape}" if p.tensor else "an object"
                problems.append(f"{item.fqn!r} is {what(other)} on rank {r0} but {what(item)} "
                                f"on rank {rank}")
    problems.extend(_check_tiling(plans))
    return problems


def unique_chunks(plans: Sequence[Sequence[PlanItem]]) -> Dict[Tuple[str, Box], List[int]]:
    """Every distinct (entry, box) of the plans and the ranks holding it, in rank order.

    Empty boxes (a trailing rank's share of an uneven split) hold nothing to write; they are
    left out unless the whole tensor is empty, which then keeps one chunk, as torch's does.
    """
    holders: Dict[Tuple[str, Box], List[int]] = {}
    for rank, plan in enumerate(plans):
        for item in plan:
            if item.tensor and (item.box is None or (
                    not volume(item.box[1]) and volume(item.shape))):
                continue
            holders.setdefault((item.fqn, item.box), []).append(rank)
    return holders


def _check_tiling(plans: Sequence[Sequence[PlanItem]]) -> List[str]:
    boxes: Dict[str, List[Box]] = {}
    shapes: Dict[str, Tuple[int, ...]] = {}
    for fqn, box in unique_chunks(plans):
        if box is not None:
            boxes.setdefault(fqn, []).append(box)
    for plan in plans:
        shapes.update({i.fqn: i.shape for i in plan if i.tensor})
    problems = []
    for fqn, bs in boxes.items():
        clash = next(((a, b) for i, a in enumerate(bs) for b in bs[i + 1:]
                      if volume(a[1]) and volume(b[1]) and overlap(a, b)), None)
        if clash is not None:
            problems.append(f"{fqn!r} has overlapping chunks that differ (offsets/sizes "
                            f"{clash[0]} and {clash[1]}): ranks disagree on its sharding")
        elif sum(volume(b[1]) for b in bs) != volume(shapes[fqn]):
            problems.append(f"the chunks of {fqn!r} cover {sum(volume(b[1]) for b in bs)} of "
                            f"its {volume(shapes[fqn])} elements (global shape {shapes[fqn]})")
    return problems


def assign(plans: Sequence[Sequence[PlanItem]]) -> Dict[Tuple[str, Box], int]:
    """Which rank writes each distinct chunk or object: the least loaded holder."""
    sizes = {(i.fqn, i.box): i.nbytes for plan in plans for i in plan}
    load = [0] * len(plans)
    writer: Dict[Tuple[str, Box], int] = {}
    holders = unique_chunks(plans)
    for key in sorted(holders, key=lambda k: (-sizes[k], k[0], repr(k[1]))):
        rank = min(holders[key], key=lambda r: (load[r], r))
        writer[key] = rank
        load[rank] += sizes[key]
    return writer
