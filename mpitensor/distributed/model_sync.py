"""Keeping replicas of a model in step: the tutorials' explicit helpers, and what DDP shares.

:func:`broadcast_parameters` starts every replica from one rank's weights, and
:func:`average_gradients` averages the gradients after ``backward()`` (the PyTorch distributed
tutorial's hand-written data parallelism). Both pack tensors into one flat message per dtype and
device, so a model costs one collective per dtype rather than one per tensor.

This module sits in the communication layer: it knows tensors (``.grad``, ``._data``) and
process groups, and treats a model as anything with ``parameters()`` (and ``buffers()``), so
it never imports ``mpitensor.nn``; DDP (``mpitensor.nn.parallel``) builds on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, List, Optional, Sequence

import numpy as np

from .. import backend as _backend
from ..errors import NotAGroupMemberError, NotInitializedError
from ..tensor import Tensor
from .process_group import GroupMember, ProcessGroup, ReduceOp

__all__ = ["average_gradients", "broadcast_parameters"]


def tensors_of(model_or_params: Any, what: str) -> List[Tensor]:
    """The distinct tensors of a model's ``parameters()`` or of an iterable, in order."""
    if isinstance(model_or_params, Tensor):
        items: Iterable = [model_or_params]
    elif callable(getattr(model_or_params, "parameters", None)):
        items = model_or_params.parameters()
    elif isinstance(model_or_params, Iterable) and not isinstance(model_or_params, (str, bytes)):
        items = model_or_params
    else:
        raise TypeError(f"{what}: expected an mpitensor.nn.Module or an iterable of tensors, "
                        f"got {type(model_or_params).__name__}")
    out: List[Tensor] = []
    seen: set = set()
    for p in items:
        if not isinstance(p, Tensor):
            raise TypeError(f"{what}: expected tensors, got {type(p).__name__}")
        if id(p) not in seen:  # a tied weight is one tensor, synchronised once
            seen.add(id(p))
            out.append(p)
    return out


def member_group(group: Optional[ProcessGroup], what: str) -> ProcessGroup:
    """Resolve ``group`` (None: the default group) for a caller that must be a member."""
    world = GroupMember.WORLD  # the default group, while one exists
    if world is None:
        raise NotInitializedError(
            f"{what} needs an initialized process group: call "
            "mpitensor.distributed.init_process_group() first (under `mpiexec -n N python ...`, "
            "or plain `python` for a single rank)")
    pg = group if group is not None else world
    if not isinstance(pg, ProcessGroup):
        raise TypeError(f"{what}: process_group must be a group from "
                        f"mpitensor.distributed.new_group() or None, got {group!r}")
    if pg.rank_ < 0:
        raise NotAGroupMemberError(
            f"rank {world.global_rank}: {what} was given {pg.name} (global ranks "
            f"{list(pg.ranks)}), of which this rank is not a member; construct it only on the "
            "group's members")
    return pg


def device_key(arr: Any) -> str:
    """``"cpu"`` for NumPy arrays, else the array's device (``"cuda:1"``)."""
    return "cpu" if type(arr) is np.ndarray else str(_backend.device_of(arr))


def _by_dtype_device(arrays: Sequence[Any]) -> "dict[tuple, list]":
    groups: dict = {}
    for a in arrays:
        groups.setdefault((a.dtype, device_key(a)), []).append(a)
    return groups


def _packed(arrs: Sequence[Any], collective: Any) -> None:
    """Run ``collective(buffer)`` on the arrays packed into one flat buffer, then unpack.

    A lone contiguous array is its own buffer (no copy).
    """
    if len(arrs) == 1 and arrs[0].flags.c_contiguous:
        collective(arrs[0])
        return
    xp = _backend.array_module(arrs[0])
    flat = xp.concatenate([a.reshape(-1) for a in arrs])
    collective(flat)
    off = 0
    for a in arrs:
        a[...] = flat[off:off + a.size].reshape(a.shape)
        off += a.size


def coalesced_broadcast(arrays: Sequence[Any], pg: ProcessGroup, src: int) -> int:
    """Broadcast ``arrays`` from global rank ``src`` in place, one message per dtype and device.

    Returns:
        The number of broadcasts issued.
    """
    groups = _by_dtype_device(arrays)
    for arrs in groups.values():
        _packed(arrs, lambda buf: pg.broadcast(buf, src))
    return len(groups)


def broadcast_parameters(
    model_or_params: Any, src: int = 0, group: Optional[ProcessGroup] = None,
    buffers: bool = True,
) -> None:
    """Copy parameters (and a module's buffers) from global rank ``src`` to every rank, in place.

    The tutorials' "start every replica from the same weights".

    Args:
        model_or_params: an ``mpitensor.nn.Module`` or an iterable of tensors.
        src: the global rank whose values everyone takes (default 0).
        group: the process group (default: the world).
        buffers: also broadcast a module's buffers (ignored for a list of tensors).

    Raises:
        NotInitializedError: no process group has been initialized.
        TypeError: ``model_or_params`` is neither a Module nor an iterable of tensors.

    Example:
        >>> model = nn.Linear(4, 2)            # different random weights on each rank
        >>> broadcast_parameters(model)        # now rank 0's weights everywhere
    """
    pg = member_group(group, "broadcast_parameters")
    tensors = tensors_of(model_or_params, "broadcast_parameters")
    if buffers and callable(getattr(model_or_params, "buffers", None)):
        tensors += [b for b in model_or_params.buffers() if b is not None]
    arrays = [t._data for t in tensors]
    if arrays:
        coalesced_broadcast(arrays, pg, src)


def average_gradients(model: Any, group: Optional[ProcessGroup] = None) -> None:
    """Average every ``param.grad`` over the group, in place (the tutorials' explicit sync).

    Same result as the PyTorch tutorial's loop (``all_reduce(param.grad.data, SUM)`` then
    ``param.grad.data /= world_size``), in one all-reduce per dtype and device. Parameters whose
    ``grad`` is None are skipped: every rank must have gradients for the same parameters.

    Args:
        model: an ``mpitensor.nn.Module`` or an iterable of parameters.
        group: the process group to average over (default: the world).

    Raises:
        NotInitializedError: no process group has been initialized.

    Example:
        >>> loss.backward()
        >>> average_gradients(model)           # every rank now holds the mean gradient
        >>> optimizer.step()
    """
    pg = member_group(group, "average_gradients")
    size = pg.size_
    grads = [p.grad._data for p in tensors_of(model, "average_gradients") if p.grad is not None]

    def mean(buf: Any) -> None:
        pg.all_reduce(buf, ReduceOp.SUM)
        if size > 1:
            buf /= size

    for arrs in _by_dtype_device(grads).values():
        _packed(arrs, mean)
