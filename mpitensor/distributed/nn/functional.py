"""Differentiable collectives (``torch.distributed.nn.functional``).

Each function takes and returns tensors; the input is never changed (the collective runs on a
copy) and the result records its backward, which is the collective's adjoint:

================  =====================================================================
forward           backward (the gradient each rank receives)
================  =====================================================================
all_reduce SUM    all_reduce SUM of the output gradients (AVG: AVG)
all_gather        reduce_scatter SUM: the sum over ranks of the gradients of my piece
broadcast         reduce SUM to ``src``; the other ranks' inputs get zeros
reduce SUM        broadcast of ``dst``'s gradient to every rank
gather            scatter of ``dst``'s gradients; ``dst`` gets its piece's
scatter           gather to ``src``; the other ranks' inputs get zeros
reduce_scatter    all_gather of the output gradients
all_to_all        all_to_all of the gradients, pieces going back where they came from
================  =====================================================================

Ops other than SUM (and AVG for all_reduce) have no gradient here: a call that records one
raises at once, naming the op. Every rank must call backward, as with the forward collectives.

Example:
    >>> import mpitensor as torch
    >>> import mpitensor.distributed.nn.functional as dfn
    >>> x = torch.ones(2, requires_grad=True)
    >>> pieces = dfn.all_gather(x)     # one tensor per rank, each with a gradient path
    >>> torch.stack(pieces).sum().backward()
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

from mpitensor import backend as _backend
from mpitensor._ops import combine as _combining
from mpitensor.autograd import ArrayFunction as Function, grad_enabled_for
from mpitensor.tensor import Tensor

from .. import _pg, get_rank, get_world_size
from .. import all_reduce as _all_reduce
from .. import all_to_all_single as _a2a_single
from .. import broadcast as _broadcast
from .. import reduce as _reduce
from ..process_group import ReduceOp

__all__ = ["all_reduce", "all_gather", "broadcast", "reduce", "gather", "scatter",
           "reduce_scatter", "all_to_all", "all_to_all_single"]


def _xp(a: Any) -> Any:
    return _backend.array_module(a)


def _group_rank(group: Any, global_rank: int, what: str) -> int:
    pg = _pg(group)
    return pg.group_rank_of(global_rank, what, f"distributed.nn.{what}")


def _needs_sum(op: Any, fname: str, allowed: Tuple[Any, ...], *tensors: Any) -> None:
    if op not in allowed and grad_enabled_for(*tensors):
        names = " or ".join(getattr(o, "name", str(o)) for o in allowed)
        raise RuntimeError(f"distributed.nn.{fname}: op {getattr(op, 'name', op)} has no "
                           f"gradient here (only {names}); call it under no_grad() or on a "
                           f"tensor that does not require grad")


def _gather_rows(a: Any, group: Any) -> Any:
    """All ranks' ``a`` stacked: (world, *a.shape)."""
    xp = _xp(a)
    n = get_world_size(group)
    out = xp.empty((n,) + a.shape, a.dtype)
    _a2a_single(out, xp.broadcast_to(a, (n,) + a.shape).copy(), group=group)
    return out


def _sum_my_row(rows: Any, group: Any) -> Any:
    """reduce_scatter SUM of ``rows`` (world, *shape): the sum over ranks of row ``my rank``."""
    xp = _xp(rows)
    got = xp.empty_like(rows)
    _a2a_single(got, xp.ascontiguousarray(rows), group=group)
    return got.sum(axis=0)


def _on_copy(collective: Callable[..., Any], x: Any, **kw: Any) -> Any:
    """``collective`` run in place on a copy of ``x`` (autograd's inputs stay untouched)."""
    out = x.copy()
    collective(out, **kw)
    return out


def _all_reduce_copy(x: Any, op: Any, group: Any) -> Any:
    return _on_copy(_all_reduce, x, op=op, group=group)


