"""``DTensor``: a tensor laid out over a DeviceMesh, one placement per mesh dimension.

A DTensor is a :class:`mpitensor.Tensor` subclass that holds this rank's piece as a plain
Tensor (``_local_tensor``, where autograd records) and the layout (mesh, placements, global
shape). Its metadata (``shape``, ``size()``, ``ndim``) is global; its operations go through
the sharding rules of :mod:`._dispatch`. Code that reads a DTensor's array (``_data``) as if
it were the whole tensor gets a clear error instead of a wrong result (see ``_dispatch``).

Gradients are laid out in the DTensor's own placements (a shard of the gradient for Shard,
the whole gradient for Replicate and Partial), so ``param.grad`` of a DTensor parameter is a
DTensor with the parameter's placements and an optimizer can step on the local pieces.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, List, Optional, Sequence, Tuple

import mpitensor.distributed as dist
from mpitensor import backend as _backend
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.nn.parameter import Parameter
from mpitensor.tensor import Size, Tensor, as_tensor, ones_like

from ..device_mesh import DeviceMesh
from . import _dispatch, _distribute
from ._distribute import agree, distribute_local
from ._redistribute import Redistribute, avg_factor, grad_layout, redistribute_array
from ._utils import local_shape_at, normalize_placements
from .placement_types import Placement, Replicate, Shard

__all__ = ["DTensor", "distribute_tensor", "distribute_module"]

_object_new = object.__new__


class _GradMove(Function):
    """Identity forward; backward moves the gradient between two layouts (``to_local``'s
    ``grad_placements``: the gradient arriving is laid out as those, not as the DTensor)."""

    @staticmethod
    def forward(ctx: Any, x: Any, shape: Tuple[int, ...], mesh: DeviceMesh,
                arriving: Tuple[Placement, ...], wanted: Tuple[Placement, ...]) -> Any:
        ctx.spec = (shape, mesh, arriving, wanted)
        return x

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Tuple[Any, ...]:
        shape, mesh, arriving, wanted = ctx.spec
        return redistribute_array(grad, shape, mesh, arriving, wanted), None, None, None, None


class DTensor(Tensor):
    """A tensor split (``Shard``), copied (``Replicate``) or summed (``Partial``) over the
    ranks of a :class:`DeviceMesh`.

    Make one with :func:`distribute_tensor` (from a whole tensor), :meth:`from_local` (from
    each rank's piece) or the factories (``zeros``, ``randn``, ...); get the pieces back with
    :meth:`to_local` or the whole tensor with :meth:`full_tensor`.

    Example:
        >>> mesh = init_device_mesh("cpu", (2,))
        >>> d = distribute_tensor(mt.arange(6.0).reshape(3, 2), mesh, [Shard(0)])
        >>> d.shape, d.to_local().shape          # on rank 1
        (mpitensor.Size([3, 2]), mpitensor.Size([1, 2]))
    """

    __slots__ = ("_local_tensor", "_spec")
    __hash__ = Tensor.__hash__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("DTensor is not built directly: use distribute_tensor, "
                        "DTensor.from_local or the factory functions (zeros, randn, ...)")

    @classmethod
    def _make(cls, local: Tensor, mesh: DeviceMesh, placements: Tuple[Placement, ...],
              shape: Sequence[int]) -> "DTensor":
        """Wrap ``local`` without checks or communication (the internal constructor)."""
        t = _object_new(cls)
        t._local_tensor = local
        t._spec = (mesh, tuple(placements), Size(shape))
        t._vc = None
        t._view = None
        t._requires_grad = False
        return t

    # ---------------------------------------------------------------- layout
    @property
    def placements(self) -> Tuple[Placement, ...]:
        """One placement per mesh dimension."""
        return self._spec[1]

    @property
    def device_mesh(self) -> DeviceMesh:
        """The mesh the pieces lie on."""
        return self._spec[0]

    @property
    def shape(self) -> Size:
        """The global shape."""
        return self._spec[2]

    def size(self, dim: Optional[int] = None) -> Any:
        """The global shape, or its length along ``dim``."""
        return self._spec[2] if dim is None else self._spec[2][dim]

    def dim(self) -> int:
        return len(self._spec[2])

    ndimension = dim

    @property
    def ndim(self) -> int:
        return len(self._spec[2])

    def numel(self) -> int:
        """The global number of elements."""
        n = 1
        for s in self._spec[2]:
            n *= s
        return n

    nelement = numel

    def stride(self, dim: Optional[int] = None) -> Any:
        """The strides of a contiguous tensor of the global shape."""
        out, step = [], 1
        for s in reversed(self._spec[2]):
            out.append(step)
            step *= max(s, 1)
        out = tuple(reversed(out))
        return out if dim is None else out[dim]

    def __len__(self) -> int:
        if not self._spec[2]:
            raise TypeError("len() of a 0-d DTensor")
        return self._spec[2][0]

    def __repr__(self) -> str:
        return (f"DTensor(local_tensor={self._local_tensor!r}, device_mesh={self.device_mesh!r}"
                f", placements={self.placements})")

    __str__ = __repr__

    # the guard: code that reads the array of a DTensor as a whole tensor's gets an error
    _data = property(_dispatch.read_local_array, _dispatch.write_local_array)

    # ---------------------------------------------------------------- autograd
    def requires_grad_(self, requires_grad: bool = True) -> "DTensor":
        self._local_tensor.requires_grad = requires_grad
        return self


    @property
    def grad(self) -> Optional["DTensor"]:
        """The gradient, a DTensor with this tensor's placements (Partial: Replicate)."""
        g = self._local_tensor.grad
        if g is None:
            return None
        scale = avg_factor(self.placements, self.device_mesh)
        if scale != 1:
            g = g * scale
        return DTensor._make(g, self.device_mesh, grad_layout(self.placements), self.shape)

    @grad.setter
    def grad(self, value: Optional["DTensor"]) -> None:
        if value is None:
            self._local_tensor.grad = None
            return
        want = grad_layout(self.placements)
        if not isinstance(value, DTensor) or value.device_mesh != self.device_mesh or \
                value.placements != want or value.shape != self.shape:
            got = (f"a DTensor {tuple(value.shape)} {value.placements}"
                   if isinstance(value, DTensor) else type(value).__name__)
            raise TypeError(f"DTensor.grad must be a DTensor of shape {tuple(self.shape)} "
                            f"placed {want} on the same mesh, got {got}")
        if avg_factor(self.placements, self.device_mesh) != 1:
            raise TypeError("DTensor.grad cannot be set on a Partial('avg') DTensor")
        self._local_tensor.grad = value._local_tensor

    @property
    def data(self) -> "DTensor":
        """This DTensor outside autograd, sharing its local storage."""
        return DTensor._make(self._local_tensor.data, self.device_mesh, self.placements,
                             self.shape)

    @data.setter
    def data(self, value: "DTensor") -> None:
        if not isinstance(value, DTensor) or value._spec != self._spec:
            raise TypeError(f"DTensor.data must be set to a DTensor of the same layout "
                            f"({tuple(self.shape)}, {self.placements}), got {value!r:.200}")
        self._local_tensor.data = value._local_tensor

    def detach(self) -> "DTensor":
        return DTensor._make(self._local_tensor.detach(), self.device_mesh, self.placements,
                             self.shape)

    def detach_(self) -> "DTensor":
        self._local_tensor.detach_()
        return self

    def backward(self, gradient: Optional["DTensor"] = None, retain_graph: Optional[bool] = None,
                 create_graph: bool = False, inputs: Any = None) -> None:
        """Backpropagate from this DTensor; ``gradient`` (a DTensor) is needed unless it is a
        scalar. The leaves' ``.grad`` get their share, laid out in their placements."""
        mesh, placements = self.device_mesh, self.placements
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(f"DTensor.backward: grad can be implicitly created only for "
                                   f"a scalar, this DTensor has shape {tuple(self.shape)}")
            g = ones_like(self._local_tensor) / avg_factor(placements, mesh)
        else:
            if not isinstance(gradient, DTensor) or gradient.shape != self.shape:
                raise TypeError(f"DTensor.backward: gradient must be a DTensor of shape "
                                f"{tuple(self.shape)}, got {type(gradient).__name__}")
            arr = redistribute_array(gradient._local_tensor._data, self.shape, mesh,
                                     gradient.placements, grad_layout(placements))
            factor = avg_factor(placements, mesh)
            if factor != 1:  # (a 0-d array divided turns into a NumPy scalar: keep an array)
                arr = _backend.array_module(arr).asarray(arr / arr.dtype.type(factor))
            g = Tensor(arr)
        if inputs is not None:
            inputs = [i._local_tensor if isinstance(i, DTensor) else i for i in inputs]
        self._local_tensor.backward(g, retain_graph=retain_graph, create_graph=create_graph,
                                    inputs=inputs)

    def register_hook(self, hook: Callable[["DTensor"], Any]) -> Any:
        """Run ``hook(grad)`` (grad a DTensor) when this tensor's gradient is computed."""
        mesh, placements, shape = self.device_mesh, grad_layout(self.placements), self.shape

        def on_local(g: Tensor) -> Any:
            out = hook(DTensor._make(g, mesh, placements, shape))
            return out._local_tensor if isinstance(out, DTensor) else out

        return self._local_tensor.register_hook(on_local)

    def register_post_accumulate_grad_hook(self, hook: Callable[["DTensor"], Any]) -> Any:
        """Run ``hook(self)`` after this leaf's ``.grad`` has been accumulated."""
        return self._local_tensor.register_post_accumulate_grad_hook(lambda _: hook(self))

    # ---------------------------------------------------------------- conversions
    @staticmethod
    def from_local(local_tensor: Any, device_mesh: Optional[DeviceMesh] = None,
                   placements: Optional[Sequence[Placement]] = None, *,
                   run_check: bool = False, shape: Optional[Sequence[int]] = None,
                   stride: Optional[Sequence[int]] = None) -> "DTensor":
        """Make a DTensor from every rank's piece (differentiable; no data moves unless
        ``run_check``).

        Args:
            local_tensor: this rank's piece.
            device_mesh: the mesh; placements: one per mesh dimension (default Replicate).
            run_check: check, with one small collective per mesh dimension, that the pieces'
                shapes and dtypes fit together (and copy the first rank's values to the
                others along Replicate dimensions).
            shape, stride: the global shape; needed where the pieces are uneven (default:
                every Shard dimension is its piece times the mesh dimension's size).

        Raises:
            ValueError: placements that do not fit, or (under run_check, on every rank)
                pieces that do not fit together.
        """
        return _from_local(local_tensor, device_mesh, placements, run_check, shape)

    def to_local(self, *, grad_placements: Optional[Sequence[Placement]] = None) -> Tensor:
        """This rank's piece (differentiable). ``grad_placements``: how the gradient that will
        flow back into it is laid out, when not as this DTensor (e.g. ``[Partial()]``: each
        rank's term of it, summed on the way back)."""
        if grad_placements is None:
            return self._local_tensor
        mesh = self.device_mesh
        arriving = normalize_placements(grad_placements, mesh, self.ndim, "to_local")
        wanted = grad_layout(self.placements)
        if arriving == wanted:
            return self._local_tensor
        return _GradMove.apply(self._local_tensor, tuple(self.shape), mesh, arriving, wanted)

    def redistribute(self, device_mesh: Optional[DeviceMesh] = None,
                     placements: Optional[Sequence[Placement]] = None, *,
                     async_op: bool = False, forward_dtype: Any = None,
                     backward_dtype: Any = None) -> "DTensor":
        """The same tensor laid out as ``placements`` (differentiable); one collective per
        changed mesh dimension (see ``_redistribute``).

        Raises:
            ValueError: another mesh, or placements that do not fit the mesh or the tensor.
        """
        mesh = self.device_mesh
        if device_mesh is not None and device_mesh != mesh:
            raise ValueError(f"DTensor.redistribute: moving between meshes ({mesh!r} -> "
                             f"{device_mesh!r}) is not supported; use the same mesh")
        if placements is None:
            placements = [Replicate()] * mesh.ndim
        dst = normalize_placements(placements, mesh, self.ndim, "DTensor.redistribute")
        return _redistributed(self, dst)

    def full_tensor(self, *, grad_placements: Optional[Sequence[Placement]] = None) -> Tensor:
        """The whole tensor on every rank (differentiable): all-gathers / all-reduces."""
        full = _redistributed(self, (Replicate(),) * self.device_mesh.ndim)
        return full.to_local(grad_placements=grad_placements)

    # ---------------------------------------------------------------- parameters, copies
    def _make_parameter(self, requires_grad: bool) -> "DTensorParameter":
        """``nn.Parameter(dtensor)``: a DTensor that modules register as a parameter."""
        local = self._local_tensor.detach()
        local.requires_grad = requires_grad
        return DTensorParameter._make(local, self.device_mesh, self.placements, self.shape)

    def __deepcopy__(self, memo: dict) -> "DTensor":
        local = copy.deepcopy(self._local_tensor, memo)
        out = type(self)._make(local, self.device_mesh, self.placements, self.shape)
        memo[id(self)] = out
        return out

    def __reduce_ex__(self, proto: int) -> Any:
        raise TypeError("a DTensor cannot be pickled (its mesh holds MPI communicators): save "
                        "it with mpitensor.distributed.checkpoint, or pickle .full_tensor() "
                        "or .to_local()")


def _from_local_tensor(name: str, settable: bool = False) -> property:
    """A property read from (and written to) the local tensor: the same on every piece."""
    def get(self: DTensor) -> Any:
        return getattr(self._local_tensor, name)

    def put(self: DTensor, value: Any) -> None:
        setattr(self._local_tensor, name, value)

    return property(get, put if settable else None, doc=f"The local tensor's {name}.")


def _local_method(name: str) -> Callable[..., Any]:
    def method(self: DTensor, *args: Any) -> Any:
        return getattr(self._local_tensor, name)(*args)

    method.__name__ = name
    method.__doc__ = f"The local tensor's {name}() (the same on every piece)."
    return method


for _name in ("dtype", "device", "is_cuda", "grad_fn", "is_leaf", "layout"):
    setattr(DTensor, _name, _from_local_tensor(_name))
DTensor.requires_grad = _from_local_tensor("requires_grad", settable=True)
for _name in ("element_size", "is_floating_point", "is_complex", "retain_grad"):
    setattr(DTensor, _name, _local_method(_name))


class DTensorParameter(DTensor, Parameter):
    """What ``nn.Parameter(dtensor)`` returns: a DTensor and a Parameter."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Made by ``DTensor._make_parameter``; ``Parameter.__new__`` has done the work."""

    def __repr__(self) -> str:
        return "Parameter containing:\n" + DTensor.__repr__(self)

    __str__ = __repr__


_dispatch.set_dtensor_class(DTensor, DTensorParameter)


# ---------------------------------------------------------------------- helpers
def _redistributed(t: DTensor, dst: Tuple[Placement, ...]) -> DTensor:
    if dst == t.placements:
        return t
    local = Redistribute.apply(t._local_tensor, tuple(t.shape), t.device_mesh, t.placements,
                               dst)
    return DTensor._make(local, t.device_mesh, dst, t.shape)


def _global_shape(local_shape: Sequence[int], mesh: DeviceMesh,
                  placements: Sequence[Placement]) -> List[int]:
    shape = list(local_shape)
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            shape[p.dim] *= mesh.size(m)
    return shape


def _as_local(t: Any, where: str) -> Tensor:
    if isinstance(t, DTensor):
        raise TypeError(f"{where}: got a DTensor; pass a plain Tensor (its .to_local())")
    if isinstance(t, Tensor):
        return t
    try:
        return as_tensor(t)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where}: expected a Tensor, got {type(t).__name__}") from exc


