"""The graph's pieces: :class:`ArrayFunction` (an op's forward and backward on arrays, the base
of every mpitensor op) and :class:`Node` (one recorded op, the ``grad_fn`` of its output and the
``ctx`` of its forward); then torch's :class:`Function` for user code.

mpitensor's own operations subclass :class:`ArrayFunction`, whose forward and backward see raw
arrays. A program's custom operation is written the way torch documents it instead
(``torch.autograd.Function``), and :class:`Function` gives it that:

- ``forward(ctx, *args)`` receives the arguments as they were passed (Tensors stay Tensors) and
  runs with grad mode off; it returns a Tensor, or a tuple of outputs. The new style, a
  ``forward(*args)`` without ``ctx`` plus ``setup_context(ctx, inputs, output)``, works too.
- ``backward(ctx, *grad_outputs)`` receives one gradient Tensor per output and returns one
  gradient (or None) per forward argument; it runs with grad mode off.
- ``ctx`` (:class:`FunctionCtx`) keeps ``save_for_backward``'s tensors (checked against
  in-place changes and released after backward, as torch's are), ``needs_input_grad``,
  ``mark_dirty``, ``mark_non_differentiable``, ``set_materialize_grads`` and any attribute.

How it joins the graph: one :class:`Node` (the ``grad_fn`` of the output) takes the input
edges. A Function with several differentiable outputs gives each output a small node of its
own that hands its gradient to that one node, so the user's backward runs once, with every
output's gradient (zeros where an output got none, unless ``set_materialize_grads(False)``).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Callable, Dict, List, Optional, Tuple

from mpitensor._core.devices import xp as _xp
from mpitensor.dtypes import kind_of

from . import _versions
from ._versions import check_versions, note_versions
from .grad_mode import _mode, no_grad

_object_new = object.__new__
_seq = itertools.count()  # creation order of nodes: backward runs newest first

# The Tensor class and its fast wrapper, set by mpitensor.autograd._bind_tensor once
# mpitensor.tensor has made them (tensor imports autograd, so autograd cannot import it).
_Tensor: Any = None
_new: Any = None


# --------------------------------------------------------------------------------------------
# Nodes


class ArrayFunction:
    """Base class of mpitensor's own differentiable operations, on arrays (the public,
    Tensor-level ``torch.autograd.Function`` is :class:`Function`, in ``_custom.py``).

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

    ``ArrayFunction.apply(*args)`` runs forward and, when grad mode is on and any tensor argument
    requires grad, records the node as the output's ``grad_fn``.

    Example:
        >>> import mpitensor as mt
        >>> class Square(ArrayFunction):
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
        raw: list = []
        nxt: list = []
        needs: list = []
        record = _edges(args, raw, nxt, needs) and _mode.enabled
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
                note_versions(node, args, t)
        return t


def _edges(args: tuple, raw: list, nxt: list, needs: list) -> bool:
    """One pass over an op's arguments: append to ``raw`` each one's array (a non-tensor as it
    is), to ``nxt`` where its gradient goes (its ``grad_fn``, the leaf itself, or None) and to
    ``needs`` whether it wants one. Returns whether any argument requires grad."""
    Tensor = _Tensor  # noqa: N806 - the class
    record = False
    for a in args:
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
    return record


class Node:
    """One recorded operation: the ``grad_fn`` of the tensor it produced (and its ``ctx``).

    Attributes:
        fn: the :class:`ArrayFunction` subclass.
        next_functions: per forward argument, where its gradient goes: ``(node, 0)`` for an
            input made by another op, ``(leaf_tensor, 0)``-like entries for leaves (as
            ``AccumulateGrad`` in torch) and ``(None, 0)`` where no gradient is needed.
        needs_input_grad: per forward argument, whether a gradient is wanted.
        versions: per saved array that belongs to a tensor, ``(counter, version, producer,
            index into saved)``, checked when backward reads ``saved_tensors``.
    """

    versions: tuple = ()  # most nodes save no tensor's array: no instance attribute then

    def _init(self, fn: type, nxt: list, needs: tuple) -> None:
        # Nodes are made by ArrayFunction.apply with object.__new__ and this method: the hot path
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
            raise RuntimeError(SECOND_BACKWARD.format(self.name()))
        if self.versions:
            check_versions(self)
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


