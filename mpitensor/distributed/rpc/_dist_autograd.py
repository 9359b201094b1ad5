"""Distributed autograd over RPC (the machinery behind ``mpitensor.distributed.autograd``).

Inside ``with context() as context_id``, an RPC that carries a tensor which requires grad
records the hand-over on both sides:

* the sender keeps the tensor under a *send id* in its context (pickled as its array plus
  ``(context id, sender rank, send id)``, so the tensor's graph stays at the sender);
* the receiver gets a fresh leaf that requires grad, remembered in its own copy of the context
  (made on first use) with where it came from.

Calls made inside a context carry its id, so the served function (and the pickling of its
result) runs in the same context on the callee: results flow back the same way, and nested
calls propagate the context further.

``backward(context_id, roots)`` runs the local graph from the roots with mpitensor's engine,
then sends each received leaf's gradient to its sender, which continues from the matching sent
tensor, and so on, until every worker reached has finished; it returns when all have. Each
worker's pass holds a process-wide lock only while it computes (never while it waits for
another worker), so graphs that cross back and forth between workers cannot deadlock.
Gradients of this worker's leaves accumulate in the context, never in ``.grad`` (whose value
is kept across the pass), as in torch: ``get_gradients(context_id)`` returns them.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Dict, List, Optional, Tuple

from mpitensor.futures import Future

from ... import autograd as _autograd
from ...autograd.function import graph_leaves
from ...tensor import Tensor
from . import _state, _wire

__all__ = ["context", "backward", "get_gradients"]

_tls = threading.local()
_contexts: Dict[int, "_Context"] = {}
_lock = threading.Lock()  # the table above
_pass_lock = threading.Lock()  # one local backward pass at a time (it swaps leaves' .grad)
_ids = itertools.count(1)


class _Context:
    """One worker's share of a distributed autograd context."""

    def __init__(self, cid: int) -> None:
        self.id = cid
        self.sends: Dict[int, Tensor] = {}  # send id -> the tensor sent
        self.recvs: Dict[int, Tuple[Tensor, int, int]] = {}  # id(leaf) -> (leaf, src, send id)
        self.grads: Dict[int, Tuple[Tensor, Any]] = {}  # id(leaf) -> (leaf, gradient array)
        self.peers: set = set()
        self.lock = threading.Lock()
        self.send_ids = itertools.count(1)


class _CtxRef:
    """A context id as it travels with a call (unpickling it loads this module, and so the
    hooks, on a callee that has never imported distributed autograd itself)."""

    __slots__ = ("cid",)

    def __init__(self, cid: int) -> None:
        self.cid = cid

    def __reduce__(self) -> tuple:
        return (_CtxRef, (self.cid,))


def _current_id() -> Optional[int]:
    return getattr(_tls, "ctx", None)


def _current() -> Optional[_CtxRef]:
    cid = getattr(_tls, "ctx", None)
    return None if cid is None else _CtxRef(cid)


def _attach(dest: int) -> Optional[_CtxRef]:
    """The context a request to ``dest`` made in this thread carries (``dest`` joins it)."""
    cid = getattr(_tls, "ctx", None)
    if cid is None:
        return None
    ctx = _contexts.get(cid)
    if ctx is not None:
        with ctx.lock:
            ctx.peers.add(dest)  # so that leaving the context releases it there too
    return _CtxRef(cid)


def _get(cid: int, create: bool = False) -> _Context:
    with _lock:
        ctx = _contexts.get(cid)
        if ctx is None:
            if not create:
                raise RuntimeError(
                    f"distributed autograd context {cid} does not exist on this worker (it was "
                    "never used here, or has been released); use the context_id that "
                    "dist_autograd.context() gave inside its `with` block")
            ctx = _contexts[cid] = _Context(cid)
        return ctx


def _reduce(obj: Any, ref: _CtxRef, dest: int) -> Any:
    """Pickle reduction of a tensor that requires grad, sent inside context ``ref``."""
    if not isinstance(obj, Tensor) or not obj.requires_grad:
        return NotImplemented
    cid = ref.cid
    ctx = _get(cid, create=True)
    with ctx.lock:
        sid = next(ctx.send_ids)
        ctx.sends[sid] = obj
        ctx.peers.add(dest)
    me = _state.current("distributed autograd").rank
    return (_rebuild, (cid, me, sid, obj._data))  # the array alone: the graph stays here


def _rebuild(cid: int, src: int, sid: int, array: Any) -> Tensor:
    t = Tensor(array)
    t.requires_grad_(True)
    ctx = _get(cid, create=True)
    with ctx.lock:
        ctx.recvs[id(t)] = (t, src, sid)
        ctx.peers.add(src)
    return t


def _enter(ref: _CtxRef) -> Any:
    prev = _current_id()
    _get(ref.cid, create=True)
    _tls.ctx = ref.cid
    return (prev,)


def _exit(token: Any) -> None:
    _tls.ctx = token[0]


