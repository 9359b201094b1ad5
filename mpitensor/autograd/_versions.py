"""Version counters and views: how autograd notices an in-place write into an array it saved.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

import numpy as np

_ndarray = np.ndarray

# The Tensor class, set by mpitensor.autograd._bind_tensor once
# mpitensor.tensor has made it (tensor imports autograd, so autograd cannot import it).
_Tensor: Any = None


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


def storage_key(s: Any) -> Any:
    """The owner of array ``s``'s memory (see :func:`storage`); None for anything else."""
    if s is None or type(s) in _SCALARS:
        return None
    b = getattr(s, "base", _SCALARS)
    if b is _SCALARS:  # not an array
        return None
    return s if b is None else b


def note_versions(node: Any, args: Any, out: Any) -> None:
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
            k = storage_key(s)
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


def check_versions(node: Any) -> None:
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
