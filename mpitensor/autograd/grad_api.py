"""``torch.autograd.grad``: the gradients of outputs w.r.t. chosen tensors, returned, not
accumulated; and the deprecated ``Variable`` wrapper.

The engine runs the same pass as ``backward`` with a :class:`_Capture`: a plan, made before the
pass, of the nodes that lie above a requested tensor (only those run) and where each requested
tensor's gradient appears. A leaf's gradient is the one that would be accumulated into its
``.grad`` (after its ``register_hook`` hooks, which run as in torch; its post-accumulate hooks
do not, and ``.grad`` is left alone). A non-leaf's gradient is the one that flows into its
``grad_fn``; the node's own backward runs only when another requested tensor lies below it.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

from . import _engine
from .function import Node

__all__ = ["grad", "Variable"]


class _Capture:
    """Which tensors' gradients a pass keeps, the nodes it must run, and what it kept."""

    def __init__(self, keys: dict, roots: list) -> None:
        self.keys = keys  # grad_fn (non-leaf) or the tensor itself (leaf) -> the tensor
        self.grads: dict = {}
        self.reach, self.run, self.used = _plan(roots, keys)

    def store(self, n: Any, g: Any) -> None:
        t = self.keys.get(n)
        if t is None or g is None:
            return
        if type(n) is not Node:
            hooks = getattr(n, "_hooks", None)
            if hooks is not None and hooks[0]:
                g = _engine._leaf_prehooks(hooks[0], g)
        self.grads[n] = g


