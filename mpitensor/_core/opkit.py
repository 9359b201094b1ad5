"""The kit for writing an op: everything an op module needs from the Tensor and autograd.

An op is one :class:`Function` that keeps its forward and its backward side by side, on
arrays (NumPy or CuPy); a Tensor method is a thin call through :func:`run`, which records the
op only when an input requires grad. A whole op, from nothing to ``x.cube()``::

    from mpitensor._core.opkit import Function, run, run_inplace, tensor_methods

    class Cube(Function):
        @staticmethod
        def forward(ctx, x):             # x is the array; ctx keeps what backward needs
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):            # g: the output's gradient, an array
            (x,) = ctx.saved_tensors
            return 3 * x * x * g

    @tensor_methods
    class _Methods:                      # what this body defines becomes a Tensor method
        def cube(self):
            return run(Cube, self)

    @tensor_methods
    class _InPlace:
        def cube_(self):                 # in place: recorded as torch does (versions, views)
            return run_inplace(self, Cube, "cube_()")

The rest of the kit: :func:`wrap` makes a Tensor of an array (no copy); :func:`run_view` runs
an op whose result may share memory with its input; :func:`sum_to` sums a broadcast gradient
back to an input's shape; :func:`given_value` makes the op of a value computed outside autograd
with its gradient rule; :data:`NO_RECORD` is the ``ctx`` for running a forward alone;
:func:`serve` hands module-level functions to ``mpitensor.tensor`` (``from mpitensor.tensor
import zeros``). This module is the one place that reaches into the Tensor's internals on an op
author's behalf; op modules import from here, not private names of ``tensor`` or ``autograd``.
"""

from __future__ import annotations

import functools
from typing import Any

from mpitensor import autograd as _autograd
from mpitensor import dtypes as _dt
from mpitensor import tensor as _tensor
from mpitensor._core.devices import xp
from mpitensor._core.promotion import can_cast
from mpitensor.autograd import ArrayFunction as Function, bump_version, grad_enabled_for
from mpitensor.tensor import Tensor

__all__ = [
    "NO_RECORD", "Function", "Tensor", "assign_result", "bump_version", "copy_into",
    "given_value", "grad_enabled_for", "methods_of", "replay", "run", "run_inplace", "run_view",
    "serve", "sum_to", "tensor_methods", "wrap",
]

_grad_mode = _autograd._mode

#: The ``ctx`` of a forward that is not recorded: ``save_for_backward`` and attributes are
#: dropped. ``fn.forward(NO_RECORD, array, ...)`` computes an op on arrays alone.
NO_RECORD = _autograd._NO_RECORD

#: ``wrap(array) -> Tensor``: a Tensor around ``array``, without copying or checking it.
wrap = _tensor._new

#: ``copy_into(x, v)``: ``x[...] = v`` on arrays, ``v`` broadcast, cast and moved to ``x``'s
#: device (not recorded: for filling fresh outputs).
copy_into = _tensor._copy_into

#: ``sum_to(g, shape) -> array``: a gradient broadcast from ``shape`` summed back down to it.
sum_to = _autograd._sum_to


def given_value(name: str, grad: Any, doc: str = "") -> type:
    """A Function ``name`` of ``(x, v)`` whose value is ``v``, computed outside it from ``x`` (a
    draw, an order statistic), and whose gradient for ``x`` is ``grad(g, x, v)`` on arrays."""

    def forward(ctx: Any, x: Any, v: Any) -> Any:
        ctx.save_for_backward(x, v)
        return v

    def backward(ctx: Any, g: Any) -> tuple:
        x, v = ctx.saved_tensors
        return grad(g, x, v), None

    return type(name, (Function,), {"__doc__": doc or None, "__module__": grad.__module__,
                                    "forward": staticmethod(forward),
                                    "backward": staticmethod(backward)})


def run(fn: Any, t: Tensor, *args: Any) -> Tensor:
    """Op ``fn`` (a :class:`Function`) on tensor ``t`` and plain ``args``; a new Tensor.

    It is recorded through ``fn.apply`` only when ``t`` requires grad and grad mode is on;
    otherwise ``fn.forward`` runs alone on the array with :data:`NO_RECORD`, so the unrecorded
    path does no graph work.
    """
    if t._requires_grad and _grad_mode.enabled:
        return fn.apply(t, *args)
    return wrap(fn.forward(NO_RECORD, t._data, *args))


def replay(fn: Any, args: tuple, a: Any) -> Any:
    """``fn``'s forward on array ``a`` with ``args``, unrecorded (a view's replay function)."""
    return fn.forward(NO_RECORD, a, *args)


