"""Functions of several tensors: ``cat``/``concat`` and ``stack`` (joining), ``where``
(choosing element by element), ``allclose`` and ``equal`` (comparing whole tensors), with the
gradients of the first three.

Inputs are promoted to one dtype as torch promotes them (``mpitensor._core.promotion``) and must
share a device; for ``where`` a CPU zero-dim input next to GPU tensors acts as a number.

Example:
    >>> import mpitensor as mt
    >>> mt.cat([mt.tensor([1, 2]), mt.tensor([3])])
    tensor([1, 2, 3])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor._core.devices import device_str, is_cupy, same_device, xp
from mpitensor._core.dims import wrap_dim
from mpitensor._core.opkit import NO_RECORD, serve, tensor_methods, wrap
from mpitensor._core.promotion import is_scalar, promote, result_type
from mpitensor._ops.operators import NOT_OPERAND, fit_grad, operand
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

__all__ = ["cat", "concat", "stack", "where", "allclose", "equal"]

_ndarray = np.ndarray
_grad_mode = _autograd._mode


def _check_sequence(tensors: Any, fname: str) -> None:
    """Refuse anything but a non-empty list or tuple (``cat(t)`` of one tensor, say)."""
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{fname}() takes a list or tuple of tensors, got {type(tensors).__name__}")
    if not tensors:
        raise ValueError(f"{fname}() expected a non-empty list of Tensors")


def _promoted(arrays: tuple, fname: str) -> list:
    """The arrays of a ``cat``/``stack``, checked to share a device and cast to one dtype.

    Raises:
        TypeError: an element is not a tensor (or an array).
        RuntimeError: elements on different devices.
    """
    for i, a in enumerate(arrays):
        if not (isinstance(a, _ndarray) or _backend.is_cupy_array(a)):
            raise TypeError(f"{fname}(): element {i} is a {type(a).__name__}, not a Tensor")
    if len({(is_cupy(a), _backend.is_meta_array(a)) for a in arrays}) > 1:
        raise RuntimeError(
            f"{fname}(): expected all tensors to be on the same device; move them with "
            f".to(device) first"
        )
    rt = arrays[0].dtype
    for a in arrays[1:]:
        rt = promote(rt, a.dtype)
    return [a.astype(rt, copy=False) for a in arrays]


def _joined(fn: Any, dim: int, tensors: Sequence[Any]) -> Tensor:
    """``fn`` (``Cat`` or ``Stack``) on ``tensors``, recorded when one of them requires grad."""
    if _grad_mode.enabled and any(getattr(t, "_requires_grad", False) for t in tensors):
        return fn.apply(dim, *tensors)
    arrays = [t._data if isinstance(t, Tensor) else t for t in tensors]
    return wrap(fn.forward(NO_RECORD, dim, *arrays))


def _split_grad(g: Any, ctx: Any, piece: Any) -> tuple:
    """The gradient of a join handed back to its inputs: ``piece(i)`` indexes input i's part."""
    need = ctx.needs_input_grad
    grads: list = [None]  # for dim
    for i, dt in enumerate(ctx.dtypes):
        if need[i + 1]:
            gi = g[piece(i)]
            grads.append(gi.astype(dt) if gi.dtype != dt else gi)
        else:
            grads.append(None)
    return tuple(grads)


class Cat(Function):
    """``cat(tensors, dim)``: each input gets its slice of the gradient along ``dim``.

    Raises:
        ValueError: zero-dim inputs, or shapes that differ outside ``dim``.
    """

    @staticmethod
    def forward(ctx: Any, dim: int, *xs: Any) -> Any:
        arrays = _promoted(xs, "cat")
        nd = arrays[0].ndim
        if nd == 0:
            raise ValueError("cat(): zero-dimensional tensors cannot be concatenated; use stack()")
        d = wrap_dim(dim, nd)
        try:
            out = xp(arrays[0]).concatenate(arrays, axis=d)
        except ValueError as exc:
            shapes = [list(a.shape) for a in arrays]
            raise ValueError(
                f"cat(): shapes {shapes} do not match outside dim {d}: {exc}"
            ) from None
        if ctx.needs_input_grad:  # recording: keep each input's share (lists cost on every call)
            ctx.dim, ctx.sizes, ctx.dtypes = d, [x.shape[d] for x in xs], [x.dtype for x in xs]
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        pre = (slice(None),) * ctx.dim
        starts = [0]
        for s in ctx.sizes:
            starts.append(starts[-1] + s)
        return _split_grad(g, ctx, lambda i: (*pre, slice(starts[i], starts[i + 1])))


