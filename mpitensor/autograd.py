"""Reverse-mode automatic differentiation: graph nodes, the backward engine and grad mode.

Every differentiable operation is a :class:`Function` subclass with a ``forward`` and a
``backward`` side by side. Both work on raw arrays (``numpy.ndarray`` or ``cupy.ndarray``), never on
Tensors, so the engine adds one small object per recorded operation and nothing else. Array
modules are taken from the inputs (``backend.array_module``); no op imports NumPy or CuPy to
compute.

The graph is made of nodes (one per recorded op, the ``grad_fn`` of its output) and leaves
(tensors with ``requires_grad=True`` and no ``grad_fn``). :func:`backward` counts, for every node
and leaf reachable from the roots, how many gradients it will receive, then runs nodes in
reverse creation order as soon as all of theirs have arrived. A leaf's gradient is accumulated
into ``.grad`` once, when its last contribution is in; hooks registered with
``Tensor.register_post_accumulate_grad_hook`` run right after that (DDP launches its bucket
all-reduces from there, while the rest of backward is still running).

Example:
    >>> import mpitensor as mt
    >>> x = mt.tensor([1.0, 2.0], requires_grad=True)
    >>> (x * x).sum().backward()
    >>> x.grad
    tensor([2., 4.])
"""

from __future__ import annotations

import functools
import heapq
import itertools
import threading
from collections.abc import Iterator
from typing import Any, Callable, Optional

import numpy as np

__all__ = [
    "Function",
    "backward",
    "grad_enabled_for",
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "is_grad_enabled",
    "inference_mode",
    "queue_callback",
]

_ndarray = np.ndarray
_object_new = object.__new__
_seq = itertools.count()  # creation order of nodes: backward runs newest first

# Set by mpitensor.tensor once Tensor exists (the two modules import each other).
_Tensor: Any = None
_new: Any = None


def _bind_tensor(tensor_cls: type, new: Callable) -> None:
    """Give the engine the Tensor class and its fast wrapper (called by ``mpitensor.tensor``)."""
    global _Tensor, _new
    _Tensor, _new = tensor_cls, new


class _GradMode(threading.local):
    enabled = True
    callbacks: Optional[list] = None  # set while a backward pass runs (queue_callback)


_mode = _GradMode()


def is_grad_enabled() -> bool:
    """Return True when operations on tensors that require grad are being recorded."""
    return _mode.enabled


class set_grad_enabled:  # noqa: N801 - torch's name
    """Turn gradient recording on or off; usable as a call, a context manager or a decorator.

    Args:
        mode: True to record operations, False not to.

    Example:
        >>> with set_grad_enabled(False):
        ...     pass
    """

    def __init__(self, mode: bool) -> None:
        self.prev = _mode.enabled
        self.mode = bool(mode)
        _mode.enabled = self.mode

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        _mode.enabled = self.prev

    def __call__(self, fn: Callable) -> Callable:
        _mode.enabled = self.prev  # decorating must not change the mode now
        return _with_mode(fn, self.mode)


