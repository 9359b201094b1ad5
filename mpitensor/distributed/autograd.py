"""``mpitensor.distributed.autograd``: torch.distributed.autograd's API over RPC.

``with context() as context_id:`` records every tensor that requires grad carried by an RPC
made inside it; ``backward(context_id, roots)`` runs the graph across the workers it spans and
``get_gradients(context_id)`` returns this worker's gradients (``.grad`` is left alone, as in
torch). See ``mpitensor/distributed/rpc/_dist_autograd.py`` for how, and docs/rpc.md.

Example::

    import mpitensor as torch
    import mpitensor.distributed.autograd as dist_autograd
    import mpitensor.distributed.rpc as rpc

    with dist_autograd.context() as context_id:
        t1 = torch.rand(3, 3, requires_grad=True)
        t2 = torch.rand(3, 3, requires_grad=True)
        loss = rpc.rpc_sync("worker1", torch.add, args=(t1, t2)).sum()
        dist_autograd.backward(context_id, [loss])
        grads = dist_autograd.get_gradients(context_id)    # {t1: ones, t2: ones}
"""

from __future__ import annotations

from .rpc._dist_autograd import backward, context, get_gradients

__all__ = ["context", "backward", "get_gradients"]
