"""DTensor factories (``zeros``, ``ones``, ``empty``, ``full``, ``rand``, ``randn``): each rank
makes only its piece, except the random ones, which draw the whole tensor from the (seeded)
generator on every rank and keep their piece, so that the values are those one process would
draw with the same seed, however the tensor is split."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

from mpitensor.tensor import Tensor
from mpitensor.tensor import empty as _empty
from mpitensor.tensor import full as _full
from mpitensor.tensor import ones as _ones
from mpitensor.tensor import rand as _rand
from mpitensor.tensor import randn as _randn
from mpitensor.tensor import zeros as _zeros

from ..device_mesh import DeviceMesh
from ._api import DTensor
from ._redistribute import redistribute_array
from ._utils import compute_local_shape_and_global_offset, normalize_placements
from .placement_types import Partial, Placement, Replicate

__all__ = ["zeros", "ones", "empty", "full", "rand", "randn"]


def _shape(size: Tuple[Any, ...], where: str) -> Tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    try:
        shape = tuple(s.__index__() for s in size)
    except AttributeError:
        raise TypeError(f"{where}: size must be ints, got {size!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"{where}: negative size in {shape}")
    return shape


def _layout(size: Tuple[Any, ...], mesh: Optional[DeviceMesh],
            placements: Optional[Sequence[Placement]], where: str,
            partial_ok: bool = False) -> Tuple[Tuple[int, ...], Tuple[Placement, ...]]:
    if mesh is None:
        raise ValueError(f"{where}: pass device_mesh")
    shape = _shape(size, where)
    if placements is None:
        placements = [Replicate()] * mesh.ndim
    placements = normalize_placements(placements, mesh, len(shape), where)
    if not partial_ok and any(isinstance(p, Partial) for p in placements):
        raise ValueError(f"{where}: {placements} holds a Partial; this factory makes only "
                         "Shard and Replicate pieces")
    return shape, placements


def _device(mesh: DeviceMesh) -> str:
    return "cuda" if mesh.device_type == "cuda" else "cpu"


def _filled(make: Callable[..., Tensor], where: str, size: Tuple[Any, ...], dtype: Any,
            requires_grad: bool, mesh: Optional[DeviceMesh],
            placements: Optional[Sequence[Placement]], partial_ok: bool = False) -> DTensor:
    shape, placements = _layout(size, mesh, placements, where, partial_ok)
    local_shape, _ = compute_local_shape_and_global_offset(shape, mesh, placements)
    local = make(local_shape, dtype=dtype, device=_device(mesh))
    local.requires_grad = requires_grad
    return DTensor._make(local, mesh, placements, shape)


def zeros(*size: Any, requires_grad: bool = False, dtype: Any = None, layout: Any = None,
          device_mesh: Optional[DeviceMesh] = None,
          placements: Optional[Sequence[Placement]] = None) -> DTensor:
    """A DTensor of zeros of global shape ``size`` (each rank allocates its piece)."""
    return _filled(_zeros, "zeros", size, dtype, requires_grad, device_mesh, placements, True)


def ones(*size: Any, requires_grad: bool = False, dtype: Any = None, layout: Any = None,
         device_mesh: Optional[DeviceMesh] = None,
         placements: Optional[Sequence[Placement]] = None) -> DTensor:
    """A DTensor of ones of global shape ``size``."""
    return _filled(_ones, "ones", size, dtype, requires_grad, device_mesh, placements)


def empty(*size: Any, requires_grad: bool = False, dtype: Any = None, layout: Any = None,
          device_mesh: Optional[DeviceMesh] = None,
          placements: Optional[Sequence[Placement]] = None) -> DTensor:
    """An uninitialised DTensor of global shape ``size``."""
    return _filled(_empty, "empty", size, dtype, requires_grad, device_mesh, placements)


def full(size: Sequence[int], fill_value: Any, *, requires_grad: bool = False,
         dtype: Any = None, layout: Any = None, device_mesh: Optional[DeviceMesh] = None,
         placements: Optional[Sequence[Placement]] = None) -> DTensor:
    """A DTensor of global shape ``size`` filled with ``fill_value``."""
    def make(shape: Tuple[int, ...], **kw: Any) -> Tensor:
        return _full(shape, fill_value, **kw)

    return _filled(make, "full", (tuple(size),), dtype, requires_grad, device_mesh,
                   placements)


def _random(draw: Callable[..., Tensor], where: str, size: Tuple[Any, ...], dtype: Any,
            requires_grad: bool, mesh: Optional[DeviceMesh],
            placements: Optional[Sequence[Placement]]) -> DTensor:
    shape, placements = _layout(size, mesh, placements, where)
    whole = draw(*shape, dtype=dtype, device=_device(mesh))
    arr = whole._data
    piece = redistribute_array(arr, shape, mesh, [Replicate()] * mesh.ndim, placements)
    local = Tensor(piece.copy() if piece.base is not None else piece)
    local.requires_grad = requires_grad
    return DTensor._make(local, mesh, placements, shape)


def rand(*size: Any, requires_grad: bool = False, dtype: Any = None, layout: Any = None,
         device_mesh: Optional[DeviceMesh] = None,
         placements: Optional[Sequence[Placement]] = None) -> DTensor:
    """A DTensor of uniform [0, 1) values: the tensor ``mpitensor.rand(size)`` would give with
    the same seed, split as ``placements`` (every rank draws it whole: seed them alike)."""
    return _random(_rand, "rand", size, dtype, requires_grad, device_mesh, placements)


def randn(*size: Any, requires_grad: bool = False, dtype: Any = None, layout: Any = None,
          device_mesh: Optional[DeviceMesh] = None,
          placements: Optional[Sequence[Placement]] = None) -> DTensor:
    """A DTensor of standard normal values, drawn as :func:`rand` draws."""
    return _random(_randn, "randn", size, dtype, requires_grad, device_mesh, placements)