def _arguments(t: Any, mesh: Optional[DeviceMesh], placements: Any,
               where: str) -> Tuple[Tensor, Tuple[Placement, ...]]:
    """The tensor and the placements of from_local / distribute_tensor, checked."""
    if mesh is None:
        raise ValueError(f"{where}: pass device_mesh (there is no current mesh)")
    t = _as_local(t, where)
    if placements is None:
        placements = [Replicate()] * mesh.ndim
    return t, normalize_placements(placements, mesh, t.ndim, where)


def _from_local(local: Any, mesh: Optional[DeviceMesh], placements: Any, run_check: bool,
                shape: Optional[Sequence[int]]) -> DTensor:
    local, placements = _arguments(local, mesh, placements, "DTensor.from_local")
    where = "DTensor.from_local"
    gshape = list(shape) if shape is not None else _global_shape(local.shape, mesh, placements)
    if len(gshape) != local.ndim:
        raise ValueError(f"{where}: shape {tuple(gshape)} has {len(gshape)} dims but the local "
                         f"tensor has {local.ndim}")
    if run_check:
        _check_pieces(local, mesh, placements, gshape)
    if local.requires_grad:
        local = local.view_as(local)  # the DTensor is a new node of the graph, as in torch
    return DTensor._make(local, mesh, placements, gshape)


