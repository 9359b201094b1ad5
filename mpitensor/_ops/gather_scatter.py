"""Reading and writing at index tensors: ``gather``, ``scatter`` (``reduce=``),
``scatter_add``, ``scatter_reduce``, ``index_select``, ``index_add``, ``index_copy``,
``index_fill``, ``masked_select``, ``masked_scatter``, ``take``, ``take_along_dim`` and
``put``/``put_``, with their gradients and in-place ``_`` forms.

Each op is one :class:`~mpitensor.autograd.Function` whose forward checks the index (integer
dtype, number of dimensions, bounds; torch refuses negative indices where NumPy would wrap
them) and computes with NumPy/CuPy indexing; repeated indices add up (``add.at``) wherever they
must. The in-place forms run the same forward through ``opkit.run_inplace``, so autograd
records them with version counters as it records ``+=``.

Example:
    >>> import mpitensor as mt
    >>> x = mt.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    >>> x.gather(1, mt.tensor([[1], [0]])).sum().backward()
    >>> x.grad
    tensor([[0., 1.],
            [1., 0.]])
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._base import determinism as _determinism
from mpitensor._core.devices import same_device, xp
from mpitensor._core.dims import wrap_dim
from mpitensor._core.opkit import NO_RECORD, run, run_inplace, tensor_methods, wrap
from mpitensor._core.promotion import is_scalar
from mpitensor._ops.indexing import scatter_add_into
from mpitensor._ops.operators import fit_grad
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

_grad_mode = _autograd._mode
_INT64 = _dt.int64


def _index_of(index: Any, what: str) -> Any:
    """The array of an index argument, checked to be of an integer dtype."""
    idx = index._data if isinstance(index, Tensor) else index
    if not hasattr(idx, "dtype"):
        idx = np.asarray(idx)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{what}: the index must be an integer tensor (int64), got "
                        f"{_dt.dt_repr(idx.dtype)}")
    return idx


def _check_bounds(idx: Any, n: int, what: str, negative: bool = False) -> None:
    """Refuse indices outside ``[0, n)`` (``[-n, n)`` where ``negative``)."""
    if idx.size == 0 or _backend.is_meta_array(idx):
        return  # meta indices have no values to check, as in torch
    lo, hi = int(idx.min()), int(idx.max())
    if hi >= n or lo < (-n if negative else 0):
        bad = hi if hi >= n else lo
        raise IndexError(f"{what}: index {bad} is out of bounds for a dimension of size {n}")


def _along_key(idx: Any, axis: int, m: Any) -> tuple:
    """The index tuple picking ``idx``'s entries along ``axis`` and the same positions
    elsewhere (the key of ``gather`` and ``scatter``)."""
    key = []
    for d, n in enumerate(idx.shape):
        key.append(idx if d == axis else m.arange(n).reshape((n,) + (1,) * (idx.ndim - d - 1)))
    return tuple(key)


def _check_along(x: Any, idx: Any, axis: int, what: str, src: Any = None) -> None:
    """gather/scatter's rules: one number of dimensions, and the index no larger than the
    input (and than ``src``) outside ``axis``."""
    if idx.ndim != max(x.ndim, 1) and not (idx.ndim == 0 and x.ndim == 0):
        raise ValueError(f"{what}: the index must have as many dimensions as the input "
                         f"({x.ndim}), got {idx.ndim}")
    for d in range(idx.ndim):
        if d != axis and x.ndim and idx.shape[d] > x.shape[d]:
            raise ValueError(f"{what}: index size {idx.shape[d]} exceeds the input's size "
                             f"{x.shape[d]} at dimension {d}")
        if src is not None and src.ndim and idx.shape[d] > src.shape[d]:
            raise ValueError(f"{what}: index size {idx.shape[d]} exceeds src's size "
                             f"{src.shape[d]} at dimension {d}")
    _check_bounds(idx, x.shape[axis] if x.ndim else 1, what)


def _head(src: Any, shape: tuple) -> Any:
    """The leading ``shape`` block of ``src`` (scatter reads only as much of src as the index
    covers)."""
    if src.shape == shape:
        return src
    return src[tuple(slice(0, s) for s in shape)]


def _head_grad(g: Any, shape: tuple, dtype: Any) -> Any:
    """The gradient of a source of ``shape`` and ``dtype`` whose leading block (see
    :func:`_head`) was read and got ``g``: zero over the rest, which was never read."""
    if g.shape != shape:
        full = xp(g).zeros(shape, dtype=g.dtype)
        full[tuple(slice(0, s) for s in g.shape)] = g
        g = full
    return g.astype(dtype, copy=False)


class Gather(Function):
    """``gather(x, dim, index)``: the gradient is added back at the gathered positions."""

    @staticmethod
    def forward(ctx: Any, x: Any, idx: Any, axis: int) -> Any:
        shape = x.shape
        if x.ndim == 0:  # torch lets a 0-d tensor gather with a 0-d index
            x, idx = x.reshape(1), idx.reshape(1)
        key = _along_key(idx, axis, xp(x))
        ctx.meta = (shape, x.shape, x.dtype, key, idx.shape)
        out = x[key]
        return out.reshape(()) if not shape else out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, shape1, dtype, key, ishape = ctx.meta
        gx = xp(g).zeros(shape1, dtype=dtype)
        scatter_add_into(gx, key, g.reshape(ishape))
        return gx.reshape(shape), None, None


def gather_along(t: Tensor, dim: int, index: Any) -> Tensor:
    x = t._data
    idx = _index_of(index, "gather()")
    axis = wrap_dim(dim, x.ndim)
    _check_along(x, idx, axis, "gather()")
    return run(Gather, t, idx, axis)


_REDUCES = ("sum", "prod", "mean", "amax", "amin")


class Scatter(Function):
    """``x.scatter(dim, index, src_or_value, reduce)`` and ``scatter_reduce``: ``x`` with
    ``src``'s entries written (or reduced) at ``index`` along ``dim``.

    ``mode`` is None (write), or one of :data:`_REDUCES` with ``include_self``; a reduction
    with a number (``reduce="add"`` on a value) is a reduction of a constant ``src``.
    """

    @staticmethod
    def forward(ctx: Any, x: Any, idx: Any, src: Any, axis: int, mode: Optional[str],
                include_self: bool) -> Any:
        m = xp(x)
        key = _along_key(idx, axis, m)
        scalar = is_scalar(src)
        part = src if scalar else _head(src, idx.shape)
        if not scalar:
            x, part = same_device(x, part)
            if part.dtype != x.dtype:
                part = part.astype(x.dtype)
        out = x.copy()
        ctx.meta = (key, mode, include_self, None if scalar else (src.shape, src.dtype))
        if mode is None:
            out[key] = part
            return out
        if scalar:
            part = m.full(idx.shape, part, dtype=x.dtype)
        hit = m.zeros(x.shape, dtype=bool)
        hit[key] = True
        if not include_self:
            neutral = {"sum": 0, "mean": 0, "prod": 1}.get(mode)
            if neutral is None:  # amax/amin: the first value scattered to each position
                out[key] = part
            else:
                out[hit] = neutral
        if mode in ("sum", "mean"):
            scatter_add_into(out, key, part)
        elif mode == "prod":
            m.multiply.at(out, key, part)
        else:
            (m.maximum if mode == "amax" else m.minimum).at(out, key, part)
        count = None
        if mode == "mean":
            count = m.zeros(x.shape, dtype=_INT64)
            scatter_add_into(count, key, m.ones(idx.shape, dtype=_INT64))
            if include_self:
                count += 1
            count = m.maximum(count, 1)
            if out.dtype.kind in "iu":
                out = out // count.astype(out.dtype)
            else:
                out = out / count.astype(out.dtype)
        if ctx.needs_input_grad:
            ctx.save_for_backward(x, part, out, hit, count)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        key, mode, include_self, src_meta = ctx.meta
        need = ctx.needs_input_grad
        m = xp(g)
        gx = gs = None
        if mode is None:
            if need[0]:
                gx = g.copy()
                gx[key] = 0
            if need[2]:
                gs = g[key]
        else:
            x, part, out, hit, count = ctx.saved_tensors
            gx, gs = _scatter_reduce_grads(m, g, key, mode, include_self, x, part, out, hit,
                                           count)
        if gs is not None and src_meta is not None:
            gs = _head_grad(gs, *src_meta)
        return gx, None, (gs if need[2] else None), None, None, None


def _scatter_reduce_grads(m: Any, g: Any, key: tuple, mode: str, include_self: bool, x: Any,
                          part: Any, out: Any, hit: Any, count: Any) -> tuple:
    """The gradients of ``scatter_reduce`` for ``x`` and the scattered ``src`` entries."""
    zero = g.dtype.type(0)
    if mode == "sum":
        gx = g if include_self else m.where(hit, zero, g)
        return gx, g[key]
    if mode == "mean":
        gc = g / count
        gx = m.where(hit, gc if include_self else zero, g)
        return gx, gc[key]
    if mode in ("amax", "amin"):
        # the gradient shared evenly among the values equal to the result, as torch
        self_wins = (x == out) & hit if include_self else m.zeros(x.shape, dtype=bool)
        src_wins = part == out[key]
        n = self_wins.astype(g.dtype)
        scatter_add_into(n, key, src_wins.astype(g.dtype))
        share = g / m.where(n == 0, 1, n)
        gx = m.where(hit, share * self_wins, g)
        return gx, share[key] * src_wins
    # prod: the product of the other contributors, with zeros counted apart
    zeros = m.zeros(x.shape, dtype=_INT64)
    nonzero = m.ones(x.shape, dtype=g.dtype)
    if include_self:
        zeros += (x == 0) & hit
        nonzero = m.where(hit & (x != 0), x, 1).astype(g.dtype)
    scatter_add_into(zeros, key, (part == 0).astype(_INT64))
    m.multiply.at(nonzero, key, m.where(part == 0, 1, part).astype(g.dtype))

    def grad_of(v: Any, z: Any, pnz: Any, gg: Any) -> Any:
        safe = m.where(v == 0, 1, v)
        return gg * m.where(z == 0, pnz / safe, m.where((z == 1) & (v == 0), pnz, 0))

    gx = m.where(hit, grad_of(x, zeros, nonzero, g), g) if include_self else m.where(
        hit, zero, g)
    gs = grad_of(part, zeros[key], nonzero[key], g[key])
    return gx, gs


def _scatter_args(t: Tensor, dim: int, index: Any, src: Any, what: str) -> tuple:
    x = t._data
    idx = _index_of(index, what)
    axis = wrap_dim(dim, x.ndim)
    if isinstance(src, Tensor):
        _check_along(x, idx, axis, what, src._data)
    else:
        if isinstance(src, np.generic):
            src = src.item()
        if not is_scalar(src):
            raise TypeError(f"{what}: src must be a tensor or a number, got "
                            f"{type(src).__name__}")
        _check_along(x, idx, axis, what)
    return idx, src, axis


_OLD_REDUCE = {None: None, "add": "sum", "multiply": "prod"}


def _old_reduce(reduce: Optional[str]) -> Optional[str]:
    if reduce not in _OLD_REDUCE:
        raise ValueError(f"scatter(): reduce must be 'add' or 'multiply', got {reduce!r}")
    return _OLD_REDUCE[reduce]


def _new_reduce(reduce: str) -> str:
    if reduce not in _REDUCES:
        raise ValueError(f"scatter_reduce(): reduce must be one of {list(_REDUCES)}, "
                         f"got {reduce!r}")
    return reduce


def _run_with(t: Tensor, fn: Any, *args: Any) -> Tensor:
    """``fn`` on ``t`` and the tensors among ``args`` (recorded when any requires grad)."""
    if _grad_mode.enabled and (t._requires_grad or any(
            isinstance(a, Tensor) and a._requires_grad for a in args)):
        return fn.apply(t, *args)
    return wrap(fn.forward(NO_RECORD, t._data,
                           *(a._data if isinstance(a, Tensor) else a for a in args)))


class IndexSelect(Function):
    """``index_select(x, dim, index)``: the gradient is added back at the picked slices."""

    @staticmethod
    def forward(ctx: Any, x: Any, idx: Any, axis: int) -> Any:
        ctx.meta = (x.shape, x.dtype, axis, idx)
        return xp(x).take(x, idx, axis=axis)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, axis, idx = ctx.meta
        gx = xp(g).zeros(shape, dtype=dtype)
        scatter_add_into(gx, (slice(None),) * axis + (idx,), g)
        return gx, None, None


def _index_args(t: Tensor, dim: int, index: Any, what: str) -> tuple:
    x = t._data
    idx = _index_of(index, what)
    if idx.ndim > 1:
        raise ValueError(f"{what}: the index must be a vector, got {idx.ndim} dimensions")
    axis = wrap_dim(dim, x.ndim)
    _check_bounds(idx, x.shape[axis] if x.ndim else 1, what)
    if x.ndim == 0:
        raise ValueError(f"{what} needs a tensor with at least one dimension")
    return idx.reshape(-1), axis


class IndexPutAlong(Function):
    """``index_add`` (``mode`` "add", scaled by ``alpha``), ``index_copy`` ("copy") and
    ``index_fill`` ("fill", ``src`` a number or a 0-d array) along ``axis``."""

    @staticmethod
    def forward(ctx: Any, x: Any, idx: Any, src: Any, axis: int, mode: str, alpha: Any) -> Any:
        key = (slice(None),) * axis + (idx,)
        out = x.copy()
        ctx.meta = (key, mode, alpha, axis, idx,
                    getattr(src, "shape", None), getattr(src, "dtype", None))
        if mode == "fill":
            out[key] = src
            return out
        if src.ndim != x.ndim or any(
                s != n for d, (s, n) in enumerate(zip(src.shape, x.shape)) if d != axis) or (
                src.shape[axis] != idx.size):
            raise ValueError(f"index_{mode}(): source has shape {list(src.shape)}, expected "
                             f"the input's shape {list(x.shape)} with {idx.size} along dim "
                             f"{axis}")
        x, src = same_device(x, src)
        if mode == "add":
            scatter_add_into(out, key, (src if alpha == 1 else src * alpha).astype(x.dtype))
        else:
            out[key] = src
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        key, mode, alpha, axis, idx, sshape, sdtype = ctx.meta
        need = ctx.needs_input_grad
        gx = gs = None
        if need[0]:
            if mode == "add":
                gx = g
            else:
                gx = g.copy()
                gx[key] = 0
        if need[2]:
            picked = xp(g).take(g, idx, axis=axis)
            if mode == "fill":
                gs = picked.sum().reshape(sshape).astype(sdtype)
            else:
                gs = (picked if mode == "copy" or alpha == 1 else picked * alpha).astype(sdtype)
        return gx, None, gs, None, None, None


class MaskedSelect(Function):
    """``masked_select(x, mask)``: a 1-D copy of the elements where the (broadcast) mask holds;
    the gradient goes back to those positions."""

    @staticmethod
    def forward(ctx: Any, x: Any, mask: Any) -> Any:
        m = xp(x)
        shape = m.broadcast_shapes(x.shape, mask.shape)
        mb = m.broadcast_to(mask, shape)
        ctx.meta = (x.shape, x.dtype, shape, mb)
        return m.broadcast_to(x, shape)[mb]

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape0, dtype, shape, mb = ctx.meta
        gx = xp(g).zeros(shape, dtype=dtype)
        gx[mb] = g
        return fit_grad(gx, shape0, dtype), None


class MaskedScatter(Function):
    """``masked_scatter(x, mask, source)``: ``source``'s first elements, in order, written
    where the mask holds."""

    @staticmethod
    def forward(ctx: Any, x: Any, mask: Any, src: Any) -> Any:
        m = xp(x)
        mb = m.broadcast_to(mask, x.shape)
        n = int(mb.sum())
        if n > src.size:
            raise ValueError(f"masked_scatter(): the mask selects {n} elements, but source "
                             f"has only {src.size}")
        out = x.copy()
        out[mb] = src.reshape(-1)[:n]
        ctx.meta = (mb, src.shape, src.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        mb, sshape, sdtype = ctx.meta
        need = ctx.needs_input_grad
        gx = xp(g).where(mb, g.dtype.type(0), g) if need[0] else None
        gs = None
        if need[2]:  # the flat source's leading entries went, in order, where the mask holds
            gs = _head_grad(g[mb], (int(np.prod(sshape)),), sdtype).reshape(sshape)
        return gx, None, gs


class Take(Function):
    """``take(x, index)``: the elements of the flattened ``x`` at ``index`` (negative ones
    counted from the end), shaped like ``index``."""

    @staticmethod
    def forward(ctx: Any, x: Any, idx: Any) -> Any:
        ctx.meta = (x.shape, x.dtype, idx)
        return x.reshape(-1)[idx]

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, idx = ctx.meta
        gx = xp(g).zeros(int(np.prod(shape)), dtype=dtype)
        scatter_add_into(gx, idx, g)
        return gx.reshape(shape), None


class Put(Function):
    """``put(x, index, source, accumulate)``: ``source`` written (or added) into the
    flattened ``x`` at ``index``."""

    @staticmethod
    def forward(ctx: Any, x: Any, idx: Any, src: Any, accumulate: bool) -> Any:
        if src.size != idx.size:
            raise ValueError(f"put(): source has {src.size} elements and index {idx.size}; "
                             f"they must match")
        x, src = same_device(x, src)
        out = x.copy()
        flat = out.reshape(-1)
        if accumulate:
            scatter_add_into(flat, idx.reshape(-1), src.reshape(-1).astype(x.dtype))
        else:
            flat[idx.reshape(-1)] = src.reshape(-1)
        ctx.meta = (idx, accumulate, src.shape, src.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        idx, accumulate, sshape, sdtype = ctx.meta
        need = ctx.needs_input_grad
        gx = gs = None
        if need[0]:
            gx = g
            if not accumulate:
                gx = g.copy()
                gx.reshape(-1)[idx.reshape(-1)] = 0
        if need[2]:
            gs = g.reshape(-1)[idx.reshape(-1)].reshape(sshape).astype(sdtype)
        return gx, None, gs, None


def _mask_array(mask: Any, what: str) -> Any:
    mk = mask._data if isinstance(mask, Tensor) else mask
    if not hasattr(mk, "dtype") or mk.dtype.kind != "b":
        raise TypeError(f"{what} takes a bool mask, got "
                        f"{getattr(mk, 'dtype', type(mk).__name__)}")
    return mk


@tensor_methods
class _GatherScatterMethods:
    def gather(self, dim: int, index: Any, *, sparse_grad: bool = False) -> Tensor:
        """Return ``self``'s elements at ``index`` along ``dim`` (``out[i][j] =
        self[index[i][j]][j]`` for ``dim=0``), shaped like ``index``.

        Raises:
            TypeError: ``index`` is not an integer tensor.
            ValueError: ``index`` has another number of dimensions, or is larger than self
                outside ``dim``.
            IndexError: an index out of range.

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([[1, 2], [3, 4]]).gather(1, mt.tensor([[1], [0]]))
            tensor([[2],
                    [3]])
        """
        return gather_along(self, dim, index)

    def scatter(self, dim: int, index: Any, src: Any = None, *, value: Any = None,
                reduce: Optional[str] = None) -> Tensor:
        """Return a copy with ``src`` (a tensor, or a number) written at ``index`` along
        ``dim``: ``out[index[i][j]][j] = src[i][j]`` for ``dim=0``; ``reduce="add"`` or
        ``"multiply"`` combines instead of writing.

        Raises:
            TypeError: ``index`` is not an integer tensor, or ``src`` neither tensor nor
                number.
            ValueError: shapes that do not fit, or an unknown ``reduce``.
            IndexError: an index out of range.
        """
        src = value if src is None else src
        idx, src, axis = _scatter_args(self, dim, index, src, "scatter()")
        return _run_with(self, Scatter, idx, src, axis, _old_reduce(reduce), True)

    def scatter_(self, dim: int, index: Any, src: Any = None, *, value: Any = None,
                 reduce: Optional[str] = None) -> Tensor:
        """:meth:`scatter` in place; returns self."""
        src = value if src is None else src
        idx, src, axis = _scatter_args(self, dim, index, src, "scatter_()")
        return run_inplace(self, Scatter, "scatter_()", idx, src, axis, _old_reduce(reduce),
                           True)

    def scatter_add(self, dim: int, index: Any, src: Any) -> Tensor:
        """Return a copy with ``src`` added at ``index`` along ``dim`` (repeats add up)."""
        idx, src, axis = _scatter_args(self, dim, index, src, "scatter_add()")
        return _run_with(self, Scatter, idx, src, axis, "sum", True)

    def scatter_add_(self, dim: int, index: Any, src: Any) -> Tensor:
        """:meth:`scatter_add` in place; returns self."""
        idx, src, axis = _scatter_args(self, dim, index, src, "scatter_add_()")
        return run_inplace(self, Scatter, "scatter_add_()", idx, src, axis, "sum", True)

    def scatter_reduce(self, dim: int, index: Any, src: Any, reduce: str, *,
                       include_self: bool = True) -> Tensor:
        """Return a copy with ``src`` reduced into it at ``index`` along ``dim``:
        ``reduce`` is ``"sum"``, ``"prod"``, ``"mean"``, ``"amax"`` or ``"amin"``; with
        ``include_self=False`` the old values at the written positions do not take part.

        Raises:
            ValueError: an unknown ``reduce``, or shapes that do not fit.
        """
        idx, src, axis = _scatter_args(self, dim, index, src, "scatter_reduce()")
        return _run_with(self, Scatter, idx, src, axis, _new_reduce(reduce), bool(include_self))

    def scatter_reduce_(self, dim: int, index: Any, src: Any, reduce: str, *,
                        include_self: bool = True) -> Tensor:
        """:meth:`scatter_reduce` in place; returns self."""
        idx, src, axis = _scatter_args(self, dim, index, src, "scatter_reduce_()")
        return run_inplace(self, Scatter, "scatter_reduce_()", idx, src, axis,
                           _new_reduce(reduce), bool(include_self))

    def index_select(self, dim: int, index: Any) -> Tensor:
        """Return the slices of ``dim`` listed in ``index`` (a vector of ints), in order.

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([[1, 2, 3]]).index_select(1, mt.tensor([2, 0]))
            tensor([[3, 1]])
        """
        idx, axis = _index_args(self, dim, index, "index_select()")
        return run(IndexSelect, self, idx, axis)

    def index_add(self, dim: int, index: Any, source: Any, *, alpha: Any = 1) -> Tensor:
        """Return a copy with ``alpha * source``'s slices added at the ``index`` slices of
        ``dim`` (repeats add up)."""
        idx, axis = _index_args(self, dim, index, "index_add()")
        return _run_with(self, IndexPutAlong, idx, source, axis, "add", alpha)

    def index_add_(self, dim: int, index: Any, source: Any, *, alpha: Any = 1) -> Tensor:
        """:meth:`index_add` in place; returns self."""
        idx, axis = _index_args(self, dim, index, "index_add_()")
        return run_inplace(self, IndexPutAlong, "index_add_()", idx, source, axis, "add", alpha)

    def index_copy(self, dim: int, index: Any, source: Any) -> Tensor:
        """Return a copy with ``source``'s slices written at the ``index`` slices of ``dim``."""
        idx, axis = _index_args(self, dim, index, "index_copy()")
        return _run_with(self, IndexPutAlong, idx, source, axis, "copy", 1)

    def index_copy_(self, dim: int, index: Any, source: Any) -> Tensor:
        """:meth:`index_copy` in place; returns self."""
        idx, axis = _index_args(self, dim, index, "index_copy_()")
        return run_inplace(self, IndexPutAlong, "index_copy_()", idx, source, axis, "copy", 1)

    def index_fill(self, dim: int, index: Any, value: Any) -> Tensor:
        """Return a copy with ``value`` (a number or a 0-d tensor) in the ``index`` slices."""
        idx, axis = _index_args(self, dim, index, "index_fill()")
        _check_fill_value(value)
        return _run_with(self, IndexPutAlong, idx, value, axis, "fill", 1)

    def index_fill_(self, dim: int, index: Any, value: Any) -> Tensor:
        """:meth:`index_fill` in place; returns self."""
        idx, axis = _index_args(self, dim, index, "index_fill_()")
        _check_fill_value(value)
        return run_inplace(self, IndexPutAlong, "index_fill_()", idx, value, axis, "fill", 1)

    def masked_select(self, mask: Any) -> Tensor:
        """Return the 1-D tensor of the elements where ``mask`` (bool, broadcast) holds."""
        mk = _mask_array(mask, "masked_select()")
        x, mk = same_device(self._data, mk)
        return run(MaskedSelect, self, mk)

    def masked_scatter(self, mask: Any, source: Tensor) -> Tensor:
        """Return a copy with ``source``'s elements, in order, where ``mask`` holds.

        Raises:
            TypeError: ``mask`` is not bool.
            ValueError: ``source`` has fewer elements than the mask selects.
        """
        mk = _mask_array(mask, "masked_scatter()")
        return _run_with(self, MaskedScatter, mk, source)

    def masked_scatter_(self, mask: Any, source: Tensor) -> Tensor:
        """:meth:`masked_scatter` in place; returns self."""
        mk = _mask_array(mask, "masked_scatter_()")
        return run_inplace(self, MaskedScatter, "masked_scatter_()", mk, source)

    def take(self, index: Any) -> Tensor:
        """Return the elements of the flattened tensor at ``index`` (shaped like it).

        Raises:
            IndexError: an index outside ``[-numel, numel)``.
        """
        idx = _index_of(index, "take()")
        _check_bounds(idx, self._data.size, "take()", negative=True)
        return run(Take, self, idx)

    def take_along_dim(self, indices: Any, dim: Optional[int] = None) -> Tensor:
        """Return the elements at ``indices`` along ``dim`` (``gather`` with the two
        broadcast against each other outside ``dim``); with ``dim`` None, of the flattened
        tensor."""
        idx = _index_of(indices, "take_along_dim()")
        if dim is None:
            return gather_along(self.reshape(-1), 0, wrap(idx.reshape(-1)))
        x = self._data
        axis = wrap_dim(dim, x.ndim)
        if idx.ndim != x.ndim:
            raise ValueError(f"take_along_dim(): indices must have as many dimensions as the "
                             f"input ({x.ndim}), got {idx.ndim}")
        m = xp(x)
        shape = list(m.broadcast_shapes(
            tuple(1 if d == axis else n for d, n in enumerate(x.shape)),
            tuple(1 if d == axis else n for d, n in enumerate(idx.shape))))
        xs, ids = list(shape), list(shape)
        xs[axis], ids[axis] = x.shape[axis], idx.shape[axis]
        t = self if tuple(xs) == x.shape else self.expand(*xs)
        return gather_along(t, axis, wrap(m.broadcast_to(idx, tuple(ids))))

    def put(self, index: Any, source: Any, accumulate: bool = False) -> Tensor:
        """Return a copy with ``source`` written (``accumulate``: added) into the flattened
        tensor at ``index``."""
        idx = _index_of(index, "put()")
        _check_bounds(idx, self._data.size, "put()", negative=True)
        return _run_with(self, Put, idx, source, bool(accumulate))

    def put_(self, index: Any, source: Any, accumulate: bool = False) -> Tensor:
        """:meth:`put` in place; returns self."""
        idx = _index_of(index, "put_()")
        _check_bounds(idx, self._data.size, "put_()", negative=True)
        if not accumulate:  # which of repeated indices wins is left open, as in torch
            _determinism.alert("put_(accumulate=False)", always=True)
        return run_inplace(self, Put, "put_()", idx, source, bool(accumulate))

    def argwhere(self) -> Tensor:
        """Return the ``(n, ndim)`` int64 indices of the non-zero elements."""
        return self.nonzero()

    def nonzero_static(self, *, size: int, fill_value: int = -1) -> Tensor:
        """Return :meth:`nonzero`'s ``(size, ndim)`` indices, cut to ``size`` rows or padded
        with ``fill_value``."""
        nz = self.nonzero()._data
        m = xp(nz)
        out = m.full((size, nz.shape[1]), fill_value, dtype=_INT64)
        k = min(size, nz.shape[0])
        out[:k] = nz[:k]
        return wrap(out)

    def index_put(self, indices: Any, values: Any, accumulate: bool = False) -> Tensor:
        """Return a copy with ``values`` written (``accumulate``: added, repeats adding up) at
        ``self[indices]`` (a tuple of index tensors)."""
        return self.clone().index_put_(indices, values, accumulate)

    def index_put_(self, indices: Any, values: Any, accumulate: bool = False) -> Tensor:
        """:meth:`index_put` in place; returns self."""
        key = tuple(indices) if isinstance(indices, (tuple, list)) else (indices,)
        if not accumulate:
            self[key] = values
            return self
        return run_inplace(self, IndexAccumulate, "index_put_()", key, values)

    def index_reduce(self, dim: int, index: Any, source: Any, reduce: str, *,
                     include_self: bool = True) -> Tensor:
        """Return a copy with ``source``'s slices reduced (``"prod"``, ``"mean"``, ``"amax"``,
        ``"amin"``) into the ``index`` slices of ``dim``."""
        idx, src, axis = _index_reduce_args(self, dim, index, source, reduce)
        return _run_with(self, Scatter, idx, src, axis, reduce, bool(include_self))

    def index_reduce_(self, dim: int, index: Any, source: Any, reduce: str, *,
                      include_self: bool = True) -> Tensor:
        """:meth:`index_reduce` in place; returns self."""
        idx, src, axis = _index_reduce_args(self, dim, index, source, reduce)
        return run_inplace(self, Scatter, "index_reduce_()", idx, src, axis, reduce,
                           bool(include_self))

    def select_scatter(self, src: Tensor, dim: int, index: int) -> Tensor:
        """Return a copy with ``src`` written at ``self.select(dim, index)``."""
        out = self.clone()
        out.select(dim, index).copy_(src)
        return out

    def slice_scatter(self, src: Tensor, dim: int = 0, start: Optional[int] = None,
                      end: Optional[int] = None, step: int = 1) -> Tensor:
        """Return a copy with ``src`` written at the slice ``start:end:step`` of ``dim``."""
        out = self.clone()
        d = wrap_dim(dim, self._data.ndim)
        out[(slice(None),) * d + (slice(start, end, step),)] = src
        return out

    def diagonal_scatter(self, src: Tensor, offset: int = 0, dim1: int = 0,
                         dim2: int = 1) -> Tensor:
        """Return a copy with ``src`` written on the diagonal (see ``diagonal``)."""
        out = self.clone()
        out.diagonal(offset, dim1, dim2).copy_(src)
        return out

    def fill_diagonal_(self, fill_value: Any, wrap: bool = False) -> Tensor:
        """Write ``fill_value`` on the main diagonal (all dimensions equal, or a tall matrix
        with ``wrap`` restarting it every ``ncols + 1`` rows); returns self."""
        x = self._data
        if x.ndim < 2 or (x.ndim > 2 and len(set(x.shape)) != 1):
            raise ValueError("fill_diagonal_(): expects a matrix, or all dimensions equal")
        return run_inplace(self, FillDiagonal, "fill_diagonal_()", fill_value, bool(wrap))


