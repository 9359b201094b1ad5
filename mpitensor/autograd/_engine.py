"""The backward engine: gradients run from the roots down, node by node in reverse creation
order, summed into leaves' ``.grad``; and the Tensor-side entry points (``backward``, hooks).
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Optional

import numpy as np

from mpitensor._core.devices import xp as _xp

from . import anomaly as _anomaly
from .function import SECOND_BACKWARD, Node, _sum_to
from .grad_mode import _mode

# The Tensor class and its fast wrapper, set by mpitensor.autograd._bind_tensor once
# mpitensor.tensor has made them (tensor imports autograd, so autograd cannot import it).
_Tensor: Any = None
_new: Any = None


# --------------------------------------------------------------------------------------------
# The engine


def _leaf_grad(t: Any, g: Any) -> Any:
    """Make ``g`` fit leaf ``t``: its shape, its dtype and its array type."""
    x = t._data
    if g.shape != x.shape:
        g = _sum_to(g, x.shape)
    if g.dtype != x.dtype:
        g = g.astype(x.dtype)
    return g


def _accumulate(t: Any, g: Any) -> None:
    """Add ``g`` into leaf ``t``'s ``.grad``, in place when it exists (views of it stay valid)."""
    if getattr(g, "is_sparse_grad", False):  # rows of a lookup with sparse=True: a sparse .grad
        g.accumulate_into(t)
        return
    hooks = getattr(t, "_hooks", None)
    if hooks is not None and hooks[0]:
        g = _leaf_prehooks(hooks[0], g)
    if t.grad is None:
        # Own the memory: g may be shared with other leaves or with saved arrays.
        xp_copy = g.copy() if g.flags.c_contiguous else g.copy(order="C")
        t.grad = _new(xp_copy)
    else:
        gd = t.grad._data
        gd += g
    if hooks is not None and hooks[1]:
        for h in hooks[1]:
            h(t)


def _leaf_prehooks(hooks: list, g: Any) -> Any:
    """Run a leaf's ``register_hook`` hooks on its gradient ``g``; a returned tensor replaces it."""
    for h in hooks:
        r = h(_new(g))
        if r is not None:
            g = r._data if hasattr(r, "_data") else r
    return g


def _check_grad(t: Any, g: Any, i: int) -> Any:
    Tensor = _Tensor  # noqa: N806 - the class (bound by mpitensor.tensor)
    if g is None:
        if t._data.size != 1:
            raise RuntimeError(
                f"backward() without a gradient needs a one-element output, but tensor {i} has "
                f"shape {tuple(t._data.shape)}: pass a gradient of that shape, e.g. "
                f"t.backward(mt.ones_like(t)), or reduce it first (t.sum().backward())"
            )
        xp = _xp(t._data)
        return xp.ones(t._data.shape, dtype=t._data.dtype)
    g = g._data if isinstance(g, Tensor) else g
    if not hasattr(g, "shape"):
        g = np.asarray(g, dtype=t._data.dtype)
    if tuple(g.shape) != tuple(t._data.shape):
        raise RuntimeError(
            f"Mismatch in shape: grad_output[{i}] has a shape of {tuple(g.shape)} and output[{i}] "
            f"has a shape of {tuple(t._data.shape)}; pass a gradient shaped like the tensor"
        )
    return g


def backward(
    tensors: Any,
    grad_tensors: Any = None,
    retain_graph: Optional[bool] = None,
    create_graph: bool = False,
    inputs: Any = None,
) -> None:
    """Compute the gradients of ``tensors`` with respect to the graph leaves, into ``.grad``.

    Args:
        tensors: a tensor or a sequence of tensors to differentiate.
        grad_tensors: the gradient of each (None for a one-element tensor means 1).
        retain_graph: keep saved arrays so backward can run through the graph again.
        create_graph: not supported (no higher-order gradients); must be False.
        inputs: if given, only these leaves accumulate gradients.

    Raises:
        RuntimeError: a tensor that does not require grad, a missing or misshapen gradient, or
            a second backward through a released graph.

    Example:
        >>> import mpitensor as mt
        >>> x = mt.tensor([1.0, 2.0], requires_grad=True)
        >>> backward([x * 3], [mt.ones(2)])
        >>> x.grad
        tensor([3., 3.])
    """
    Tensor = _Tensor  # noqa: N806 - the class (bound by mpitensor.tensor)
    if create_graph:
        raise NotImplementedError(CREATE_GRAPH_REFUSED.format("backward"))
    only = None
    if inputs is not None:
        only = {id(t) for t in ([inputs] if isinstance(inputs, Tensor) else inputs)}
    _run(make_roots(tensors, grad_tensors), bool(retain_graph), only)