def _check_pieces(local: Tensor, mesh: DeviceMesh, placements: Tuple[Placement, ...],
                  gshape: Sequence[int]) -> None:
    """``run_check``: every rank's piece fits the global shape; Replicate copies agree."""
    mine = (tuple(local.shape), str(local.dtype))

    def check(seen: List[Any], m: int) -> Optional[str]:
        coord = mesh.get_coordinate()
        for c, (lshape, dtype) in enumerate(seen):
            at = list(coord)
            at[m] = c
            want = local_shape_at(gshape, mesh, placements, at)
            if dtype != seen[0][1] or tuple(lshape) != want:
                return (f"the piece at mesh coordinate {at} has shape {lshape} and dtype "
                        f"{dtype}, but a tensor of shape {tuple(gshape)} placed {placements} "
                        f"needs {want} there (and dtype {seen[0][1]})")
        return None

    agree(mesh, mine, check, "DTensor.from_local(run_check=True)")
    for m, p in enumerate(placements):
        if isinstance(p, Replicate):
            arr = local._data
            if not arr.flags.c_contiguous:
                raise ValueError("DTensor.from_local(run_check=True): a Replicate piece must "
                                 "be contiguous to be made equal across ranks")
            dist.broadcast(arr, group=mesh.get_group(m), group_src=0)