class Stack(Function):
    """``stack(tensors, dim)``: each input gets its index of the new dimension.

    Raises:
        ValueError: the inputs' shapes differ.
    """

    @staticmethod
    def forward(ctx: Any, dim: int, *xs: Any) -> Any:
        arrays = _promoted(xs, "stack")
        if len({a.shape for a in arrays}) > 1:
            raise ValueError(
                f"stack expects each tensor to be equal size, got "
                f"{[list(a.shape) for a in arrays]}"
            )
        d = wrap_dim(dim, arrays[0].ndim + 1)
        if ctx.needs_input_grad:  # recording (see Cat)
            ctx.dim, ctx.dtypes = d, [x.dtype for x in xs]
        return xp(arrays[0]).stack(arrays, axis=d)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        pre = (slice(None),) * ctx.dim
        return _split_grad(g, ctx, lambda i: (*pre, i))


def _one_device(c: Any, x: Any, y: Any) -> tuple:
    """``where``'s operands on one device: a CPU zero-dim one next to a GPU (or meta) array
    becomes a number. Returns ``(array module, x, y)``.

    Raises:
        RuntimeError: a CPU array with dimensions next to a GPU (or meta) array.
    """
    def host(a: Any) -> bool:
        return not is_scalar(a) and not is_cupy(a) and not _backend.is_meta_array(a)

    gpu = next((a for a in (c, x, y) if not is_scalar(a) and not host(a)), None)
    if gpu is None:
        return np, x, y
    x = x.item() if host(x) and x.ndim == 0 else x
    y = y.item() if host(y) and y.ndim == 0 else y
    for v in (c, x, y):
        if host(v):
            raise RuntimeError(
                f"where(): expected all tensors to be on the same device, found cpu and "
                f"{device_str(gpu)}; move them with .to(device) first"
            )
    return xp(gpu), x, y


class Where(Function):
    """``where(cond, a, b)``: ``a`` gets the gradient where ``cond`` holds, ``b`` elsewhere
    (a Python number gets none)."""

    @staticmethod
    def forward(ctx: Any, cond: Any, a: Any, b: Any) -> Any:
        rt = result_type(a, b)
        ctx.metas = tuple((v.shape, v.dtype) if hasattr(v, "shape") else None for v in (a, b))
        m, a, b = _one_device(cond, a, b)
        if cond.dtype != np.bool_:
            cond = cond.astype(np.bool_)
        av = a if is_scalar(a) or a.dtype == rt else a.astype(rt)
        bv = b if is_scalar(b) or b.dtype == rt else b.astype(rt)
        out = m.where(cond, av, bv)
        ctx.save_for_backward(cond)
        return out if out.dtype == rt else out.astype(rt)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (cond,) = ctx.saved_tensors
        need = ctx.needs_input_grad
        m = xp(g)
        zero = g.dtype.type(0)
        ma, mb = ctx.metas
        ga = fit_grad(m.where(cond, g, zero), *ma) if need[1] else None
        gb = fit_grad(m.where(cond, zero, g), *mb) if need[2] else None
        return None, ga, gb


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate tensors along an existing dimension, promoting dtypes as torch does.

    Args:
        tensors: a non-empty list or tuple of tensors with equal shapes except along ``dim``.
        dim: the dimension to join along.

    Raises:
        ValueError: empty list or mismatched shapes.
        TypeError: not a list of tensors.

    Example:
        >>> import mpitensor as mt
        >>> mt.cat([mt.tensor([1, 2]), mt.tensor([3])])
        tensor([1, 2, 3])
    """
    _check_sequence(tensors, "cat")
    return _joined(Cat, dim, tensors)


concat = cat


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Stack same-shaped tensors along a new dimension ``dim``.

    Raises:
        ValueError: empty list or shapes differ.

    Example:
        >>> import mpitensor as mt
        >>> mt.stack([mt.tensor([1, 2]), mt.tensor([3, 4])]).shape
        mpitensor.Size([2, 2])
    """
    _check_sequence(tensors, "stack")
    return _joined(Stack, dim, tensors)