def graph_leaves(nodes: list) -> dict:
    """The leaf tensors the autograd graph under ``nodes`` reaches, by ``id``, each node once."""
    seen: set = set()
    leaves: dict = {}
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        for nxt in n._next:
            if type(nxt) is Node:
                stack.append(nxt)
            elif nxt is not None:
                leaves[id(nxt)] = nxt
    return leaves


class _NoRecord:
    """The ``ctx`` given to forward when nothing is recorded: saving is a no-op."""

    needs_input_grad = ()

    def save_for_backward(self, *arrays: Any) -> None:
        pass

    def __setattr__(self, name: str, value: Any) -> None:
        pass  # forward code writes ctx attributes unconditionally; nothing needs keeping


_NO_RECORD = _NoRecord()

SECOND_BACKWARD = (
    "{}: this part of the graph was already run backward, and the arrays it saved were freed "
    "then (also after reading saved tensors once a backward is done); pass retain_graph=True to "
    "the first backward() to run backward through the same graph again"
)

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


# --------------------------------------------------------------------------------------------
# torch's Function, for user code

class FunctionCtx:
    """The ``ctx`` of a custom :class:`Function`: what forward leaves for backward."""

    _node: Optional[Node] = None
    _saved: tuple = ()
    _versions: tuple = ()
    materialize_grads = True
    needs_input_grad: Tuple[bool, ...] = ()

    def save_for_backward(self, *tensors: Any) -> None:
        """Keep ``tensors`` (Tensors or None) for backward, as ``ctx.saved_tensors``.

        Raises:
            TypeError: an argument that is neither a Tensor nor None (keep other values as
                attributes of ``ctx``).
        """
        Tensor = _Tensor  # noqa: N806 - the class
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward() keeps tensors (or None); argument {i} is "
                                f"a {type(t).__name__}: store it as an attribute of ctx instead")
        self._saved = tensors
        self._versions = tuple(None if t is None else _versions.version_cell(t)[0]
                               for t in tensors)

    @property
    def saved_tensors(self) -> tuple:
        """The tensors given to :meth:`save_for_backward`, each unchanged since.

        Raises:
            RuntimeError: after backward freed them (without ``retain_graph=True``), or when
                one was modified in place after it was saved.
        """
        node = self._node
        if node is not None and node.released:
            raise RuntimeError(SECOND_BACKWARD.format(node.name()))
        saved = node.saved if node is not None else self._saved
        for i, (t, v) in enumerate(zip(saved, self._versions)):
            if t is not None and _versions.version_cell(t)[0] != v:
                raise RuntimeError(
                    f"{type(self).__name__ if node is None else node.name()}: saved tensor {i} "
                    f"(shape {list(t.shape)}, {t.dtype}) was modified in place after "
                    f"save_for_backward (version {_versions.version_cell(t)[0]}, saved at "
                    f"{v}); change a clone() of it instead, or compute it out of place")
        return saved

    saved_variables = saved_tensors  # torch's old name

    def mark_dirty(self, *tensors: Any) -> None:
        """Declare the inputs forward modified in place (and returns as outputs)."""
        self._dirty = tuple(tensors)

    def mark_non_differentiable(self, *tensors: Any) -> None:
        """Declare outputs that get no gradient (their gradient in backward is zeros)."""
        self._non_diff = tuple(tensors)

    def set_materialize_grads(self, value: bool) -> None:
        """With False, backward gets None (not zeros) for outputs that received no gradient."""
        self.materialize_grads = bool(value)


class _Grads:
    """The gradients of a multi-output Function's outputs on their way to its node: the
    engine sums what reaches a node, and summing two of these merges them."""

    shape = ()  # the engine compares shapes before it sums

    __slots__ = ("parts",)

    def __init__(self, parts: Dict[int, Any]) -> None:
        self.parts = parts

    def __add__(self, other: "_Grads") -> "_Grads":
        parts = dict(self.parts)
        for i, g in other.parts.items():
            parts[i] = g if i not in parts else parts[i] + g
        return _Grads(parts)