def _with_mode(fn: Callable, mode: bool) -> Callable:
    """``fn`` wrapped to run with grad mode ``mode`` (the decorator form of the contexts)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with set_grad_enabled(mode):
            return fn(*args, **kwargs)

    return wrapper


class _ModeContext:
    """Base of ``no_grad``/``enable_grad``: a context manager that is also a decorator."""

    _mode_value = True

    def __enter__(self) -> None:
        self.prev = _mode.enabled
        _mode.enabled = self._mode_value

    def __exit__(self, *exc: Any) -> None:
        _mode.enabled = self.prev

    def __call__(self, fn: Callable) -> Callable:
        return _with_mode(fn, self._mode_value)


class no_grad(_ModeContext):  # noqa: N801 - torch's name
    """Context manager (and decorator) that stops recording operations for autograd.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.ones(2, requires_grad=True)
        >>> with mt.no_grad():
        ...     w -= 0.1          # an in-place update of a leaf, as optimisers do
        >>> (w * 2).requires_grad
        True
    """

    _mode_value = False


class enable_grad(_ModeContext):  # noqa: N801 - torch's name
    """Context manager (and decorator) that turns recording back on inside ``no_grad``."""

    _mode_value = True


class inference_mode(_ModeContext):  # noqa: N801 - torch's name
    """Like :class:`no_grad` (this implementation has no separate inference tensors)."""

    _mode_value = False

    def __init__(self, mode: bool = True) -> None:
        self._mode_value = not mode


# --------------------------------------------------------------------------------------------
# Nodes


class Function:
    """Base class of differentiable operations, in the style of ``torch.autograd.Function``.

    Subclasses define two static methods that work on raw arrays:

    - ``forward(ctx, *args)``: ``args`` are the call's arguments with every Tensor replaced by
      its array; it returns one array and may store what backward needs on ``ctx``
      (``ctx.save_for_backward(*arrays)`` or plain attributes).
    - ``backward(ctx, grad)``: ``grad`` is the gradient of the output (an array of the output's
      shape); it returns one gradient array (or None) per forward argument, in order. Entries
      for non-tensor arguments and for inputs that need no gradient
      (``ctx.needs_input_grad[i]`` is False) may be None.

    ``Function.apply(*args)`` runs forward and, when grad mode is on and any tensor argument
    requires grad, records the node as the output's ``grad_fn``.

    Example:
        >>> import mpitensor as mt
        >>> class Square(Function):
        ...     @staticmethod
        ...     def forward(ctx, x):
        ...         ctx.save_for_backward(x)
        ...         return x * x
        ...     @staticmethod
        ...     def backward(ctx, g):
        ...         (x,) = ctx.saved_tensors
        ...         return (2 * x * g,)
        >>> t = mt.tensor([3.0], requires_grad=True)
        >>> Square.apply(t).backward(mt.ones(1))
        >>> t.grad
        tensor([6.])
    """

    forward: Callable[..., Any]
    backward: Callable[..., Any]

    @classmethod
    def apply(cls, *args: Any) -> Any:
        """Run the operation on ``args``; record it for autograd where that is needed."""
        Tensor = _Tensor  # noqa: N806 - the class
        raw = []
        nxt = []
        needs = []
        record = False
        for a in args:  # one pass: the arrays for forward and the graph edges for the node
            if isinstance(a, Tensor):
                raw.append(a._data)
                if a._requires_grad:
                    record = True
                    fn = a.grad_fn
                    nxt.append(a if fn is None else fn)
                    needs.append(True)
                    continue
            else:
                raw.append(a)
            nxt.append(None)
            needs.append(False)
        record = record and _mode.enabled
        if record:
            node = _object_new(Node)
            node._init(cls, nxt, tuple(needs))
        else:
            node = _NO_RECORD
        out = cls.forward(node, *raw)
        t = _new(out)
        if record:
            node.out_meta = (out.shape, out.dtype)
            t._requires_grad = True
            t.grad_fn = node
        return t


class Node:
    """One recorded operation: the ``grad_fn`` of the tensor it produced (and its ``ctx``).

    Attributes:
        fn: the :class:`Function` subclass.
        next_functions: per forward argument, where its gradient goes: ``(node, 0)`` for an
            input made by another op, ``(leaf_tensor, 0)``-like entries for leaves (as
            ``AccumulateGrad`` in torch) and ``(None, 0)`` where no gradient is needed.
        needs_input_grad: per forward argument, whether a gradient is wanted.
    """

    def _init(self, fn: type, nxt: list, needs: tuple) -> None:
        # Nodes are made by Function.apply with object.__new__ and this method: the hot path
        # skips the type call and its argument parsing
        self.fn = fn
        self._next = nxt
        self.needs_input_grad = needs
        self.seq = next(_seq)
        self.saved = ()
        self.released = False
        self.pre_hooks: Optional[list] = None
        self.out_meta: Any = None

    def save_for_backward(self, *arrays: Any) -> None:
        """Keep arrays for backward (released after backward unless ``retain_graph``)."""
        self.saved = arrays

    @property
    def saved_tensors(self) -> tuple:
        """The arrays given to :meth:`save_for_backward`."""
        if self.released:
            raise RuntimeError(_SECOND_BACKWARD.format(self.name()))
        return self.saved

    @property
    def next_functions(self) -> tuple:
        """Where each input's gradient goes, as torch's ``grad_fn.next_functions``."""
        return tuple((n, 0) for n in self._next)

    def name(self) -> str:
        """The node's name, as torch prints it (``MulBackward``)."""
        n = self.fn.__name__.lstrip("_")  # private Function classes print as torch's names
        return n if n.endswith("Backward") else f"{n}Backward"

    def register_prehook(self, hook: Callable) -> None:
        """Run ``hook(grad_tensor)`` on the output gradient before this node's backward."""
        if self.pre_hooks is None:
            self.pre_hooks = []
        self.pre_hooks.append(hook)

    def __repr__(self) -> str:
        return f"<{self.name()} object at {id(self):#x}>"

    def __lt__(self, other: Node) -> bool:  # heap order: newest first
        return self.seq > other.seq


class _NoRecord:
    """The ``ctx`` given to forward when nothing is recorded: saving is a no-op."""

    needs_input_grad = ()

    def save_for_backward(self, *arrays: Any) -> None:
        pass

    def __setattr__(self, name: str, value: Any) -> None:
        pass  # forward code writes ctx attributes unconditionally; nothing needs keeping


_NO_RECORD = _NoRecord()

