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

In-place operations are recorded too (:func:`apply_inplace`). Every tensor has a version
counter, shared with the views of its storage and raised by each in-place write; a node notes
the versions of the tensors whose arrays it saved, and reading them in backward fails with a
clear error when one was changed since. An in-place write into a view also rewires the graph of
the view's base (:class:`_CopySlices`) and of the base's other live views (:class:`_AsStrided`).

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
import math
import threading
import weakref
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
    "apply_inplace",
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
    - ``forward_(ctx, x, *args)``, optional: the in-place form, which writes the result into
      ``x`` itself and returns it (see :func:`apply_inplace`; without it, ``forward``'s result
      is copied into the tensor).

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
            if node.saved:
                _note_versions(node, args, t)
        return t


class Node:
    """One recorded operation: the ``grad_fn`` of the tensor it produced (and its ``ctx``).

    Attributes:
        fn: the :class:`Function` subclass.
        next_functions: per forward argument, where its gradient goes: ``(node, 0)`` for an
            input made by another op, ``(leaf_tensor, 0)``-like entries for leaves (as
            ``AccumulateGrad`` in torch) and ``(None, 0)`` where no gradient is needed.
        needs_input_grad: per forward argument, whether a gradient is wanted.
        versions: per saved array that belongs to a tensor, ``(counter, version, producer,
            index into saved)``, checked when backward reads ``saved_tensors``.
    """

    versions: tuple = ()  # most nodes save no tensor's array: no instance attribute then

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
        if self.versions:
            _check_versions(self)
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
# Version counters
#
# A tensor's ``_vc`` slot is None (version 0, shared with nobody yet) or a counter
# ``[version, views, prune_at]``: the version, weak references to the live views of the storage
# (None until the first one) and the length at which dead references are dropped. Views share
# their base's counter, so a write through any of them is seen by all. A view's ``_view`` slot
# is ``(root, view_fn, outside)``: the tensor at the root of the chain of views, a function that
# maps an array shaped like the root to the view's elements, and whether the view was taken
# outside autograd (under no_grad) from a root that requires grad.

_SELF = object()  # the producer of a saved array that is the recording node's own output
_SCALARS = (float, int, bool, complex)


def version_cell(t: Any) -> list:
    """The version counter of ``t``, created on first use."""
    c = getattr(t, "_vc", None)
    if c is None:
        c = t._vc = [0, None, 8]
    return c


def bump_version(t: Any) -> None:
    """Count an in-place write into ``t`` (and so into every view of its storage)."""
    c = getattr(t, "_vc", None)
    if c is None:
        t._vc = [1, None, 8]
    else:
        c[0] += 1


def storage(x: Any) -> Any:
    """The object that owns ``x``'s memory (NumPy and CuPy collapse chains of views onto it)."""
    b = x.base
    return x if b is None else b


def _chain(first: Callable, then: Callable, a: Any) -> Any:
    return then(first(a))


def link_view(out: Any, base: Any, view_fn: Callable) -> None:
    """Record that ``out``'s array is a view of ``base``'s, taken by ``view_fn`` (array -> array).

    ``out`` shares ``base``'s version counter and remembers the root of the chain of views, so
    an in-place write into either rewires the graph of the other.
    """
    cell = version_cell(base)
    out._vc = cell
    info = getattr(base, "_view", None)
    if info is None:
        root, fn = base, view_fn
    else:
        root, fn = info[0], functools.partial(_chain, info[1], view_fn)
    out._view = (root, fn, root._requires_grad and not out._requires_grad)
    views = cell[1]
    if views is None:
        cell[1] = [weakref.ref(out)]
        return
    views.append(weakref.ref(out))
    if len(views) > cell[2]:  # drop the dead ones now and then, not on every view
        views[:] = [r for r in views if r() is not None]
        cell[2] = 2 * len(views) + 8


def _key(s: Any) -> Any:
    """The owner of array ``s``'s memory (see :func:`storage`); None for anything else."""
    if s is None or type(s) in _SCALARS:
        return None
    b = getattr(s, "base", _SCALARS)
    if b is _SCALARS:  # not an array
        return None
    return s if b is None else b


def _note_versions(node: Node, args: Any, out: Any) -> None:
    """Note, for each array ``node`` saved that belongs to one of ``args`` (or to ``out``, the
    node's own output), that tensor's counter and current version."""
    # (on the path of every recorded op that saves arrays: written for speed)
    Tensor = _Tensor  # noqa: N806 - the class
    notes = None
    i = -1
    for s in node.saved:
        i += 1
        if type(s) is _ndarray:
            k = s.base
        else:
            k = _key(s)
            if k is None:
                continue
        if k is None:
            k = s
        owner = None
        for c in args:
            if isinstance(c, Tensor):
                d = c._data
                b = d.base
                if (d if b is None else b) is k:
                    owner = c
                    break
        if owner is None:
            if out is None:
                continue
            d = out._data
            b = d.base
            if (d if b is None else b) is not k:
                continue
            owner = out
        cell = getattr(owner, "_vc", None)
        if cell is None:
            cell = owner._vc = [0, None, 8]
        # producer: a node, or None for a leaf; never the node itself, which would make a
        # reference cycle and keep the saved arrays alive until the next garbage collection
        note = (cell, cell[0], _SELF if owner is out else owner.grad_fn, i)
        if notes is None:
            notes = [note]
        else:
            notes.append(note)
    if notes is not None:
        node.versions = tuple(notes)