def where(condition: Any, input: Any = None, other: Any = None) -> Any:  # noqa: A002
    """Pick ``input`` where ``condition`` is true and ``other`` elsewhere (broadcasting).

    With only ``condition``, return the tuple of index tensors of its true elements.

    Args:
        condition: a bool tensor (or array).
        input, other: tensors or numbers; their dtypes promote as in torch.

    Raises:
        TypeError: only one of ``input``/``other`` is given.

    Example:
        >>> import mpitensor as mt
        >>> mt.where(mt.tensor([True, False]), mt.tensor([1., 2.]), 0.)
        tensor([1., 0.])
    """
    c = condition._data if isinstance(condition, Tensor) else condition
    if not (isinstance(c, _ndarray) or _backend.is_cupy_array(c)):
        c = np.asarray(c)
    if input is None and other is None:
        return wrap(c).nonzero(as_tuple=True)
    if input is None or other is None:
        raise TypeError("where() takes either only condition, or condition, input and other")
    x, y = operand(input), operand(other)
    if x is NOT_OPERAND or y is NOT_OPERAND:
        raise TypeError(f"where(): input and other must be tensors or numbers, got "
                        f"{type(input).__name__} and {type(other).__name__}")
    if _grad_mode.enabled and (
        getattr(input, "_requires_grad", False) or getattr(other, "_requires_grad", False)
    ):
        a = input if isinstance(input, Tensor) else x
        b = other if isinstance(other, Tensor) else y
        return Where.apply(c, a, b)
    return wrap(Where.forward(NO_RECORD, c, x, y))


def allclose(
    input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08,  # noqa: A002
    equal_nan: bool = False,
) -> bool:
    """True when ``|input - other| <= atol + rtol * |other|`` for every element (broadcasting).

    Example:
        >>> import mpitensor as mt
        >>> mt.allclose(mt.tensor([1.0]), mt.tensor([1.0 + 1e-9]))
        True
    """
    x = input._data if isinstance(input, Tensor) else input
    y = operand(other)
    if y is NOT_OPERAND:
        y = np.asarray(other)
    if not isinstance(x, _ndarray) and not _backend.is_cupy_array(x):
        x = np.asarray(x)
    x, y = same_device(x, y)
    m = xp(x) if not is_scalar(x) else xp(y)
    return bool(m.allclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan))


def equal(input: Any, other: Any) -> bool:  # noqa: A002
    """True when both have the same shape and the same elements.

    Example:
        >>> import mpitensor as mt
        >>> mt.equal(mt.tensor([1, 2]), mt.tensor([1, 2]))
        True
    """
    x = input._data if isinstance(input, Tensor) else input
    y = other._data if isinstance(other, Tensor) else other
    if not (isinstance(x, _ndarray) or _backend.is_cupy_array(x)):
        x = np.asarray(x)
    if not (isinstance(y, _ndarray) or _backend.is_cupy_array(y)):
        y = np.asarray(y)
    if x.shape != y.shape:
        return False
    x, y = same_device(x, y)
    return bool((x == y).all())


@tensor_methods
class _CombiningMethods:
    def allclose(
        self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
    ) -> bool:
        """True when ``|self - other| <= atol + rtol * |other|`` everywhere (:func:`allclose`)."""
        return allclose(self, other, rtol=rtol, atol=atol, equal_nan=equal_nan)

    def equal(self, other: Any) -> bool:
        """True when ``other`` has the same shape and the same values (see :func:`equal`)."""
        return equal(self, other)

    def where(self, condition: Any, other: Any) -> Tensor:
        """Return ``self`` where ``condition`` holds and ``other`` elsewhere."""
        return where(condition, self, other)


serve({name: globals()[name] for name in __all__})
