"""In-place operations under autograd: recording ``x.op_()`` as a node, and rewiring the graph
of a view's base (:class:`_CopySlices`) and of its other live views (:class:`_AsStrided`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpitensor._base import determinism as _determinism
from mpitensor._core.devices import xp as _xp

from ._versions import bump_version, note_versions, storage, storage_key, version_cell
from .function import ArrayFunction as Function, Node, _edges

_ndarray = np.ndarray
_object_new = object.__new__

# The Tensor class, set by mpitensor.autograd._bind_tensor once
# mpitensor.tensor has made it (tensor imports autograd, so autograd cannot import it).
_Tensor: Any = None


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


def _writable_target(t: Any, what: str) -> tuple:
    """``(view info, root)`` of the tensor an in-place op writes into, after refusing what
    autograd cannot record: a leaf that requires grad (or a view of one), a view taken under
    no_grad() of a tensor that requires grad, a read-only array."""
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
    return info, root


def _become_output(t: Any, node: Node, root: Any, info: Any) -> None:
    """Make ``t`` the output of the in-place ``node``: its grad_fn, or, for a view, its root's
    graph rewired through a :class:`_CopySlices` node that writes the view's new values."""
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
    info, root = _writable_target(t, what)
    x = t._data
    raw = [x]
    nxt = [t.grad_fn if t._requires_grad else None]
    needs = [t._requires_grad]
    _edges(args, raw, nxt, needs)
    node = _object_new(Node)
    node._init(fn, nxt, tuple(needs))
    forward_ = getattr(fn, "forward_", None)
    out = forward_(node, *raw) if forward_ is not None else fn.forward(node, *raw)
    kx = storage(x)
    if node.saved and any(isinstance(a, Tensor) and storage(a._data) is kx for a in args):
        # another operand is t's storage (x.mul_(x)): what the op saved of that operand is
        # overwritten below, as in torch, where backward then refuses it
        note_versions(node, args, None)
    if out is not x:
        if node.saved and not node.versions:  # keep old values backward reads from the write
            node.saved = tuple(s.copy() if s is not out and storage_key(s) is kx else s
                               for s in node.saved)
        if storage(out) is kx:  # a view of x: copying it into x would read what it writes
            out = out.copy()
        write_into(x, out, what)
        if node.saved:  # the output is x now (at its new version), not a second array
            node.saved = tuple(x if s is out else s for s in node.saved)
    bump_version(t)
    node.out_meta = (x.shape, x.dtype)
    cell = version_cell(t)
    _become_output(t, node, root, info)
    if node.saved and not node.versions:
        note_versions(node, args, t)
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
            elif not _determinism.add_at(gb, idx, g):  # atomics unless deterministic
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