def _check_versions(node: Node) -> None:
    for cell, version, producer, i in node.versions:
        if cell[0] != version:
            s = node.saved[i]
            if producer is None:
                what = "a leaf tensor"
            else:
                owner = node if producer is _SELF else producer
                what = f"the output of {owner.name()}"
            raise RuntimeError(
                f"{node.name()} cannot compute its gradient: a tensor of shape {list(s.shape)} "
                f"and dtype {s.dtype} that it saved for backward ({what}) was modified by an "
                f"inplace operation afterwards: it is at version {cell[0]}, but version "
                f"{version} was saved. Make that change out of place (e.g. `y = y + 1` "
                f"instead of `y += 1`), or change a clone() of the tensor"
            )


# --------------------------------------------------------------------------------------------
# In-place operations


def leaf_in_place_error(what: str) -> RuntimeError:
    """The error for changing, in place, a leaf tensor that requires grad (under grad mode).

    Autograd would lose the value the leaf had; parameter updates belong under ``no_grad()``.
    """
    return RuntimeError(
        f"{what} is an in-place change of a leaf tensor that requires grad, which autograd "
        "cannot record; wrap parameter updates in `with mpitensor.no_grad():` (or write to "
        "`t.data`), or use the out-of-place form")


def _check_view_mode(info: tuple, what: str) -> None:
    if info[2]:
        raise RuntimeError(
            f"{what} writes, with grad mode on, into a view that was taken under no_grad() of a "
            f"tensor that requires grad; autograd cannot tell whether the write should be "
            f"recorded. Take the view and write into it both inside no_grad() (not recorded) "
            f"or both outside it (recorded)"
        )


def inplace_recorded(t: Any, what: str, *others: Any) -> bool:
    """Whether an in-place write into ``t`` from ``others`` must be recorded (grad mode on and
    ``t`` or a tensor among ``others`` requires grad); call it only with grad mode on.

    Raises:
        RuntimeError: ``t`` is a view taken under no_grad() of a tensor that requires grad.
    """
    if t._requires_grad:
        return True
    Tensor = _Tensor  # noqa: N806 - the class
    for o in others:
        if isinstance(o, Tensor) and o._requires_grad:
            return True
    info = getattr(t, "_view", None)
    if info is not None:
        _check_view_mode(info, what)
    return False


def write_into(x: Any, out: Any, what: str) -> None:
    """Copy the result ``out`` of an in-place op into ``x``, cast to ``x``'s dtype.

    Raises:
        TypeError: ``out``'s dtype cannot be written into ``x`` (a float into an integer...).
    """
    if out is x:
        return
    if out.dtype != x.dtype:
        from mpitensor._core.promotion import can_cast  # noqa: PLC0415 - _promotion is light

        if not can_cast(out.dtype, x.dtype):
            raise TypeError(
                f"result type {out.dtype} can't be cast to the desired output type {x.dtype} "
                f"of this in-place {what}; use the out-of-place form or convert the tensor "
                f"first, e.g. t = t.float()"
            )
    _xp(x).copyto(x, out, casting="unsafe")


