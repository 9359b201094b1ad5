"""Run replicas of a module on their inputs, each with its own device current.

torch starts one thread per device. Here the replicas run one after the other in the calling
thread, each inside its GPU's device context: CuPy launches kernels asynchronously, so the GPUs
still compute at the same time, without the cost of threads contending for the interpreter
lock, and with the caller's autograd mode as it is.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from mpitensor.tensor import Tensor

from ..modules.module import Module
from .scatter_gather import as_device, device_context

__all__ = ["parallel_apply"]


def _first_tensor(obj: Any) -> Optional[Tensor]:
    if isinstance(obj, Tensor):
        return obj
    if isinstance(obj, (list, tuple)):
        for o in obj:
            t = _first_tensor(o)
            if t is not None:
                return t
    if isinstance(obj, dict):
        return _first_tensor(list(obj.values()))
    return None


def parallel_apply(modules: Sequence[Module], inputs: Sequence[Any],
                   kwargs_tup: Optional[Sequence[dict]] = None,
                   devices: Optional[Sequence[Any]] = None) -> List[Any]:
    """Call ``modules[i](*inputs[i], **kwargs_tup[i])`` for every i, on device ``devices[i]``.

    Args:
        modules: the replicas.
        inputs: per replica, a tuple of positional arguments (a single non-tuple value is one
            argument).
        kwargs_tup: per replica, a dict of keyword arguments (default: none).
        devices: per replica, the device to make current (default: the device of the first
            tensor among its inputs).

    Returns:
        The outputs, in replica order.

    Raises:
        ValueError: the sequences differ in length.
        Exception: what a replica raised, with a note naming the replica and its device.

    Example:
        >>> import mpitensor as mt, mpitensor.nn as nn
        >>> outs = parallel_apply([nn.Identity(), nn.Identity()], [(mt.ones(1),), (mt.zeros(1),)])
        >>> [float(o) for o in outs]
        [1.0, 0.0]
    """
    n = len(modules)
    if kwargs_tup is None:
        kwargs_tup = [{} for _ in range(n)]
    if devices is None:
        devices = [None if (t := _first_tensor(inp)) is None else t.device for inp in inputs]
    if not (len(inputs) == len(kwargs_tup) == len(devices) == n):
        raise ValueError(f"parallel_apply: {n} modules but {len(inputs)} inputs, "
                         f"{len(kwargs_tup)} keyword sets and {len(devices)} devices; give "
                         "one of each per module")
    outputs = []
    for i, (module, args, kwargs, d) in enumerate(zip(modules, inputs, kwargs_tup, devices)):
        dev = None if d is None else as_device(d)
        if not isinstance(args, (list, tuple)):
            args = (args,)
        try:
            with device_context(dev):
                outputs.append(module(*args, **kwargs))
        except Exception as exc:
            exc.add_note(f"raised by replica {i} on device {dev} (parallel_apply)")
            raise
    return outputs
