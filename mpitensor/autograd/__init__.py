"""Reverse-mode automatic differentiation: graph nodes, the backward engine and grad mode.

Every differentiable operation of mpitensor is an :class:`ArrayFunction` subclass with a
``forward`` and a ``backward`` side by side. Both work on raw arrays (``numpy.ndarray`` or ``cupy.ndarray``), never on
Tensors, so the engine adds one small object per recorded operation and nothing else. Array
modules are taken from the inputs (``backend.array_module``); no op imports NumPy or CuPy to
compute. A program's own operations subclass :class:`Function`, torch's
``torch.autograd.Function``, whose forward and backward see Tensors.

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

=============  ===============================================================================
``grad_mode``  whether ops are recorded: ``no_grad``, ``enable_grad``, ``set_grad_enabled``, ...
``function``   :class:`ArrayFunction` (an op's forward and backward), :class:`Node` (a recorded op),
               and torch's :class:`Function` for user code, its ``ctx``, ``once_differentiable``
``_versions``  version counters and the links between views and their base
``_inplace``   recording in-place ops (:func:`apply_inplace`) and rewiring views' graphs
``_engine``    :func:`backward`: running the graph, accumulating ``.grad``, hooks
``grad_api``   :func:`grad` (gradients returned, not accumulated) and ``Variable``
``anomaly``    ``detect_anomaly``: a NaN gradient fails backward, naming the node
``gradcheck``  :func:`gradcheck`: analytic gradients against finite differences
``functional`` ``jacobian``, ``vjp``, ``jvp`` of a function of tensors
=============  ===============================================================================

Example:
    >>> import mpitensor as mt
    >>> x = mt.tensor([1.0, 2.0], requires_grad=True)
    >>> (x * x).sum().backward()
    >>> x.grad
    tensor([2., 4.])
"""

# ruff: noqa: F401 - this package re-exports the names of its modules
from __future__ import annotations

from typing import Callable

from . import _engine, _inplace, _versions, anomaly, function, functional, grad_api

# Re-exported: the names the rest of the package (and op authors, through _core.opkit) use.
from ._engine import (
    _sum_to,
    _xp,
    backward,
    queue_callback,
    register_hook,
    register_post_accumulate_grad_hook,
    tensor_backward,
)
from ._inplace import apply_inplace, inplace_recorded, leaf_in_place_error, write_into
from ._versions import bump_version, link_view, storage, version_cell
from .anomaly import (
    detect_anomaly,
    is_anomaly_check_nan_enabled,
    is_anomaly_enabled,
    set_detect_anomaly,
)
from .function import _NO_RECORD, ArrayFunction, Function, FunctionCtx, Node, once_differentiable
from .grad_api import Variable, grad
from .grad_mode import (
    _mode,
    enable_grad,
    grad_enabled_for,
    inference_mode,
    is_grad_enabled,
    no_grad,
    set_grad_enabled,
)
from .gradcheck import GradcheckError, gradcheck, gradgradcheck

__all__ = [
    "ArrayFunction",
    "Function",
    "FunctionCtx",
    "once_differentiable",
    "backward",
    "grad_enabled_for",
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "is_grad_enabled",
    "inference_mode",
    "queue_callback",
    "apply_inplace",
    "grad",
    "Variable",
    "detect_anomaly",
    "set_detect_anomaly",
    "is_anomaly_enabled",
    "is_anomaly_check_nan_enabled",
    "gradcheck",
    "gradgradcheck",
    "GradcheckError",
    "functional",
]


def _bind_tensor(tensor_cls: type, new: Callable) -> None:
    """Give the graph and the engine the Tensor class and its fast wrapper (called by
    ``mpitensor.tensor``, which imports this package and so cannot be imported by it)."""
    for module in (function, _versions, _inplace, _engine):
        module._Tensor, module._new = tensor_cls, new