def distribute_tensor(tensor: Any, device_mesh: Optional[DeviceMesh] = None,
                      placements: Optional[Sequence[Placement]] = None, *,
                      src_data_rank: Optional[int] = 0) -> DTensor:
    """Split or copy a whole tensor over ``device_mesh`` from one rank.

    Every rank passes a tensor of the same shape and dtype; the values of the ranks at mesh
    index ``src_data_rank`` along each dimension are used (scattered for Shard, broadcast
    for Replicate), so the result is the same as if one process had split its tensor.
    ``src_data_rank=None`` makes each rank keep its own values (no communication).

    Raises:
        ValueError: placements that do not fit, or (on every rank) shapes, dtypes or
            placements that differ across ranks.

    Example:
        >>> mesh = init_device_mesh("cpu", (2, 2))
        >>> w = distribute_tensor(mt.randn(8, 4), mesh, [Shard(0), Replicate()])
    """
    tensor, placements = _arguments(tensor, device_mesh, placements, "distribute_tensor")
    local = distribute_local(tensor.detach(), device_mesh, placements, src_data_rank)
    out = DTensor._make(local, device_mesh, placements, tensor.shape)
    if tensor.requires_grad:
        local.requires_grad = True
    return out


def distribute_module(module: Any, device_mesh: Optional[DeviceMesh] = None,
                      partition_fn: Optional[Callable[[str, Any, DeviceMesh], None]] = None,
                      input_fn: Optional[Callable[..., Any]] = None,
                      output_fn: Optional[Callable[..., Any]] = None) -> Any:
    """Turn ``module``'s parameters and buffers into DTensors and hook its inputs/outputs.

    Args:
        partition_fn: ``fn(name, submodule, mesh)``, called for every submodule, to replace
            its parameters with DTensor ones; whatever it leaves plain is replicated.
        input_fn: ``fn(module, inputs, mesh)`` run before forward (may return new inputs).
        output_fn: ``fn(module, outputs, mesh)`` run after forward (may return new outputs).

    Returns:
        ``module``, changed in place.
    """
    return _distribute.distribute_module(module, device_mesh, partition_fn, input_fn,
                                         output_fn, DTensor, distribute_tensor)
