"""Copies of a module on several devices whose gradients flow back to the original.

A replica is a shallow copy of each sub-module (same class, same attributes, same hooks) whose
parameters are no longer ``Parameter`` leaves but differentiable copies of the original ones
on the replica's device (a view where the device is the original's). Backward through any
replica therefore adds its gradient into the original parameters' ``.grad``: summing the
replicas' gradients needs no extra step. Buffers are copied without autograd, except on the
first device, where the replica shares the original buffers, so that running statistics
updated in place by the first replica are kept (those of the others are lost), as in torch.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, List, Sequence

from mpitensor import backend as _backend
from mpitensor._core.devices import is_on
from mpitensor.tensor import Tensor

from ..modules.module import Module
from .scatter_gather import as_device

__all__ = ["replicate"]


def _replica_tensor(t: Tensor, dev: _backend.device, detach: bool) -> Tensor:
    """``t`` on ``dev``, connected to ``t`` by autograd unless ``detach``."""
    src = t.detach() if detach else t
    if is_on(t._data, dev):
        # an alias with a grad_fn (a view), so the replica's parameter is not the leaf itself
        return src.view(tuple(t.shape))
    return src.to(dev)


def _copied_buffer(b: Tensor, dev: _backend.device, share: bool) -> Tensor:
    if b.requires_grad:
        return _replica_tensor(b, dev, detach=False)
    if share and is_on(b._data, dev):
        return b
    return b.detach().to(dev, copy=True)


def _shallow_copy(m: Module) -> Module:
    """A new instance of ``m``'s class sharing its attributes, with tables of its own."""
    replica = type(m).__new__(type(m))
    state = m.__dict__.copy()
    state["_parameters"] = OrderedDict()
    state["_buffers"] = m._buffers.copy()
    state["_modules"] = m._modules.copy()
    state["_is_replica"] = True
    replica.__dict__.update(state)  # not through Module.__setattr__: nothing to register
    return replica


def replicate(network: Module, devices: Sequence[Any], detach: bool = False) -> List[Module]:
    """One copy of ``network`` per device, for running it on several devices at once.

    Each replica's parameters are differentiable copies of ``network``'s on its device (set as
    plain attributes: ``replica.parameters()`` yields nothing, as in torch), so backward
    through a replica accumulates into ``network``'s own ``.grad``. The first replica shares
    ``network``'s buffers when it is on their device; the others get copies.

    Args:
        network: the module to copy (its parameters on one device, ``devices[0]`` normally).
        devices: one device per replica (GPU numbers, ``"cuda:N"``, ``"cpu"`` or devices; the
            same device may appear more than once).
        detach: make the copies without autograd (no gradient reaches ``network``).

    Returns:
        The replicas, in the order of ``devices``.

    Raises:
        TypeError: ``network`` is not a Module, or a bad device.

    Example:
        >>> import mpitensor as mt, mpitensor.nn as nn
        >>> net = nn.Linear(3, 1)
        >>> a, b = replicate(net, ["cpu", "cpu"])
        >>> (a(mt.ones(2, 3)).sum() + b(mt.ones(1, 3)).sum()).backward()
        >>> net.bias.grad   # both replicas' gradients, summed
        tensor([3.])
    """
    if not isinstance(network, Module):
        raise TypeError(f"replicate: network must be an mpitensor.nn.Module, got "
                        f"{type(network).__name__}")
    devs = [as_device(d) for d in devices]
    if not devs:
        return []
    modules = list(network.modules())
    module_index = {id(m): i for i, m in enumerate(modules)}
    params = list(network.parameters())
    param_index = {id(p): i for i, p in enumerate(params)}
    buffers = list(network.buffers())
    buffer_index = {id(b): i for i, b in enumerate(buffers)}
    param_copies = [[_replica_tensor(p, d, detach) for p in params] for d in devs]
    buffer_copies = [[_copied_buffer(b, d, share=(j == 0)) for b in buffers]
                     for j, d in enumerate(devs)]
    copies = [[_shallow_copy(m) for m in modules] for _ in devs]
    for i, m in enumerate(modules):
        for j in range(len(devs)):
            replica = copies[j][i]
            for name, child in m._modules.items():
                replica._modules[name] = (None if child is None
                                          else copies[j][module_index[id(child)]])
            for name, p in m._parameters.items():
                if p is None:
                    replica._parameters[name] = None
                else:
                    # a non-leaf tensor cannot be a Parameter: a plain attribute, as in torch
                    replica.__dict__[name] = param_copies[j][param_index[id(p)]]
            for name, b in m._buffers.items():
                replica._buffers[name] = (None if b is None
                                          else buffer_copies[j][buffer_index[id(b)]])
    return [c[0] for c in copies]
