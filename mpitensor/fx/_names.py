"""Names of call targets: the public dotted name of a function, and which functions were
registered with ``fx.wrap``."""

from __future__ import annotations

import builtins
import inspect
import operator
from typing import Any, Optional

# id(function) -> function, for every function registered with fx.wrap
WRAPPED: dict = {}


def wrapped(fn: Any) -> bool:
    """Whether ``fn`` was registered with ``fx.wrap``."""
    return id(fn) in WRAPPED


def _public_paths() -> dict:
    """id(object) -> its public dotted name (``torch.relu``), over mpitensor's namespaces."""
    global _PATHS
    if _PATHS is None:
        import mpitensor
        import mpitensor.nn.functional as functional

        paths: dict = {}
        for prefix, ns in (("torch.nn.functional", functional),
                           ("torch.linalg", mpitensor.linalg), ("torch", mpitensor)):
            for name, val in vars(ns).items():
                if name.startswith("_") or inspect.ismodule(val):
                    continue
                # an alias (concatenate for cat) never shadows the function's own name
                if id(val) not in paths or name == getattr(val, "__name__", None):
                    paths[id(val)] = (f"{prefix}.{name}", val)
        _PATHS = paths
    return _PATHS


_PATHS: Optional[dict] = None


def qualified_name(fn: Any) -> str:
    """The dotted name torch.fx would print for a call target."""
    hit = _public_paths().get(id(fn))
    if hit is not None and hit[1] is fn:
        return hit[0]
    if getattr(builtins, getattr(fn, "__name__", ""), None) is fn:
        return f"builtins.{fn.__name__}"
    if getattr(operator, getattr(fn, "__name__", ""), None) is fn:
        return f"operator.{fn.__name__}"
    module = getattr(fn, "__module__", None) or "_unknown"
    return f"{module}.{getattr(fn, '__qualname__', getattr(fn, '__name__', type(fn).__name__))}"


def is_tensor_class(t: Any) -> bool:
    """Whether ``t`` is mpitensor's Tensor class (shown as torch.Tensor)."""
    from mpitensor.tensor import Tensor

    return t is Tensor


def type_str(t: Any) -> str:
    """How ``str(graph)`` shows a node's type: torch.Tensor for mpitensor's tensor class."""
    if t is None or isinstance(t, str):  # a postponed annotation is not shown
        return ""
    if is_tensor_class(t):
        return "torch.Tensor"
    if isinstance(t, type):
        return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return repr(t).replace("mpitensor.tensor.Tensor", "torch.Tensor")