CREATE_GRAPH_REFUSED = (
    "{}(create_graph=True) (higher-order gradients) is not supported by mpitensor's autograd: "
    "its backward formulas work on arrays, so a gradient has no graph of its own"
)


def make_roots(tensors: Any, grad_tensors: Any) -> list:
    """Pair each output tensor with its checked starting gradient: the roots of a backward pass.

    Raises:
        RuntimeError: a tensor that does not require grad, a wrong number of gradients, or a
            missing or misshapen gradient.
    """
    Tensor = _Tensor  # noqa: N806 - the class (bound by mpitensor.tensor)
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    tensors = list(tensors)
    if grad_tensors is None or isinstance(grad_tensors, Tensor) or hasattr(grad_tensors, "shape"):
        grad_tensors = [grad_tensors] * len(tensors) if grad_tensors is None else [grad_tensors]
    grad_tensors = list(grad_tensors)
    if len(grad_tensors) != len(tensors):
        raise RuntimeError(
            f"got {len(grad_tensors)} gradients for {len(tensors)} tensors; pass one each"
        )
    roots = []
    for i, (t, g) in enumerate(zip(tensors, grad_tensors)):
        if not t._requires_grad:
            raise RuntimeError(
                f"element {i} of tensors does not require grad and does not have a grad_fn; "
                f"create the leaves with requires_grad=True and compute outside no_grad()"
            )
        roots.append((t, _check_grad(t, g, i)))
    return roots


def queue_callback(callback: Callable[[], None],
                   on_error: Optional[Callable[[BaseException], None]] = None) -> None:
    """Run ``callback()`` once the backward pass now running has finished (from a hook).

    DDP uses it to wait for its last all-reduces before ``backward()`` returns, as torch's
    ``Variable._execution_engine.queue_callback`` does. ``on_error(exc)``, if given, runs
    instead when an exception ends the pass before the callback ran (DDP tells its peers that
    its gradient traffic stopped half-way); the exception then propagates as it was.

    Raises:
        RuntimeError: when called outside a backward pass.
    """
    if _mode.callbacks is None:
        raise RuntimeError(
            "queue_callback() can only be called during a backward pass (from a hook)"
        )
    _mode.callbacks.append((callback, on_error))


def _run(roots: list, retain: bool, only: Optional[set], capture: Any = None) -> None:
    """Run backward from ``roots``; with ``capture`` (``grad_api._Capture``), keep the gradients
    of its tensors instead of accumulating into leaves, and run only the nodes above them."""
    outer = _mode.callbacks
    _mode.callbacks = []
    i = 0  # callbacks started
    try:
        # torch computes inf/nan gradients silently; one errstate for the whole pass is cheap
        with np.errstate(all="ignore"):
            _run_graph(roots, retain, only, capture)
        # Callbacks may queue more callbacks; run until none is left.
        while i < len(_mode.callbacks):
            i += 1
            _mode.callbacks[i - 1][0]()
    except BaseException as exc:
        for _, on_error in _mode.callbacks[i:]:  # the ones that never ran
            if on_error is not None:
                on_error(exc)
        raise
    finally:
        _mode.callbacks = outer


def _run_graph(roots: list, retain: bool, only: Optional[set], capture: Any = None) -> None:
    # 1. Count incoming gradients for every node and leaf reachable from the roots (with a
    # capture: only the nodes and tensors its plan keeps, and nothing below a captured node
    # that has no other captured tensor below it).
    deps: dict = {}
    stack = []
    run = capture.run if capture is not None else None
    for t, _ in roots:
        n = t.grad_fn if t.grad_fn is not None else t
        if n not in deps:
            deps[n] = 0
            if t.grad_fn is not None and (run is None or n in run):
                stack.append(n)
    while stack:
        node = stack.pop()
        if node.released:
            raise RuntimeError(SECOND_BACKWARD.format(node.name()))
        for n in node._next:
            if n is None or (run is not None and n not in capture.reach):
                continue
            if n in deps:
                deps[n] += 1
            else:
                deps[n] = 1
                if type(n) is Node and (run is None or n in run):
                    stack.append(n)
    # 2. Seed the roots, then run nodes newest first as their inputs complete.
    bufs: dict = {}
    ready: list = []
    for t, g in roots:
        n = t.grad_fn if t.grad_fn is not None else t
        _add(bufs, n, g)
    for t, _ in roots:
        n = t.grad_fn if t.grad_fn is not None else t
        if deps[n] == 0:
            deps[n] = -1  # queued
            if type(n) is Node:
                heapq.heappush(ready, n)
            else:
                _finish_leaf(n, bufs.pop(n), only, capture)
    anomaly = _anomaly._state.enabled
    while ready:
        node = heapq.heappop(ready)
        g = bufs.pop(node, None)
        if run is not None:  # a non-leaf's gradient: what flows into its grad_fn
            if node not in run:  # as torch: its tensor hooks first, when nothing runs after
                capture.store(node, _run_prehooks(node, g) if node.pre_hooks else g)
                continue
            capture.store(node, g)
        if node.pre_hooks:
            g = _run_prehooks(node, g)
        grads = node.fn.backward(node, g) if g is not None else None
        if not retain:
            node.saved = ()
            node.released = True
        if grads is not None and type(grads) is not tuple:
            grads = tuple(grads) if isinstance(grads, list) else (grads,)
        if anomaly and grads is not None:
            _anomaly.check_node(node, grads)
        for i, n in enumerate(node._next):
            d = deps.get(n)  # None: no gradient wanted there, or pruned by a capture
            if d is None:
                continue
            gi = grads[i] if grads is not None and i < len(grads) else None
            if gi is not None:
                _add(bufs, n, gi)
            d -= 1
            deps[n] = d
            if d == 0:
                if type(n) is Node:
                    heapq.heappush(ready, n)
                else:
                    gl = bufs.pop(n, None)
                    if gl is not None:
                        _finish_leaf(n, gl, only, capture)