def _broadcast_copy(x: Any, src: int, group: Any) -> Any:
    return _on_copy(_broadcast, x, src=src, group=group)


def _reduce_copy(x: Any, dst: int, group: Any) -> Any:
    return _on_copy(_reduce, x, dst=dst, op=ReduceOp.SUM, group=group)


def _reduce_to_src(g: Any, src: int, group: Any) -> Any:
    """The gradients summed on ``src``; zeros elsewhere (their input reached no output)."""
    out = _reduce_copy(g, src, group)
    if get_rank() != src:
        out[...] = 0
    return out


def _exchange_rows(rows: Any, group: Any) -> Any:
    """Row j of ``rows`` (world, *piece) sent to rank j; the rows received, by source."""
    out = _xp(rows).empty_like(rows)
    _a2a_single(out, _xp(rows).ascontiguousarray(rows), group=group)
    return out


def _collective(name: str, forward: Callable[..., Any], backward: Callable[..., Any]) -> type:
    """A Function of ``(x, *args)``: ``forward(x, *args)``, its gradient ``backward(g, *args)``
    (the same arguments, ending with the group)."""

    def fwd(ctx: Any, x: Any, *args: Any) -> Any:
        ctx.args = args
        return forward(x, *args)

    def bwd(ctx: Any, g: Any) -> tuple:
        return (backward(g, *ctx.args),) + (None,) * len(ctx.args)

    return type(name, (Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd),
                                    "__module__": __name__})


# each collective with its adjoint: all_reduce (SUM or AVG) and all_to_all are their own
_AllReduce = _collective("_AllReduce", _all_reduce_copy, _all_reduce_copy)
_AllGather = _collective("_AllGather", _gather_rows, _sum_my_row)
_Broadcast = _collective("_Broadcast", _broadcast_copy, _reduce_to_src)
_Reduce = _collective("_Reduce", _reduce_copy, _broadcast_copy)
_AllToAll = _collective("_AllToAll", _exchange_rows, _exchange_rows)


class _AllToAllSingle(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, out_shape: tuple, out_splits: Any, in_splits: Any,
                group: Any) -> Any:
        out = _xp(x).empty(out_shape, x.dtype)
        _a2a_single(out, _xp(x).ascontiguousarray(x), output_split_sizes=out_splits,
                    input_split_sizes=in_splits, group=group)
        ctx.in_shape, ctx.splits, ctx.group = x.shape, (out_splits, in_splits), group
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        out_splits, in_splits = ctx.splits
        back = _xp(g).empty(ctx.in_shape, g.dtype)
        _a2a_single(back, _xp(g).ascontiguousarray(g), output_split_sizes=in_splits,
                    input_split_sizes=out_splits, group=ctx.group)
        return back, None, None, None, None


def _tensor(x: Any, fname: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"distributed.nn.{fname}: expected a Tensor, got {type(x).__name__}")
    return x


def all_reduce(tensor: Tensor, op: Any = ReduceOp.SUM, group: Any = None) -> Tensor:
    """The reduction of ``tensor`` over the group, as a new tensor with a gradient path."""
    t = _tensor(tensor, "all_reduce")
    _needs_sum(op, "all_reduce", (ReduceOp.SUM, ReduceOp.AVG), t)
    return _AllReduce.apply(t, op, group)


def all_gather(tensor: Tensor, group: Any = None) -> Tuple[Tensor, ...]:
    """Every rank's ``tensor``, in rank order, each with a gradient path to its owner."""
    t = _tensor(tensor, "all_gather")
    return tuple(_AllGather.apply(t, group).unbind(0))


def broadcast(tensor: Tensor, src: int = 0, group: Any = None) -> Tensor:
    """``src``'s ``tensor`` on every rank (``src`` is a global rank)."""
    t = _tensor(tensor, "broadcast")
    return _Broadcast.apply(t, src, group)