def apply_inplace(fn: type, what: str, t: Any, *args: Any) -> Any:
    """Write ``fn(t, *args)`` into ``t`` and record it: ``t``'s ``grad_fn`` becomes the new node.

    ``fn`` is a :class:`Function`; if it defines ``forward_(ctx, x, *args)``, that writes into
    ``x`` itself and returns it, else its ``forward`` result is copied into ``t``. Saved arrays
    that the write would change are copied first, except ``fn``'s own output, which then is
    ``t`` at its new version. Call it with grad mode on and ``t`` or a tensor among ``args``
    requiring grad (see :func:`inplace_recorded`).

    When ``t`` is a view, the write goes into its root's storage, so the root's graph is
    rewired through a :class:`_CopySlices` node; the root's live views get new grad_fns.

    Raises:
        RuntimeError: ``t`` is a leaf (or a view of a leaf) that requires grad, or a view taken
            under no_grad() of a tensor that requires grad.
        TypeError: the result's dtype cannot be written into ``t``.
    """
    Tensor = _Tensor  # noqa: N806 - the class
    if t._requires_grad and t.grad_fn is None:
        raise leaf_in_place_error(what)
    info = getattr(t, "_view", None)
    root = None
    if info is not None:
        _check_view_mode(info, what)
        root = info[0]
        if root._requires_grad and root.grad_fn is None:
            raise RuntimeError(
                f"{what} writes into a view of a leaf tensor that requires grad, which "
                f"autograd cannot record; do it under `with mpitensor.no_grad():`, or on a "
                f"clone() of the leaf"
            )
    x = t._data
    if isinstance(x, _ndarray) and not x.flags.writeable:
        raise RuntimeError(
            f"{what} writes into a read-only array (an expand()ed view, in which several "
            f"elements share one memory location, or a read-only NumPy array); clone() it first"
        )
    raw = [x]
    nxt = [t.grad_fn if t._requires_grad else None]
    needs = [t._requires_grad]
    for a in args:
        if isinstance(a, Tensor):
            raw.append(a._data)
            if a._requires_grad:
                nxt.append(a if a.grad_fn is None else a.grad_fn)
                needs.append(True)
                continue
        else:
            raw.append(a)
        nxt.append(None)
        needs.append(False)
    node = _object_new(Node)
    node._init(fn, nxt, tuple(needs))
    forward_ = getattr(fn, "forward_", None)
    out = forward_(node, *raw) if forward_ is not None else fn.forward(node, *raw)
    kx = storage(x)
    if node.saved and any(isinstance(a, Tensor) and storage(a._data) is kx for a in args):
        # another operand is t's storage (x.mul_(x)): what the op saved of that operand is
        # overwritten below, as in torch, where backward then refuses it
        _note_versions(node, args, None)
    if out is not x:
        if node.saved and not node.versions:  # keep old values backward reads from the write
            node.saved = tuple(s.copy() if s is not out and _key(s) is kx else s
                               for s in node.saved)
        if storage(out) is kx:  # a view of x: copying it into x would read what it writes
            out = out.copy()
        write_into(x, out, what)
        if node.saved:  # the output is x now (at its new version), not a second array
            node.saved = tuple(x if s is out else s for s in node.saved)
    bump_version(t)
    node.out_meta = (x.shape, x.dtype)
    cell = version_cell(t)
    if root is None:
        t.grad_fn = node
        t._requires_grad = True
    else:
        cs = _object_new(Node)
        rg = root._requires_grad
        cs._init(_CopySlices, [root.grad_fn if rg else None, node], (rg, True))
        cs.view = (info[1], None)
        cs.out_meta = (root._data.shape, root._data.dtype)
        root.grad_fn = cs
        root._requires_grad = True
    if node.saved and not node.versions:
        _note_versions(node, args, t)
    if cell[1]:
        _refresh_views(cell, t if root is None else root)
    return t


def _refresh_views(cell: list, root: Any) -> None:
    """Give every live view of ``root`` (taken with grad mode on) a grad_fn reading ``root``'s
    current graph: after an in-place write, the old one would miss it."""
    fn = root.grad_fn
    shape_dtype = (root._data.shape, root._data.dtype)
    for r in cell[1]:
        v = r()
        if v is None:
            continue
        info = v._view
        if info is None or info[0] is not root or info[2]:
            continue
        node = _object_new(Node)
        node._init(_AsStrided, [fn], (True,))
        node.view = (info[1], None)
        node.base_meta = shape_dtype
        node.out_meta = (v._data.shape, v._data.dtype)
        v.grad_fn = node
        v._requires_grad = True


def _view_index(node: Node, shape: tuple, m: Any) -> tuple:
    """The flat (C order) positions in the root that the view of ``node`` holds, shaped like
    the view, and whether one position appears twice (an expanded view); cached on the node."""
    view_fn, cached = node.view
    if cached is None:
        idx = m.asarray(view_fn(m.arange(math.prod(shape)).reshape(shape)))
        dup = idx.size > 1 and int(m.bincount(idx.ravel()).max()) > 1
        cached = (idx, dup)
        node.view = (view_fn, cached)
    return cached


class _AsStrided(Function):
    """The grad_fn of a view after an in-place write into its storage: its elements, taken
    from its root's current value; the gradient goes back to their positions in the root."""

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype = ctx.base_meta
        m = _xp(g)
        idx, dup = _view_index(ctx, shape, m)
        gb = m.zeros(math.prod(shape), dtype=dtype)
        if dup:
            if m is np:
                np.add.at(gb, idx, g)
            else:
                import cupyx  # noqa: PLC0415 - only on GPUs

                cupyx.scatter_add(gb, idx, g)
        else:
            gb[idx] = g
        return (gb.reshape(shape),)


class _CopySlices(Function):
    """The grad_fn of a tensor after an in-place write into one of its views: its elements
    outside the view pass the gradient to its old value; those inside, to the in-place op."""

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape = ctx.out_meta[0]
        m = _xp(g)
        idx, _ = _view_index(ctx, shape, m)
        flat = m.ascontiguousarray(g).reshape(-1)
        region = flat[idx]
        g_old = None
        if ctx.needs_input_grad[0]:
            g_old = flat.copy()
            g_old[idx] = 0
            g_old = g_old.reshape(shape)
        return g_old, region


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
    if getattr(g, "is_sparse_grad", False):  # rows of a lookup with sparse=True: a sparse .grad
        g.accumulate_into(t)
        return
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