class _OutputGrad(ArrayFunction):
    """The node of one output of a multi-output Function: passes its gradient on, labelled."""

    @staticmethod
    def backward(node: Node, g: Any) -> tuple:
        return (_Grads({node.index: g}),)


def _run_backward(cls: type, node: Node, g: Any) -> tuple:
    """The engine's call into a custom Function's backward: gradients in as Tensors, one
    gradient array per forward argument out (summed to its shape, in its dtype)."""
    ctx = node.ctx
    parts = g.parts if type(g) is _Grads else {ctx._single: g}
    grads = []
    for i, meta in enumerate(ctx._out_meta):
        a = parts.get(i)
        if a is None and meta is not None and ctx.materialize_grads:
            a = meta[2].zeros(meta[0], meta[1])
        grads.append(None if a is None else _new(a))
    with no_grad():
        res = cls.backward(ctx, *grads)
    if not isinstance(res, tuple):
        res = (res,)
    n = len(node._next)
    if len(res) < n or any(r is not None for r in res[n:]):
        raise RuntimeError(f"{node.name()}: backward returned {len(res)} gradients, but forward "
                           f"took {n} arguments; return one per argument (None where none)")
    return tuple(_input_grad(node, i, r) for i, r in enumerate(res[:n]))


def _input_grad(node: Node, i: int, r: Any) -> Any:
    if r is None or node._next[i] is None:
        return None
    if not isinstance(r, _Tensor):
        raise TypeError(f"{node.name()}: backward returned a {type(r).__name__} as the "
                        f"gradient of argument {i}; return a Tensor or None")
    a, (shape, dtype) = r._data, node.ctx._in_meta[i]
    if a.shape != shape:
        if not _expandable(shape, a.shape):
            raise RuntimeError(f"{node.name()}: backward returned a gradient of shape "
                               f"{list(a.shape)} for argument {i}, of shape {list(shape)}")
        a = _sum_to(a, shape)
    return a if a.dtype == dtype else a.astype(dtype)


def _expandable(shape: tuple, to: tuple) -> bool:
    """Whether an array of ``shape`` broadcasts to ``to``."""
    if len(shape) > len(to):
        return False
    return all(s in (1, t) for s, t in zip(shape[::-1], to[::-1]))


class Function:
    """torch's ``torch.autograd.Function``: subclass it with static ``forward`` and
    ``backward`` methods written with Tensors, and call ``MyFunction.apply(*args)``.

    Example:
        >>> import mpitensor as torch
        >>> class Clamp(torch.autograd.Function):
        ...     @staticmethod
        ...     def forward(ctx, x):
        ...         ctx.save_for_backward(x)
        ...         return x.clamp(min=0)
        ...     @staticmethod
        ...     def backward(ctx, g):
        ...         (x,) = ctx.saved_tensors
        ...         return g * (x > 0)
        >>> x = torch.tensor([-1.0, 2.0], requires_grad=True)
        >>> Clamp.apply(x).sum().backward()
        >>> x.grad
        tensor([0., 1.])
    """

    _backward_fn: Any = None  # the node class of this Function, made on first use

    @staticmethod
    def forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        """The operation (override)."""
        raise NotImplementedError("a custom autograd.Function must define a static forward()")

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        """New style: fill ``ctx`` from the inputs and the output of a ``forward`` that takes
        no ``ctx`` (override both, or neither)."""
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        """The gradient of each forward argument from those of the outputs (override)."""
        raise NotImplementedError("a custom autograd.Function must define a static backward() "
                                  "to be differentiated")

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """Run forward on ``args`` and, where a Tensor argument requires grad and grad mode is
        on, record the call so that backward reaches the arguments through ``backward``."""
        Tensor = _Tensor  # noqa: N806 - the class
        ctx = FunctionCtx()
        needs = tuple(isinstance(a, Tensor) and a._requires_grad for a in args)
        record = _mode.enabled and any(needs)
        ctx.needs_input_grad = needs  # as torch: the inputs' requires_grad, even under no_grad
        with no_grad():
            if cls.setup_context is not Function.setup_context:
                out = cls.forward(*args, **kwargs)
                cls.setup_context(ctx, args, out)
            else:
                out = cls.forward(ctx, *args, **kwargs)
        if not record:
            return out
        return _record(cls, ctx, args, needs, out)

    @classmethod
    def _node_fn(cls) -> type:
        fn = cls.__dict__.get("_backward_fn")
        if fn is None:
            def backward(node: Node, g: Any) -> tuple:
                return _run_backward(cls, node, g)
            fn = type(f"{cls.__name__}Backward", (ArrayFunction,),
                      {"backward": staticmethod(backward), "__module__": cls.__module__})
            cls._backward_fn = fn
        return fn