class IndexAccumulate(Function):
    """``x.index_put_(key, values, accumulate=True)``: ``values`` added at ``x[key]``,
    repeated positions adding up; ``values`` gets the gradient at those positions."""

    @staticmethod
    def forward(ctx: Any, x: Any, key: tuple, values: Any) -> Any:
        key = tuple(k._data if isinstance(k, Tensor) else k for k in key)
        out = x.copy()
        v = values if is_scalar(values) else same_device(x, values)[1]
        scatter_add_into(out, key, xp(x).broadcast_to(xp(x).asarray(v, dtype=x.dtype),
                                                   out[key].shape))
        ctx.meta = (key, getattr(values, "shape", None), getattr(values, "dtype", None))
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        key, vshape, vdtype = ctx.meta
        gv = None
        if ctx.needs_input_grad[2]:
            gv = fit_grad(g[key], vshape, vdtype)
        return g, None, gv


class FillDiagonal(Function):
    """``fill_diagonal_``: the diagonal's gradient is zero (it was overwritten)."""

    @staticmethod
    def _mask(shape: tuple, wrap: bool, m: Any) -> Any:
        mask = m.zeros(shape, dtype=bool)
        if len(shape) == 2:
            flat = mask.reshape(-1)
            n_rows, n_cols = shape
            end = flat.size if wrap or n_rows <= n_cols else n_cols * n_cols
            flat[:end:n_cols + 1] = True
        else:
            mask[(m.arange(shape[0]),) * len(shape)] = True
        return mask

    @staticmethod
    def forward(ctx: Any, x: Any, value: Any, wrap: bool) -> Any:
        mask = FillDiagonal._mask(x.shape, wrap, xp(x))
        out = x.copy()
        out[mask] = value
        ctx.save_for_backward(mask)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (mask,) = ctx.saved_tensors
        return xp(g).where(mask, g.dtype.type(0), g), None, None