_SECOND_BACKWARD = (
    "{}: this part of the graph was already run backward, and the arrays it saved were freed "
    "then (also after reading saved tensors once a backward is done); pass retain_graph=True to "
    "the first backward() to run backward through the same graph again"
)


def grad_enabled_for(*tensors: Any) -> bool:
    """True when an op on these tensors would be recorded (grad mode on and one requires grad)."""
    if not _mode.enabled:
        return False
    return any(getattr(t, "_requires_grad", False) for t in tensors)


# --------------------------------------------------------------------------------------------
# The engine


def _sum_to(g: Any, shape: tuple) -> Any:
    """Sum a broadcast gradient back down to ``shape``."""
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(
        i + extra for i, n in enumerate(shape) if n == 1 and g.shape[i + extra] != 1
    )
    g = g.sum(axis=axes, keepdims=True) if axes else g
    return g.reshape(shape)


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
    hooks = getattr(t, "_hooks", None)
    if hooks is not None and hooks[0]:
        for h in hooks[0]:
            r = h(_new(g))
            if r is not None:
                g = r._data if hasattr(r, "_data") else r
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


def _xp(x: Any) -> Any:
    if isinstance(x, _ndarray):
        return np
    from mpitensor import backend  # noqa: PLC0415

    return backend.array_module(x)


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
        raise NotImplementedError(
            "create_graph=True (higher-order gradients) is not supported by mpitensor's autograd"
        )
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
    only = None
    if inputs is not None:
        only = {id(t) for t in ([inputs] if isinstance(inputs, Tensor) else inputs)}
    roots = []
    for i, (t, g) in enumerate(zip(tensors, grad_tensors)):
        if not t._requires_grad:
            raise RuntimeError(
                f"element {i} of tensors does not require grad and does not have a grad_fn; "
                f"create the leaves with requires_grad=True and compute outside no_grad()"
            )
        roots.append((t, _check_grad(t, g, i)))
    _run(roots, bool(retain_graph), only)


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


def _run(roots: list, retain: bool, only: Optional[set]) -> None:
    outer = _mode.callbacks
    _mode.callbacks = []
    i = 0  # callbacks started
    try:
        # torch computes inf/nan gradients silently; one errstate for the whole pass is cheap
        with np.errstate(all="ignore"):
            _run_graph(roots, retain, only)
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


def _run_graph(roots: list, retain: bool, only: Optional[set]) -> None:
    # 1. Count incoming gradients for every node and leaf reachable from the roots.
    deps: dict = {}
    stack = []
    for t, _ in roots:
        n = t.grad_fn if t.grad_fn is not None else t
        if n not in deps:
            deps[n] = 0
            if t.grad_fn is not None:
                stack.append(n)
    while stack:
        node = stack.pop()
        if node.released:
            raise RuntimeError(_SECOND_BACKWARD.format(node.name()))
        for n in node._next:
            if n is None:
                continue
            if n in deps:
                deps[n] += 1
            else:
                deps[n] = 1
                if type(n) is Node:
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
                _finish_leaf(n, bufs.pop(n), only)
    while ready:
        node = heapq.heappop(ready)
        g = bufs.pop(node, None)
        if node.pre_hooks:
            g = _run_prehooks(node, g)
        grads = node.fn.backward(node, g) if g is not None else None
        if not retain:
            node.saved = ()
            node.released = True
        if grads is not None and type(grads) is not tuple:
            grads = tuple(grads) if isinstance(grads, list) else (grads,)
        for i, n in enumerate(node._next):
            if n is None:
                continue
            gi = grads[i] if grads is not None and i < len(grads) else None
            if gi is not None:
                _add(bufs, n, gi)
            d = deps[n] - 1
            deps[n] = d
            if d == 0:
                if type(n) is Node:
                    heapq.heappush(ready, n)
                else:
                    gl = bufs.pop(n, None)
                    if gl is not None:
                        _finish_leaf(n, gl, only)


def _add(bufs: dict, n: Any, g: Any) -> None:
    prev = bufs.get(n)
    if prev is None:
        bufs[n] = g
    else:
        if prev.shape != g.shape:  # a leaf used with broadcasting in two places
            shape = n._data.shape if type(n) is not Node else n.out_meta[0]
            prev, g = _sum_to(prev, shape), _sum_to(g, shape)
        bufs[n] = prev + g  # never in place: prev may alias an array saved elsewhere


def _finish_leaf(t: Any, g: Any, only: Optional[set]) -> None:
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


def walk_graph(t: Any) -> Iterator[Node]:
    """Yield every node reachable from ``t.grad_fn`` once (for tests and debugging)."""
    seen = set()
    stack = [t.grad_fn] if t.grad_fn is not None else []
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        yield n
        stack.extend(x for x in n._next if type(x) is Node)