def _record(cls: type, ctx: FunctionCtx, args: tuple, needs: tuple, out: Any) -> Any:
    """Make the node of a custom Function's call and hang its outputs on it."""
    Tensor = _Tensor  # noqa: N806 - the class
    single = isinstance(out, Tensor)
    outs: List[Any] = [out] if single else list(out) if isinstance(out, (tuple, list)) else None
    if outs is None:
        raise TypeError(f"{cls.__name__}.forward returned a {type(out).__name__}; return a "
                        "Tensor or a tuple of outputs")
    node = _object_new(Node)
    node._init(cls._node_fn(), [(a if a.grad_fn is None else a.grad_fn) if n else None
                                for a, n in zip(args, needs)], needs)
    node.ctx, ctx._node = ctx, node
    ctx._in_meta = [(a._data.shape, a._data.dtype) if n else None for a, n in zip(args, needs)]
    # the node holds them from now on: the engine lets them go after backward
    node.saved, ctx._saved = ctx._saved, ()
    dirty = {id(t) for t in getattr(ctx, "_dirty", ())}
    non_diff = {id(t) for t in getattr(ctx, "_non_diff", ())}
    inputs = {id(a) for a in args if isinstance(a, Tensor)}
    diff = [i for i, o in enumerate(outs) if isinstance(o, Tensor) and id(o) not in non_diff
            and kind_of(o._data.dtype) in "fc"]
    ctx._out_meta = [(o._data.shape, o._data.dtype, _xp(o._data)) if isinstance(o, Tensor)
                     else None for o in outs]
    for i, o in enumerate(outs):
        if not isinstance(o, Tensor):
            continue
        if id(o) in dirty:
            _check_dirty(cls, o)
        elif id(o) in inputs:
            o = outs[i] = _alias(o)  # an input returned as it is: a new tensor over its data
        if i not in diff:
            continue
        o._requires_grad = True
        if len(diff) == 1:
            o.grad_fn, ctx._single = node, i
            node.out_meta = (o._data.shape, o._data.dtype)
        else:
            part = _object_new(Node)
            part._init(_OutputGrad, [node], (True,))
            part.index, part.out_meta = i, (o._data.shape, o._data.dtype)
            o.grad_fn = part
    if len(diff) != 1:
        node.out_meta = ((), None)
    if single:
        return outs[0]
    if hasattr(out, "_fields"):  # a named tuple
        return type(out)(*outs)
    return tuple(outs) if isinstance(out, tuple) else outs


def _check_dirty(cls: type, t: Any) -> None:
    if t.grad_fn is None and t._requires_grad:
        raise RuntimeError(f"{cls.__name__}.forward modified in place (mark_dirty) a leaf tensor "
                           "that requires grad; pass a clone() of it")
    if getattr(t, "_view", None) is not None:
        raise NotImplementedError(f"{cls.__name__}.forward modified in place (mark_dirty) a "
                                  "view of another tensor; mpitensor does not rewire the "
                                  "base's graph for custom Functions: pass a clone() instead")


def _alias(t: Any) -> Any:
    a = _new(t._data)
    a._vc = _versions.version_cell(t)  # the same storage: the same version counter
    return a


def once_differentiable(fn: Callable) -> Callable:
    """Mark a custom Function's ``backward`` as not differentiable itself (mpitensor runs every
    backward with grad mode off, so this only documents it, as in torch)."""
    @functools.wraps(fn)
    def wrapper(ctx: Any, *args: Any) -> Any:
        with no_grad():
            return fn(ctx, *args)
    return wrapper
