"""``implicit_replication()``: inside it, a plain Tensor beside DTensors is taken as replicated
on their mesh (as torch's), instead of the TypeError raised outside it."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, Tuple

from mpitensor.tensor import Tensor

from .. import _dispatch
from .._api import DTensor
from ..debug._patches import Patches
from ..placement_types import Replicate

__all__ = ["implicit_replication"]


def _first_mesh(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    for a in list(args) + list(kwargs.values()):
        for x in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(x, DTensor):
                return x.device_mesh
    return None


def _replicated(a: Any, mesh: Any) -> Any:
    if isinstance(a, (list, tuple)):
        return type(a)(_replicated(x, mesh) for x in a)
    if isinstance(a, Tensor) and not isinstance(a, DTensor):
        return DTensor.from_local(a, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return a


def _replicating(original: Callable[..., Any]) -> Callable[..., Any]:
    def dispatch(op: str, fn: Callable[..., Any], args: Tuple[Any, ...],
                 kwargs: Dict[str, Any]) -> Any:
        entry = _dispatch._RULES.get(op)
        mesh = _first_mesh(args, kwargs)
        if entry is not None and not entry[1] and mesh is not None:
            args = tuple(_replicated(a, mesh) for a in args)
            kwargs = {k: _replicated(v, mesh) for k, v in kwargs.items()}
        return original(op, fn, args, kwargs)

    return dispatch


_PATCHES = Patches(lambda p: p.swap(_dispatch, "dispatch", _replicating(_dispatch.dispatch)))


@contextlib.contextmanager
def implicit_replication() -> Iterator[None]:
    """Let plain Tensors mix with DTensors as if ``Replicate()`` on the DTensors' mesh (every
    rank must then hold the same values, as torch assumes; nothing checks it).

    Example (``mpiexec -n 2``)::

        with implicit_replication():
            y = dt + mpitensor.ones(4)        # dt: a DTensor of shape (4,) or (n, 4)
    """
    token = object()
    _PATCHES.enter(token)
    try:
        yield
    finally:
        _PATCHES.leave(token)