def _index_reduce_args(t: Tensor, dim: int, index: Any, source: Any, reduce: str) -> tuple:
    """``index_reduce`` as a ``scatter_reduce``: the index repeated across ``source``."""
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise ValueError(f"index_reduce(): reduce must be 'prod', 'mean', 'amax' or 'amin', "
                         f"got {reduce!r}")
    idx, axis = _index_args(t, dim, index, "index_reduce()")
    src = source._data if isinstance(source, Tensor) else source
    x = t._data
    if not hasattr(src, "shape") or src.ndim != x.ndim or any(
            (n != idx.size) if d == axis else (n != x.shape[d]) for d, n in enumerate(src.shape)):
        raise ValueError("index_reduce(): source must have the input's shape, with the "
                         "index's length along dim")
    m = xp(idx)
    shape = [1] * src.ndim
    shape[axis] = idx.size
    full = m.broadcast_to(idx.reshape(shape), src.shape)
    return full, source, axis


def _check_fill_value(value: Any) -> None:
    v = value._data if isinstance(value, Tensor) else value
    if hasattr(v, "ndim") and v.ndim != 0:
        raise ValueError(f"index_fill(): the value must be a number or a 0-d tensor, got "
                         f"{v.ndim} dimension(s)")
    if not hasattr(v, "ndim") and not is_scalar(v):
        raise TypeError(f"index_fill(): the value must be a number or a 0-d tensor, got "
                        f"{type(v).__name__}")