def reduce(tensor: Tensor, dst: int = 0, op: Any = ReduceOp.SUM, group: Any = None) -> Tensor:
    """The SUM of ``tensor`` over the group on ``dst`` (other ranks get their input back)."""
    t = _tensor(tensor, "reduce")
    _needs_sum(op, "reduce", (ReduceOp.SUM,), t)
    return _Reduce.apply(t, dst, group)


def gather(tensor: Tensor, dst: int = 0, group: Any = None) -> Tuple[Tensor, ...]:
    """Every rank's ``tensor`` on ``dst``, in rank order (other ranks get zeros, as torch)."""
    t = _tensor(tensor, "gather")
    pieces = _AllGather.apply(t, group)
    if get_rank() != dst:
        pieces = pieces * 0  # what the others receive carries no values, and no gradient
    return tuple(pieces.unbind(0))


def scatter(tensors: Sequence[Tensor], src: int = 0, group: Any = None) -> Tensor:
    """Piece ``i`` of ``src``'s ``tensors`` on rank ``i`` (every rank passes a list of the
    group's size, of one shape and dtype; only ``src``'s values are used)."""
    n = get_world_size(group)
    if len(tensors) != n:
        raise ValueError(f"distributed.nn.scatter: {len(tensors)} tensors for a group of {n}")
    rows = _combining.stack([_tensor(t, "scatter") for t in tensors], 0)
    _group_rank(group, src, "src")  # a member, or a clear error before any traffic
    # src's rows reach every rank and each keeps its own: backward, the broadcast's adjoint
    # sums the kept rows' gradients on src (zeros elsewhere)
    return _Broadcast.apply(rows, src, group)[_pg(group).rank_]


def reduce_scatter(output: Tensor, input_list: Sequence[Tensor], op: Any = ReduceOp.SUM,
                   group: Any = None) -> Tensor:
    """The SUM over ranks of piece ``my rank`` of ``input_list``; ``output`` gives its shape
    (it is not written: the result is a new tensor, as torch's functional form returns)."""
    n = get_world_size(group)
    if len(input_list) != n:
        raise ValueError(f"distributed.nn.reduce_scatter: {len(input_list)} inputs for a "
                         f"group of {n}")
    rows = _combining.stack([_tensor(t, "reduce_scatter") for t in input_list], 0)
    _needs_sum(op, "reduce_scatter", (ReduceOp.SUM,), rows)
    if tuple(output.shape) != tuple(rows.shape[1:]):
        raise ValueError(f"distributed.nn.reduce_scatter: output of size "
                         f"{tuple(output.shape)} for pieces of size {tuple(rows.shape[1:])}")
    return _AllToAll.apply(rows, group).sum(0)


def all_to_all(output_tensor_list: Sequence[Tensor], input_tensor_list: Sequence[Tensor],
               group: Any = None) -> Tuple[Tensor, ...]:
    """Piece ``j`` of this rank's ``input_tensor_list`` goes to rank ``j``; returns the pieces
    received, by source rank (``output_tensor_list`` gives their count)."""
    n = get_world_size(group)
    if len(input_tensor_list) != n or len(output_tensor_list) != n:
        raise ValueError(f"distributed.nn.all_to_all: lists of {len(input_tensor_list)} and "
                         f"{len(output_tensor_list)} tensors for a group of {n}")
    rows = _combining.stack([_tensor(t, "all_to_all") for t in input_tensor_list], 0)
    return tuple(_AllToAll.apply(rows, group).unbind(0))


def all_to_all_single(output: Tensor, input: Tensor,  # noqa: A002 - torch's name
                      output_split_sizes: Optional[List[int]] = None,
                      input_split_sizes: Optional[List[int]] = None,
                      group: Any = None) -> Tensor:
    """``dist.all_to_all_single`` with a gradient path; ``output`` gives the result's shape
    (it is not written)."""
    x = _tensor(input, "all_to_all_single")
    return _AllToAllSingle.apply(x, tuple(output.shape), output_split_sizes, input_split_sizes,
                                 group)
