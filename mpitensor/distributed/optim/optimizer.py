"""``mpitensor.distributed.optim.optimizer``: torch's ``DistributedOptimizer`` (over RPC).

The parameters live on several workers (each given as an RRef); the optimizer keeps one local
optimizer per owner, on that owner, and ``step(context_id)`` has each of them step with the
gradients of the distributed autograd context (``dist_autograd.get_gradients``).
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List

from ..rpc import RRef, remote, rpc_async
from ..rpc._dist_autograd import get_gradients

__all__ = ["DistributedOptimizer"]

# One local step at a time in a process: two trainers stepping the same parameters (a shared
# embedding table) would otherwise each set .grad and step with the other's gradient.
_step_lock = threading.Lock()


class _LocalOptimizer:
    """Lives on one owner: a local optimizer over that owner's parameters."""

    def __init__(self, optimizer_class: Any, params: List[RRef], args: tuple,
                 kwargs: dict) -> None:
        self.params = [p.local_value() for p in params]
        self.optim = optimizer_class(self.params, *args, **kwargs)

    def step(self, context_id: int) -> None:
        grads = get_gradients(context_id)
        with _step_lock:
            for p in self.params:
                g = grads.get(p)
                p.grad = None if g is None else g
            self.optim.step()


def _step(local: RRef, context_id: int) -> None:
    local.local_value().step(context_id)


class DistributedOptimizer:
    """An optimizer over parameters held by several workers (RRefs), stepped per context.

    Args:
        optimizer_class: a local optimizer class, e.g. ``mpitensor.optim.SGD``.
        params_rref: RRefs to the parameters (tensors that require grad), on any workers.
        *args, **kwargs: passed to ``optimizer_class`` on each owner.

    Example:
        >>> with dist_autograd.context() as cid:
        ...     loss = rpc.rpc_sync("ps", forward, args=(w_rref, x)).sum()
        ...     dist_autograd.backward(cid, [loss])
        ...     opt = DistributedOptimizer(optim.SGD, [w_rref], lr=0.05)
        ...     opt.step(cid)
    """

    def __init__(self, optimizer_class: Any, params_rref: List[RRef], *args: Any,
                 **kwargs: Any) -> None:
        by_owner: Dict[Any, List[RRef]] = {}
        for p in params_rref:
            if not isinstance(p, RRef):
                raise TypeError(f"DistributedOptimizer takes RRefs to parameters, got "
                                f"{type(p).__name__}; wrap local ones in rpc.RRef(param)")
            by_owner.setdefault(p.owner(), []).append(p)
        self.remote_optimizers = [
            remote(owner, _LocalOptimizer, args=(optimizer_class, ps, args, kwargs))
            for owner, ps in by_owner.items()]

    def step(self, context_id: int) -> None:
        """Step every owner's optimizer with the gradients of ``context_id`` (waits for all)."""
        futs = [rpc_async(o.owner(), _step, args=(o, context_id))
                for o in self.remote_optimizers]
        for f in futs:
            f.wait()
