"""Split a batch across devices and gather the outputs back: DataParallel's data movement.

Every move is differentiable (``Tensor.chunk``, ``Tensor.to``, ``mpitensor.cat``), so the
gradient of a gathered output flows back to each replica, and the gradient of each scattered
chunk back to the input. The functions take any devices, the CPU included (several entries may
name the same device), which is how their logic is tested on machines without GPUs.

Example:
    >>> import mpitensor as mt
    >>> from mpitensor.nn.parallel import gather, scatter
    >>> parts = scatter(mt.arange(6.0).reshape(3, 2), ["cpu", "cpu"])
    >>> [tuple(p.shape) for p in parts]
    [(2, 2), (1, 2)]
    >>> tuple(gather(parts, "cpu").shape)
    (3, 2)
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from mpitensor import backend as _backend
from mpitensor._ops.combine import cat
from mpitensor.tensor import Tensor

__all__ = ["scatter", "scatter_kwargs", "gather"]


def as_device(d: Any) -> _backend.device:
    """A device argument as a device: a GPU number (``-1``: the CPU), a string or a device.

    Raises:
        TypeError: none of those.
    """
    if isinstance(d, _backend.device):
        return d
    if isinstance(d, str):
        return _backend.device(d)
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        return _backend.CPU if d < 0 else _backend.device("cuda", int(d))
    raise TypeError(f"expected a device (a GPU number, 'cuda:N', 'cpu' or a mpitensor.device), "
                    f"got {d!r}")


def device_context(dev: Optional[_backend.device]) -> Any:
    """A context in which ``dev`` is the current GPU (nothing to do for the CPU or None)."""
    if dev is None or dev.type != "cuda":
        return contextlib.nullcontext()
    from mpitensor import cuda  # noqa: PLC0415 - only where a GPU is used

    return cuda.device(dev.index)


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def scatter(inputs: Any, target_gpus: Sequence[Any], dim: int = 0) -> List[Any]:
    """Split every tensor in ``inputs`` into chunks along ``dim``, one chunk per device.

    Tensors are cut with ``Tensor.chunk`` (so a short batch may give fewer chunks than devices,
    as in torch) and each chunk moves to its device; tuples, lists, named tuples and dicts are
    scattered element by element; anything else is handed to every device as it is.

    Args:
        inputs: a tensor, or a (nested) tuple/list/dict holding tensors.
        target_gpus: the devices (GPU numbers, ``"cuda:N"``, ``"cpu"`` or devices).
        dim: the dimension to split (the batch dimension).

    Returns:
        One entry per chunk: the structure of ``inputs`` with each tensor replaced by its chunk.

    Example:
        >>> import mpitensor as mt
        >>> len(scatter(mt.zeros(4, 2), ["cpu"] * 3))   # chunks of 2: only two are needed
        2
    """
    devices = [as_device(d) for d in target_gpus]

    def split(obj: Any) -> list:
        if isinstance(obj, Tensor):
            return [c.to(dev) for c, dev in zip(obj.chunk(len(devices), dim), devices)]
        if _is_namedtuple(obj):
            return [type(obj)(*args) for args in zip(*map(split, obj))]
        if isinstance(obj, tuple) and obj:
            return list(zip(*map(split, obj)))
        if isinstance(obj, list) and obj:
            return [list(i) for i in zip(*map(split, obj))]
        if isinstance(obj, dict) and obj:
            return [type(obj)(i) for i in zip(*map(split, obj.items()))]
        return [obj for _ in devices]

    return split(inputs)


def scatter_kwargs(inputs: Tuple[Any, ...], kwargs: Any, target_gpus: Sequence[Any],
                   dim: int = 0) -> Tuple[tuple, tuple]:
    """Scatter positional and keyword arguments alike; pad the shorter list to the longer.

    Returns:
        ``(inputs per device, kwargs per device)``, tuples of the same length.
    """
    scattered = scatter(inputs, target_gpus, dim) if inputs else []
    scattered_kw = scatter(kwargs, target_gpus, dim) if kwargs else []
    if len(scattered) < len(scattered_kw):
        scattered.extend(() for _ in range(len(scattered_kw) - len(scattered)))
    elif len(scattered_kw) < len(scattered):
        scattered_kw.extend({} for _ in range(len(scattered) - len(scattered_kw)))
    return tuple(scattered), tuple(scattered_kw)


def gather(outputs: Sequence[Any], target_device: Any, dim: int = 0) -> Any:
    """Concatenate the replicas' outputs along ``dim`` on ``target_device``.

    Tensors are moved and concatenated; dicts, tuples, lists and named tuples are gathered
    element by element; None stays None. Zero-dimensional outputs (a per-replica loss, say)
    become a vector with one entry per replica, with a warning, as in torch.

    Args:
        outputs: one output per replica, all of the same structure.
        target_device: where the result goes (a GPU number, ``-1`` or ``"cpu"``, a device).
        dim: the dimension to concatenate along.

    Returns:
        The output structure holding the gathered tensors.

    Raises:
        ValueError: dicts with different keys.
        TypeError: an output of a kind that cannot be gathered (a number, a string).

    Example:
        >>> import mpitensor as mt
        >>> tuple(gather([{"y": mt.ones(1, 2)}, {"y": mt.zeros(2, 2)}], "cpu")["y"].shape)
        (3, 2)
    """
    dev = as_device(target_device)

    def join(outs: Sequence[Any]) -> Any:
        first = outs[0]
        if isinstance(first, Tensor):
            return _gather_tensors(outs, dev, dim)
        if first is None:
            return None
        if isinstance(first, dict):
            if any(set(o) != set(first) for o in outs):
                raise ValueError("gather: the replicas returned dicts with different keys; "
                                 "every replica must return the same keys")
            return type(first)((k, join([o[k] for o in outs])) for k in first)
        if _is_namedtuple(first):
            return type(first)._make(map(join, zip(*outs)))
        if isinstance(first, (tuple, list)):
            return type(first)(map(join, zip(*outs)))
        raise TypeError(f"gather: cannot gather outputs of type {type(first).__name__}; return "
                        "tensors (or tuples, lists or dicts of them) from forward")

    return join(outputs)


def _gather_tensors(outs: Sequence[Tensor], dev: _backend.device, dim: int) -> Tensor:
    moved = [t.to(dev) for t in outs]
    if all(t.ndim == 0 for t in moved):
        warnings.warn("gather: every replica returned a scalar; they are returned as a vector "
                      "with one entry per replica (reduce it, e.g. with .mean())",
                      UserWarning, stacklevel=3)
        moved = [t.reshape(1) for t in moved]
        dim = 0
    with device_context(dev):  # the concatenation runs on the GPU that holds the result
        return cat(moved, dim)