def _reshape_replay(shape: tuple, a: Any) -> Any:
    return a.reshape(shape)


def run_view(fn: Any, t: Tensor, *args: Any, reshape: bool = False) -> Tensor:
    """:func:`run` for an op that may return a view of ``t``'s array; a view is linked to
    ``t`` (one version counter; in-place writes into either rewire the other's graph).

    ``reshape``: the op only changes the shape, so replaying it on another array is a reshape
    (whatever that array's memory layout allows as a view).
    """
    r = run(fn, t, *args)
    x, y = t._data, r._data
    bx, by = x.base, y.base
    if (x if bx is None else bx) is (y if by is None else by):
        if reshape:
            _autograd.link_view(r, t, functools.partial(_reshape_replay, y.shape))
        else:
            _autograd.link_view(r, t, functools.partial(replay, fn, args))
    return r


def run_inplace(t: Any, fn: Any, what: str, *args: Any) -> Tensor:
    """Write ``fn(t, *args)`` into ``t``: recorded by autograd where needed, else computed on
    the arrays and cast into ``t``'s dtype; returns ``t`` (a bare NumPy/CuPy array ``t`` is
    written in place and returned wrapped in a Tensor). The one in-place runner of the
    package: ``nn``'s in-place functions use it too.

    Raises:
        TypeError: the result's dtype cannot be written into ``t`` (a float into an int...).
        RuntimeError: ``t`` is a leaf that requires grad (outside ``no_grad()``).
    """
    raw = [a._data if isinstance(a, Tensor) else a for a in args]
    if not isinstance(t, Tensor):
        _autograd.write_into(t, fn.forward(NO_RECORD, t, *raw), what)
        return wrap(t)
    if _grad_mode.enabled and _autograd.inplace_recorded(t, what, *args):
        return _autograd.apply_inplace(fn, what, t, *args)
    x = t._data
    _autograd.write_into(x, fn.forward(NO_RECORD, x, *raw), what)
    bump_version(t)
    return t


def assign_result(t: Tensor, r: Tensor, what: str) -> Tensor:
    """Write the tensor ``r``, computed from ``t`` by recorded ops, into ``t`` (the in-place form
    of a composite op): autograd sees a copy, whose gradient flows into ``r``'s graph.

    Raises:
        TypeError: ``r``'s dtype cannot be written into ``t``.
        ValueError: ``r`` does not broadcast to ``t``'s shape.
    """
    x, y = t._data, r._data
    if not can_cast(y.dtype, x.dtype):
        raise TypeError(
            f"result type {_dt.dt_repr(y.dtype)} can't be cast to the desired output type "
            f"{_dt.dt_repr(x.dtype)} of {what}; use the out-of-place form or convert the "
            f"tensor first, e.g. t = t.float()"
        )
    if tuple(xp(y).broadcast_shapes(y.shape, x.shape)) != tuple(x.shape):
        raise ValueError(
            f"{what}: the result's shape {list(y.shape)} does not broadcast to the tensor's "
            f"shape {list(x.shape)}"
        )
    if _grad_mode.enabled and _autograd.inplace_recorded(t, what, r):
        return _autograd.apply_inplace(_tensor._Copy, what, t, r)
    _tensor._copy_into(x, y)
    bump_version(t)
    return t


# What a class body holds besides what it defines (differs between Python versions).
_CLASS_BOOKKEEPING = frozenset(vars(type("_", (), {}))) | {"__annotations__"}


def methods_of(cls: type) -> Any:
    """Class decorator factory: ``@methods_of(C)`` adds what the decorated class defines to ``C``.

    An op module writes its methods in a class body, as they would read inside ``C`` (names
    like ``sum`` or ``float`` do not shadow the builtins there), and this copies them over. The
    decorated class itself is only a namespace.
    """

    def add(namespace: type) -> type:
        for name, value in vars(namespace).items():
            if name in _CLASS_BOOKKEEPING or (name == "__hash__" and value is None):
                continue  # (a body defining __eq__ gets __hash__ = None; C keeps its own)
            if getattr(value, "__name__", None) == name and hasattr(value, "__qualname__"):
                value.__qualname__ = f"{cls.__name__}.{name}"  # tracebacks and help()
            setattr(cls, name, value)
        return namespace

    return add


#: ``@tensor_methods``: what the decorated class body defines becomes a :class:`Tensor` method.
tensor_methods = methods_of(Tensor)


def serve(names: dict) -> None:
    """Make ``names`` (name -> object) attributes of ``mpitensor.tensor``, for ``from
    mpitensor.tensor import zeros`` and the like (called by the modules that define them)."""
    _tensor._serve(names)
