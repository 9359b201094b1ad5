"""The graph's pieces: :class:`Function` (an op's forward and backward on arrays) and
:class:`Node` (one recorded op, the ``grad_fn`` of its output and the ``ctx`` of its forward).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Optional

from ._versions import check_versions, note_versions
from .grad_mode import _mode

_object_new = object.__new__
_seq = itertools.count()  # creation order of nodes: backward runs newest first

# The Tensor class and its fast wrapper, set by mpitensor.autograd._bind_tensor once
# mpitensor.tensor has made them (tensor imports autograd, so autograd cannot import it).
_Tensor: Any = None
_new: Any = None


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