def _plan(roots: list, keys: dict) -> tuple:
    """(nodes and leaves on a path from the roots to a requested tensor, nodes that must run,
    requested tensors the roots reach)."""
    seen: dict = {}
    used = {t for t, _ in roots if t.grad_fn is None and t in keys}
    stack = [t.grad_fn for t, _ in roots if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen[node] = True
        for n in node._next:
            if type(n) is Node:
                if n not in seen:
                    stack.append(n)
            elif n is not None and n in keys:
                used.add(n)
    reach = set(used)
    run = set()
    for node in sorted(seen, key=lambda n: n.seq):  # inputs before the nodes that use them
        if any(n in reach for n in node._next if n is not None):
            run.add(node)
            reach.add(node)
        elif node in keys:
            reach.add(node)
    used.update(n for n in seen if n in keys)
    return reach, run, used


def _as_list(inputs: Any) -> tuple:
    """(list of tensors, keys when ``inputs`` was a dict)."""
    Tensor = _engine._Tensor  # noqa: N806 - the class
    if isinstance(inputs, dict):
        return list(inputs.values()), list(inputs)
    if isinstance(inputs, Tensor):
        return [inputs], None
    return list(inputs), None


def grad(
    outputs: Any,
    inputs: Any,
    grad_outputs: Any = None,
    retain_graph: Optional[bool] = None,
    create_graph: bool = False,
    only_inputs: bool = True,
    allow_unused: Optional[bool] = None,
    is_grads_batched: bool = False,
    materialize_grads: bool = False,
) -> Any:
    """Return the gradients of ``outputs`` w.r.t. ``inputs``, leaving every ``.grad`` as it is.

    Args:
        outputs: a tensor or a sequence of tensors to differentiate.
        inputs: a tensor, a sequence of tensors or a dict of them (leaves or non-leaves).
        grad_outputs: the gradient of each output (None for a one-element output means 1).
        retain_graph: keep the graph for another pass (default: ``create_graph``).
        create_graph: not supported (no higher-order gradients); must be False.
        only_inputs: deprecated and ignored, as in torch.
        allow_unused: return None for an input the outputs do not depend on, instead of
            raising (default: ``materialize_grads``).
        is_grads_batched: the first dimension of each ``grad_outputs`` entry is a batch of
            gradients; the pass runs once per entry and the results are stacked.
        materialize_grads: return zeros instead of None for unused inputs.

    Returns:
        A tuple with one gradient per input (a dict with the same keys when ``inputs`` was one).

    Raises:
        NotImplementedError: ``create_graph=True``.
        RuntimeError: an input or output that does not require grad, an unused input without
            ``allow_unused``, or a second pass through a released graph.

    Example:
        >>> import mpitensor as mt
        >>> x = mt.tensor([1.0, 2.0], requires_grad=True)
        >>> grad((x * x).sum(), x)
        (tensor([2., 4.]),)
        >>> x.grad is None
        True
    """
    if create_graph:
        raise NotImplementedError(_engine.CREATE_GRAPH_REFUSED.format("grad"))
    if not only_inputs:
        warnings.warn("only_inputs is deprecated and ignored (torch ignores it as well)",
                      stacklevel=2)
    if materialize_grads and allow_unused is False:
        raise ValueError("materialize_grads=True returns zeros for unused inputs, so it cannot "
                         "be combined with allow_unused=False; leave allow_unused unset")
    allow_unused = materialize_grads if allow_unused is None else allow_unused
    tensors, names = _as_list(inputs)
    for i, t in enumerate(tensors):
        if not t._requires_grad:
            raise RuntimeError(f"input {i} of grad() does not require grad: only tensors "
                               f"with requires_grad=True (or computed from one) have gradients")
    if is_grads_batched:
        out = _batched(outputs, tensors, grad_outputs, retain_graph, allow_unused,
                       materialize_grads)
    else:
        out = _grad(outputs, tensors, grad_outputs, bool(retain_graph), allow_unused,
                    materialize_grads)
    return dict(zip(names, out)) if names is not None else out


def _grad(outputs: Any, tensors: list, grad_outputs: Any, retain: bool, allow_unused: bool,
          materialize: bool) -> tuple:
    roots = _engine.make_roots(outputs, grad_outputs)
    keys = {(t.grad_fn if t.grad_fn is not None else t): t for t in tensors}
    capture = _Capture(keys, roots)
    _engine._run(roots, retain, None, capture)
    result = []
    for i, t in enumerate(tensors):
        key = t.grad_fn if t.grad_fn is not None else t
        g = capture.grads.get(key)
        if g is None:
            if not allow_unused and key not in capture.used:
                raise RuntimeError(
                    f"input {i} of grad() is not part of the graph of the outputs (they do not "
                    f"depend on it); pass allow_unused=True to get None for it, or "
                    f"materialize_grads=True to get zeros"
                )
            if materialize or key in capture.used:
                result.append(_engine._new(_engine._xp(t._data).zeros_like(t._data)))
            else:
                result.append(None)
            continue
        g = _engine._leaf_grad(t, g)
        result.append(_engine._new(g.copy()))  # own the memory: g may be a saved array
    return tuple(result)


def _batched(outputs: Any, tensors: list, grad_outputs: Any, retain_graph: Optional[bool],
             allow_unused: bool, materialize: bool) -> tuple:
    """One pass per row of the batched ``grad_outputs``, stacked (a loop, as torch's fallback)."""
    Tensor = _engine._Tensor  # noqa: N806 - the class
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    gos = [grad_outputs] if isinstance(grad_outputs, Tensor) else list(grad_outputs or ())
    if len(gos) != len(outs) or any(g is None for g in gos):
        raise RuntimeError("is_grads_batched=True needs one batched gradient per output, each "
                           "with the batch as its first dimension")
    sizes = {int(g.shape[0]) for g in gos}
    if len(sizes) != 1:
        raise RuntimeError(f"is_grads_batched=True: the grad_outputs have different batch "
                           f"sizes {sorted(sizes)}; give them all the same first dimension")
    (size,) = sizes
    rows = []
    for b in range(size):
        last = b == size - 1
        rows.append(_grad(outs, tensors, [g[b] for g in gos],
                          bool(retain_graph) or not last, allow_unused, materialize))
    result = []
    for i in range(len(tensors)):
        col = [r[i] for r in rows]
        if any(c is None for c in col):
            result.append(None)
            continue
        arr = _engine._xp(col[0]._data).stack([c._data for c in col])
        result.append(_engine._new(arr))
    return tuple(result)


class _VariableMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _engine._Tensor)


class Variable(metaclass=_VariableMeta):
    """The deprecated ``torch.autograd.Variable``: ``Variable(t, requires_grad=...)`` returns a
    tensor sharing ``t``'s memory (detached from its graph); every tensor is a ``Variable``.

    Example:
        >>> import mpitensor as mt
        >>> v = Variable(mt.ones(2), requires_grad=True)
        >>> v.requires_grad, isinstance(v, Variable)
        (True, True)
    """

    def __new__(cls, data: Any, requires_grad: bool = False, volatile: bool = False) -> Any:
        Tensor = _engine._Tensor  # noqa: N806 - the class
        if not isinstance(data, Tensor):
            raise TypeError(f"Variable data has to be a tensor, but got {type(data).__name__}")
        if volatile:
            warnings.warn("volatile has no effect (it was removed in torch 0.4); use "
                          "torch.no_grad() instead", stacklevel=2)
        out = data.detach()
        out.requires_grad_(requires_grad)
        return out