_wire.hooks.current = _current
_wire.hooks.attach = _attach
_wire.hooks.enter = _enter
_wire.hooks.exit = _exit
_wire.hooks.reduce = _reduce


class context:  # noqa: N801 - torch's name
    """A distributed autograd context: ``with context() as context_id:``.

    RPCs made inside it record the tensors they carry, so that :func:`backward` can run the
    graph across workers. On exit the context is released on every worker it reached.

    Example:
        >>> with dist_autograd.context() as cid:
        ...     loss = rpc.rpc_sync("worker1", torch.add, args=(t1, t2)).sum()
        ...     dist_autograd.backward(cid, [loss])
        ...     grads = dist_autograd.get_gradients(cid)     # {t1: ..., t2: ...}
    """

    def __enter__(self) -> int:
        if _current_id() is not None:
            raise RuntimeError("a distributed autograd context is already active in this "
                               "thread; nested contexts are not supported (as in torch)")
        agent = _state.current("dist_autograd.context")
        self.id = (agent.rank << 40) | next(_ids)
        _get(self.id, create=True)
        _tls.ctx = self.id
        return self.id

    def __exit__(self, *exc: Any) -> None:
        _tls.ctx = None
        _release(self.id, None)


def _release(cid: int, origin: Optional[int]) -> None:
    """Drop the context here and on the workers it reached (each tells its own peers)."""
    with _lock:
        ctx = _contexts.pop(cid, None)
    if ctx is None:
        return
    agent = _state.agent
    if agent is None or not agent.running:
        return
    from .api import rpc_async

    for peer in ctx.peers - {agent.rank, origin}:
        try:
            rpc_async(peer, _release, args=(cid, agent.rank))
        except Exception:  # noqa: BLE001 - a worker gone: nothing to release there
            pass


def _leaves(roots: List[Tensor]) -> List[Tensor]:
    """Every leaf that requires grad reachable from ``roots`` (roots that are leaves too)."""
    out = {id(r): r for r in roots if r.grad_fn is None}
    out.update(graph_leaves([r.grad_fn for r in roots if r.grad_fn is not None]))
    return list(out.values())


def _pass(ctx: _Context, roots: List[Tensor], grads: List[Any], retain: bool) -> None:
    """Run the local graph from ``roots``; then hand received leaves' gradients back."""
    outgoing: List[Tuple[int, int, Any]] = []
    with _pass_lock:
        leaves = _leaves(roots)
        kept = [(t, t.grad) for t in leaves]
        for t in leaves:
            t.grad = None
        try:
            _autograd.backward(roots, grads, retain_graph=retain)
            with ctx.lock:
                for t in leaves:
                    if t.grad is None:
                        continue
                    g = t.grad._data
                    came = ctx.recvs.get(id(t))
                    if came is not None and came[0] is t:
                        outgoing.append((came[1], came[2], g))
                        continue
                    have = ctx.grads.get(id(t))
                    ctx.grads[id(t)] = (t, g if have is None else have[1] + g)
        finally:
            for t, g in kept:
                t.grad = g
    if outgoing:
        from .api import rpc_async

        futs: List[Future] = [rpc_async(src, _remote_pass, args=(ctx.id, sid, g, retain))
                              for src, sid, g in outgoing]
        for f in futs:
            f.wait()


def _remote_pass(cid: int, sid: int, grad: Any, retain: bool) -> None:
    """On the sender of a tensor: continue backward from it with the gradient received."""
    ctx = _get(cid)
    t = ctx.sends.get(sid)
    if t is None:
        raise RuntimeError(f"distributed autograd context {cid}: no tensor was sent with id "
                           f"{sid} from this worker")
    _pass(ctx, [t], [grad], True)


def backward(context_id: int, roots: List[Tensor], retain_graph: bool = False) -> None:
    """Run backward from ``roots`` (one-element tensors) across every worker the graph spans.

    Gradients accumulate in the context on each worker (see :func:`get_gradients`), not in
    ``.grad``. Returns when every worker reached has finished.

    Raises:
        RuntimeError: an unknown context, or a root that does not require grad.
    """
    ctx = _get(context_id)
    roots = list(roots) if not isinstance(roots, Tensor) else [roots]
    for i, r in enumerate(roots):
        if not isinstance(r, Tensor) or not r.requires_grad:
            raise RuntimeError(f"dist_autograd.backward: root {i} does not require grad (it is "
                               f"{type(r).__name__}); pass the loss computed inside the context")
    # graphs spanning workers may be walked several times (once per gradient arriving at a
    # sent tensor): they are kept until the context ends
    _pass(ctx, roots, [None] * len(roots), True)
    del retain_graph


def get_gradients(context_id: int) -> Dict[Tensor, Tensor]:
    """The gradients accumulated on this worker in the context: ``{tensor: gradient}``."""
    ctx = _get(context_id)
    with ctx.lock:
        return {t: Tensor(g) for t, g in ctx.grads.values()}