def _add(bufs: dict, n: Any, g: Any) -> None:
    prev = bufs.get(n)
    if prev is None:
        bufs[n] = g
    else:
        if prev.shape != g.shape:  # a leaf used with broadcasting in two places
            shape = n._data.shape if type(n) is not Node else n.out_meta[0]
            prev, g = _sum_to(prev, shape), _sum_to(g, shape)
        bufs[n] = prev + g  # never in place: prev may alias an array saved elsewhere


def _finish_leaf(t: Any, g: Any, only: Optional[set], capture: Any = None) -> None:
    if capture is not None:
        capture.store(t, g)
        return
    if only is not None and id(t) not in only:
        return
    _accumulate(t, _leaf_grad(t, g))


def _run_prehooks(node: Node, g: Any) -> Any:
    for h in node.pre_hooks or ():
        r = h(_new(g))
        if r is not None:
            g = r._data if hasattr(r, "_data") else r
    return g


# --------------------------------------------------------------------------------------------
# Tensor-side entry points (bound as Tensor methods in tensor.py)


def tensor_backward(
    self: Any, gradient: Any = None, retain_graph: Optional[bool] = None,
    create_graph: bool = False, inputs: Any = None,
) -> None:
    """Compute the gradient of this tensor w.r.t. graph leaves (``Tensor.backward``)."""
    backward([self], [gradient], retain_graph, create_graph, inputs)


def register_hook(self: Any, hook: Callable) -> _RemovableHandle:
    """Run ``hook(grad)`` when this tensor's gradient is computed; a returned tensor replaces it.

    On a leaf the hook sees the gradient before it is accumulated into ``.grad``; on a
    non-leaf, before it flows into the op that made the tensor.
    """
    if not self._requires_grad:
        raise RuntimeError(
            "cannot register a hook on a tensor that doesn't require gradient; set "
            "requires_grad=True first"
        )
    if self.grad_fn is not None:
        node = self.grad_fn
        node.register_prehook(hook)
        return _RemovableHandle(node.pre_hooks, hook)
    hooks = _leaf_hooks(self)
    hooks[0].append(hook)
    return _RemovableHandle(hooks[0], hook)


def register_post_accumulate_grad_hook(self: Any, hook: Callable) -> _RemovableHandle:
    """Run ``hook(tensor)`` on a leaf right after its ``.grad`` has been accumulated."""
    if self.grad_fn is not None:
        raise RuntimeError(
            "post accumulate grad hooks cannot be registered on non-leaf tensors"
        )
    if not self._requires_grad:
        raise RuntimeError(
            "cannot register a hook on a tensor that doesn't require gradient; set "
            "requires_grad=True first"
        )
    hooks = _leaf_hooks(self)
    hooks[1].append(hook)
    return _RemovableHandle(hooks[1], hook)


def _leaf_hooks(t: Any) -> tuple:
    hooks = getattr(t, "_hooks", None)
    if hooks is None:
        hooks = ([], [])
        t._hooks = hooks
    return hooks


class _RemovableHandle:
    """Returned by hook registration; ``remove()`` unregisters the hook."""

    def __init__(self, where: list, hook: Callable) -> None:
        self._where = where
        self._hook = hook

    def remove(self) -> None:
        """Unregister the hook (a no-op when already removed)."""
        try:
            self._where.remove(self._hook)
        except ValueError:
            pass
