"""More changes of shape and arrangement: ``flip``/``fliplr``/``flipud``, ``roll``, ``rot90``,
``narrow``, ``select``, ``movedim``, ``unflatten``, ``ravel``, ``broadcast_to``,
``repeat_interleave``, ``tile``, ``tensor_split``/``hsplit``/``vsplit``/``dsplit``, ``diff``,
``cross``, and the functions of several tensors ``broadcast_tensors``, ``meshgrid``,
``cartesian_prod``, ``hstack``/``vstack``/``dstack``/``column_stack``, ``atleast_Nd``,
``block_diag``, ``tril_indices``/``triu_indices``.

Views stay views (``narrow``, ``select``, ``movedim``, ``unflatten``, the splits, ``meshgrid``),
as in torch, through the view ops of ``mpitensor._ops.views`` and indexing; ``flip``, ``roll`` and
``rot90`` copy, as torch's do, each with a :class:`~mpitensor.autograd.Function` whose backward
undoes the move. The rest are compositions of recorded ops.

Example:
    >>> import mpitensor as mt
    >>> mt.tensor([[1, 2], [3, 4]]).flip(0)
    tensor([[3, 4],
            [1, 2]])
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core.devices import create, parse_device, xp
from mpitensor._core.dims import keyword_form, need_dims, size_from, wrap_dim
from mpitensor._core.opkit import run, serve, tensor_methods, wrap
from mpitensor._ops.combine import cat, stack
from mpitensor._ops.create import dtype_or
from mpitensor._ops.gather_scatter import IndexSelect
from mpitensor._ops.indexing import scatter_add_into
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

_INT64 = _dt.int64


def _dims_of(dims: Any, ndim: int, what: str) -> tuple:
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    wrapped = tuple(wrap_dim(d, ndim) for d in dims)
    if len(set(wrapped)) != len(wrapped):
        raise ValueError(f"{what}: dims {list(dims)} name a dimension twice")
    return wrapped


class Flip(Function):
    """``flip(x, dims)`` (a copy, as torch): the gradient is flipped back."""

    @staticmethod
    def forward(ctx: Any, x: Any, axes: tuple) -> Any:
        ctx.axes = axes
        return xp(x).flip(x, axes).copy() if axes else x.copy()

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return (xp(g).flip(g, ctx.axes) if ctx.axes else g), None


class Roll(Function):
    """``roll(x, shifts, dims)``: the gradient is rolled back."""

    @staticmethod
    def forward(ctx: Any, x: Any, shifts: tuple, axes: Optional[tuple]) -> Any:
        ctx.meta = (shifts, axes, x.shape)
        m = xp(x)
        if axes is None:
            return m.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
        return m.roll(x, shifts, axes)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shifts, axes, shape = ctx.meta
        m = xp(g)
        back = tuple(-s for s in shifts)
        if axes is None:
            return m.roll(g.reshape(-1), back[0]).reshape(shape), None, None
        return m.roll(g, back, axes), None, None


class Rot90(Function):
    """``rot90(x, k, dims)`` (a copy): the gradient is turned back."""

    @staticmethod
    def forward(ctx: Any, x: Any, k: int, axes: tuple) -> Any:
        ctx.meta = (k, axes)
        return xp(x).rot90(x, k, axes).copy()

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        k, axes = ctx.meta
        return xp(g).rot90(g, -k, axes), None, None


def _index(v: Any) -> int:
    return int(v.item()) if isinstance(v, Tensor) else operator.index(v)


def _split_points(n: int, spec: Any, what: str) -> list:
    """The boundaries of ``tensor_split``: ``spec`` sections (the first ``n % spec`` one
    longer) or a list of indices."""
    if isinstance(spec, Tensor):
        spec = spec.item() if spec._data.ndim == 0 else spec.tolist()
    if isinstance(spec, (int, np.integer)):
        k = int(spec)
        if k <= 0:
            raise ValueError(f"{what}: the number of sections must be positive, got {k}")
        q, r = divmod(n, k)
        points, start = [], 0
        for i in range(k):
            start += q + (1 if i < r else 0)
            points.append(start)
        return [0, *points]
    return [0, *(min(max(operator.index(i) if i >= 0 else n + operator.index(i), 0), n)
                 for i in spec), n]


def _pieces(t: Tensor, points: list, axis: int) -> tuple:
    pre = (slice(None),) * axis
    out = []
    for a, b in zip(points[:-1], points[1:]):
        out.append(t[(*pre, slice(a, max(a, b)))])
    return tuple(out)


def _even_split(t: Tensor, spec: Any, axis: int, what: str) -> tuple:
    n = t._data.shape[axis]
    if isinstance(spec, (int, np.integer)) and (spec <= 0 or n % spec):
        raise ValueError(f"{what}: a dimension of size {n} cannot be split into {spec} equal "
                         f"sections")
    return t.tensor_split(spec, axis)


@tensor_methods
class _ShapeMethods:
    def flip(self, *dims: Any, **kw: Any) -> Tensor:
        """Return a copy with the order of the elements reversed along ``dims``."""
        dims = keyword_form(dims, kw, "dims", "flip")
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        x = self._data
        return run(Flip, self, _dims_of(dims, x.ndim, "flip()") if x.ndim else ())

    def fliplr(self) -> Tensor:
        """Return a copy flipped left to right (dimension 1; at least 2-D)."""
        if self._data.ndim < 2:
            raise ValueError("fliplr(): the input must have at least 2 dimensions")
        return self.flip(1)

    def flipud(self) -> Tensor:
        """Return a copy flipped up to down (dimension 0; at least 1-D)."""
        if self._data.ndim < 1:
            raise ValueError("flipud(): the input must have at least 1 dimension")
        return self.flip(0)

    def roll(self, shifts: Any, dims: Any = None) -> Tensor:
        """Return a copy with the elements shifted by ``shifts`` along ``dims`` (around the
        end); without ``dims``, of the flattened tensor.

        Raises:
            ValueError: ``shifts`` and ``dims`` differ in length.
        """
        x = self._data
        shifts = (shifts,) if isinstance(shifts, (int, np.integer, Tensor)) else tuple(shifts)
        shifts = tuple(_index(s) for s in shifts)
        if dims is None:
            if len(shifts) != 1:
                raise ValueError("roll(): without dims, shifts must be one number")
            return run(Roll, self, shifts, None)
        axes = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
        axes = tuple(wrap_dim(d, x.ndim) for d in axes)
        if len(axes) != len(shifts):
            raise ValueError(f"roll(): shifts and dims must have the same length, got "
                             f"{len(shifts)} and {len(axes)}")
        return run(Roll, self, shifts, axes)

    def rot90(self, k: int = 1, dims: Sequence[int] = (0, 1)) -> Tensor:
        """Return a copy rotated by ``k`` quarter turns in the plane of ``dims``, from the
        first towards the second."""
        x = self._data
        if len(dims) != 2:
            raise ValueError(f"rot90(): dims must name 2 dimensions, got {len(dims)}")
        axes = tuple(wrap_dim(d, x.ndim) for d in dims)
        if axes[0] == axes[1] or x.ndim < 2:
            raise ValueError("rot90(): dims must name two different dimensions of a tensor "
                             "with at least 2")
        return run(Rot90, self, operator.index(k) % 4, axes)

    def narrow(self, dim: int, start: Any, length: int) -> Tensor:
        """Return the view of ``length`` elements of ``dim`` from ``start``.

        Raises:
            IndexError: the range does not fit in the dimension.
        """
        x = self._data
        need_dims(x, "narrow")
        d = wrap_dim(dim, x.ndim)
        n = x.shape[d]
        s, length = _index(start), operator.index(length)
        if s < 0:
            s += n
        if not (0 <= s <= n and 0 <= length and s + length <= n):
            raise IndexError(f"narrow(): start {start} and length {length} do not fit a "
                             f"dimension of size {n}")
        return self[(slice(None),) * d + (slice(s, s + length),)]

    def select(self, dim: int, index: int) -> Tensor:
        """Return the view of element ``index`` of ``dim``, that dimension removed."""
        x = self._data
        need_dims(x, "select")
        d = wrap_dim(dim, x.ndim)
        i, n = _index(index), x.shape[d]
        if not -n <= i < n:
            raise IndexError(f"select(): index {i} is out of range for a dimension of size {n}")
        return self[(slice(None),) * d + (i, Ellipsis)]

    def movedim(self, source: Any, destination: Any) -> Tensor:
        """Return a view with dimensions ``source`` moved to positions ``destination``.

        Raises:
            ValueError: ``source`` and ``destination`` differ in length or repeat a dim.
        """
        n = self._data.ndim
        src = _dims_of(source, n, "movedim()")
        dst = _dims_of(destination, n, "movedim()")
        if len(src) != len(dst):
            raise ValueError(f"movedim(): source and destination must have the same length, "
                             f"got {len(src)} and {len(dst)}")
        order = [d for d in range(n) if d not in src]
        for d, s in sorted(zip(dst, src)):
            order.insert(d, s)
        return self.permute(order) if n else self

    moveaxis = movedim

    def swapdims(self, dim0: int, dim1: int) -> Tensor:
        """Return a view with ``dim0`` and ``dim1`` swapped (``transpose``)."""
        return self.transpose(dim0, dim1)

    def ravel(self) -> Tensor:
        """Return the elements as one dimension (a view when the layout allows)."""
        return self.reshape(-1)

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
        """Return a view with dimension ``dim`` split into ``sizes`` (one may be -1)."""
        x = self._data
        d = wrap_dim(dim, x.ndim)
        sizes = size_from(tuple(sizes), "unflatten", allow_minus_one=True)
        n = x.shape[d]
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if sizes.count(-1) > 1 or known == 0 or n % known:
                raise ValueError(f"unflatten(): sizes {list(sizes)} do not fit a dimension of "
                                 f"size {n}")
            sizes = tuple(n // known if s == -1 else s for s in sizes)
        elif known != n:
            raise ValueError(f"unflatten(): sizes {list(sizes)} do not multiply to the "
                             f"dimension's size {n}")
        return self.reshape(x.shape[:d] + sizes + x.shape[d + 1:])

    def broadcast_to(self, size: Sequence[int]) -> Tensor:
        """Return a read-only broadcast view of shape ``size`` (``expand``)."""
        return self.expand(*size)

    def repeat_interleave(self, repeats: Any = None, dim: Optional[int] = None, *,
                          output_size: Optional[int] = None) -> Tensor:
        """Return each element (each slice of ``dim``) repeated ``repeats`` times in a row.

        ``repeats`` is an int or a tensor with one count per slice; without ``dim`` the
        tensor is flattened first.

        Raises:
            ValueError: a repeat count is negative, or the counts do not fit the dimension.
        """
        if repeats is None:  # torch.repeat_interleave(counts): the indices, repeated
            return wrap(xp(self._data).arange(self._data.size)).repeat_interleave(self)
        t = self.reshape(-1) if dim is None else self
        x = t._data
        axis = wrap_dim(0 if dim is None else dim, x.ndim)
        if isinstance(repeats, Tensor):
            r = repeats._data
            if r.ndim > 1 or r.dtype.kind not in "iu":
                raise ValueError("repeat_interleave(): repeats must be an int or a 1-D integer "
                                 "tensor")
            r = r.reshape(-1)
            if r.size == 1:
                r = xp(x).full(x.shape[axis] if x.ndim else 1, int(r[0]), dtype=_INT64)
            elif r.size != (x.shape[axis] if x.ndim else 1):
                raise ValueError(f"repeat_interleave(): {r.size} repeat counts for a dimension "
                                 f"of size {x.shape[axis]}")
        else:
            r = operator.index(repeats)
        if (r < 0) if isinstance(r, int) else bool((r < 0).any()):
            raise ValueError("repeat_interleave(): repeats must be non-negative")
        if x.ndim == 0:
            t = t.reshape(1)
        # index_select of each slice's index repeated (torch's form too): its gradient adds
        # the copies' gradients up
        m = xp(x)
        return run(IndexSelect, t, m.repeat(m.arange(t._data.shape[axis]), r), axis)

    def tile(self, *dims: Any, **kw: Any) -> Tensor:
        """Return the tensor repeated ``dims[i]`` times along each dimension (missing leading
        counts are 1)."""
        dims = size_from(keyword_form(dims, kw, "dims", "tile"), "tile")
        n = self._data.ndim
        if len(dims) < n:
            dims = (1,) * (n - len(dims)) + dims
        return self.repeat(*dims)

    def tensor_split(self, indices_or_sections: Any, dim: int = 0) -> tuple:
        """Split into views along ``dim``: ``n`` sections (the first ``size % n`` one longer)
        or at the listed indices."""
        x = self._data
        need_dims(x, "tensor_split")
        axis = wrap_dim(dim, x.ndim)
        return _pieces(self, _split_points(x.shape[axis], indices_or_sections,
                                           "tensor_split()"), axis)

    def hsplit(self, sections: Any) -> tuple:
        """Split along dimension 1 (0 for 1-D tensors): equal sections or at indices."""
        x = self._data
        need_dims(x, "hsplit")
        return _even_split(self, sections, 1 if x.ndim > 1 else 0, "hsplit()")

    def vsplit(self, sections: Any) -> tuple:
        """Split along dimension 0 of an at least 2-D tensor: equal sections or at indices."""
        if self._data.ndim < 2:
            raise ValueError("vsplit(): the input must have at least 2 dimensions")
        return _even_split(self, sections, 0, "vsplit()")

    def dsplit(self, sections: Any) -> tuple:
        """Split along dimension 2 of an at least 3-D tensor: equal sections or at indices."""
        if self._data.ndim < 3:
            raise ValueError("dsplit(): the input must have at least 3 dimensions")
        return _even_split(self, sections, 2, "dsplit()")

    def split_with_sizes(self, split_sizes: Sequence[int], dim: int = 0) -> tuple:
        """Split into views of the listed sizes along ``dim``."""
        return self.split(list(split_sizes), dim)

    def unfold(self, dimension: int, size: int, step: int) -> Tensor:
        """Return the windows of ``size`` elements, ``step`` apart, along ``dimension``, as a
        new last dimension (a read-only view).

        Raises:
            ValueError: ``size`` is larger than the dimension, or ``step`` is not positive.
        """
        x = self._data
        axis = wrap_dim(dimension, x.ndim) if x.ndim else 0
        t = self.reshape(1) if x.ndim == 0 else self
        n = t._data.shape[axis]
        size, step = operator.index(size), operator.index(step)
        if not 0 <= size <= n or step <= 0:
            raise ValueError(f"unfold(): size {size} and step {step} do not fit a dimension "
                             f"of size {n}")
        return run(Unfold, t, axis, size, step)

    def sum_to_size(self, *size: Any) -> Tensor:
        """Return self summed over the dimensions that ``size`` broadcasts to it.

        Raises:
            ValueError: self's shape is not an expansion of ``size``.
        """
        size = size_from(size, "sum_to_size")
        shape = self._data.shape
        if np.broadcast_shapes(size, shape) != shape:
            raise ValueError(f"sum_to_size(): size {list(size)} does not expand to "
                             f"{list(shape)}")
        lead = len(shape) - len(size)
        dims = tuple(range(lead)) + tuple(
            lead + i for i, s in enumerate(size) if s == 1 and shape[lead + i] != 1)
        out = self.sum(dims, keepdim=True) if dims else self
        return out.reshape(size)

    def narrow_copy(self, dim: int, start: int, length: int) -> Tensor:
        """Return a copy of :meth:`narrow`'s view."""
        return self.narrow(dim, start, length).clone()

    def squeeze_(self, dim: Any = None) -> Tensor:
        """:meth:`squeeze` in place (self takes the new shape); returns self."""
        return _inplace_view(self, self.squeeze(dim), "squeeze_()")

    def unsqueeze_(self, dim: int) -> Tensor:
        """:meth:`unsqueeze` in place; returns self."""
        return _inplace_view(self, self.unsqueeze(dim), "unsqueeze_()")

    def t_(self) -> Tensor:
        """:meth:`t` in place; returns self."""
        return _inplace_view(self, self.t(), "t_()")

    def transpose_(self, dim0: int, dim1: int) -> Tensor:
        """:meth:`transpose` in place; returns self."""
        return _inplace_view(self, self.transpose(dim0, dim1), "transpose_()")

    swapaxes_ = transpose_
    swapdims_ = transpose_

    def unsafe_chunk(self, chunks: int, dim: int = 0) -> tuple:
        """:meth:`chunk` (views here, as always)."""
        return self.chunk(chunks, dim)

    def unsafe_split(self, split_size: Any, dim: int = 0) -> tuple:
        """:meth:`split`."""
        return self.split(split_size, dim)

    def unsafe_split_with_sizes(self, split_sizes: Sequence[int], dim: int = 0) -> tuple:
        """:meth:`split_with_sizes`."""
        return self.split(list(split_sizes), dim)

    def diff(self, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> Tensor:
        """Return the ``n``-th forward difference along ``dim`` (``prepend``/``append``
        joined first); for bools, whether neighbours differ."""
        x = self._data
        need_dims(x, "diff")
        axis = wrap_dim(dim, x.ndim)
        t = self
        parts = [p for p in (prepend, t, append) if p is not None]
        if len(parts) > 1:
            shaped = []
            for p in parts:
                if not isinstance(p, Tensor):
                    shape = list(x.shape)
                    shape[axis] = 1
                    p = wrap(xp(x).full(tuple(shape), p, dtype=x.dtype))
                shaped.append(p)
            t = cat(shaped, axis)
        pre = (slice(None),) * axis
        for _ in range(operator.index(n)):
            a, b = t[(*pre, slice(1, None))], t[(*pre, slice(None, -1))]
            t = a.logical_xor(b) if t._data.dtype.kind == "b" else a - b
        return t

    def cross(self, other: Tensor, dim: Optional[int] = None) -> Tensor:
        """Return the cross product of 3-vectors along ``dim`` (broadcasting); without
        ``dim``, along the first dimension of size 3.

        Raises:
            ValueError: no dimension of size 3.
        """
        a, b = broadcast_tensors(self, other)
        shape = a._data.shape
        if dim is None:
            dim = next((i for i, s in enumerate(shape) if s == 3), None)
            if dim is None:
                raise ValueError(f"cross(): no dimension of size 3 in shape {list(shape)}")
        d = wrap_dim(dim, len(shape))
        if shape[d] != 3:
            raise ValueError(f"cross(): dimension {d} has size {shape[d]}, not 3")
        a0, a1, a2 = (a.select(d, i) for i in range(3))
        b0, b1, b2 = (b.select(d, i) for i in range(3))
        return stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], d)


class Unfold(Function):
    """``x.unfold(dim, size, step)``: the windows of ``size`` elements every ``step`` along
    ``dim``, as a new last dimension (a read-only view); overlapping windows add their
    gradients."""

    @staticmethod
    def forward(ctx: Any, x: Any, axis: int, size: int, step: int) -> Any:
        m = xp(x)
        if m is np:
            win = np.lib.stride_tricks.sliding_window_view(x, size, axis=axis)
        else:  # CuPy: the same windows through as_strided
            n = (x.shape[axis] - size) + 1
            shape = x.shape[:axis] + (n,) + x.shape[axis + 1:] + (size,)
            win = m.lib.stride_tricks.as_strided(x, shape, x.strides + (x.strides[axis],))
        key = (slice(None),) * axis + (slice(None, None, step),)
        ctx.meta = (x.shape, x.dtype, axis, size, step)
        return win[key]

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, axis, size, step = ctx.meta
        m = xp(g)
        n = g.shape[axis]
        pos = (m.arange(n)[:, None] * step + m.arange(size)[None, :])  # (windows, size)
        gx = m.zeros(shape, dtype=dtype)
        gm = m.moveaxis(g, axis, -2)  # (..., windows, size)
        target = m.moveaxis(gx, axis, -1)  # a view of gx: (..., length)
        scatter_add_into(target, (Ellipsis, pos), gm)
        return gx, None, None, None


def _inplace_view(t: Tensor, r: Tensor, what: str) -> Tensor:
    """Make ``t`` take the shape of its view ``r`` (the in-place view ops: ``t_``,
    ``squeeze_``, ...): the same storage, ``r``'s graph."""
    from mpitensor import autograd as _autograd  # noqa: PLC0415 - imported by now

    if t._requires_grad and t.grad_fn is None and _autograd.is_grad_enabled():
        raise _autograd.leaf_in_place_error(what)
    t._data = r._data
    if r.grad_fn is not None:
        t.grad_fn = r.grad_fn
    if r._view is not None and t._view is not None:
        t._view = r._view
    _autograd.bump_version(t)
    return t


# --------------------------------------------------------------------------------------------
# Functions of several tensors


def _tensors(args: tuple, what: str) -> list:
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = tuple(args[0])
    for a in args:
        if not isinstance(a, Tensor):
            raise TypeError(f"{what} takes tensors, got {type(a).__name__}")
    return list(args)


def broadcast_shapes(*shapes: Any) -> Any:
    """Return the shape that tensors of ``shapes`` broadcast to (a ``Size``).

    Raises:
        ValueError: the shapes do not broadcast.
    """
    from mpitensor.tensor import Size  # noqa: PLC0415 - tensor is imported already

    return Size(np.broadcast_shapes(*(tuple(s) if isinstance(s, (tuple, list)) else (s,)
                                      for s in shapes)))


def broadcast_tensors(*tensors: Any) -> tuple:
    """Return the tensors expanded (as views) to their common broadcast shape.

    Example:
        >>> import mpitensor as mt
        >>> [t.shape for t in mt.broadcast_tensors(mt.zeros(2, 1), mt.zeros(3))]
        [mpitensor.Size([2, 3]), mpitensor.Size([2, 3])]
    """
    ts = _tensors(tensors, "broadcast_tensors()")
    shape = np.broadcast_shapes(*(t._data.shape for t in ts))
    return tuple(t if t._data.shape == shape else t.expand(*shape) for t in ts)


def atleast_1d(*tensors: Any) -> Any:
    """Return the tensor (or each) with at least 1 dimension."""
    ts = _tensors(tensors, "atleast_1d()")
    out = tuple(t.reshape(1) if t._data.ndim == 0 else t for t in ts)
    return out[0] if len(tensors) == 1 and isinstance(tensors[0], Tensor) else out


def atleast_2d(*tensors: Any) -> Any:
    """Return the tensor (or each) with at least 2 dimensions (new ones in front)."""
    ts = _tensors(tensors, "atleast_2d()")
    out = tuple(t.reshape((1,) * (2 - t._data.ndim) + t._data.shape) if t._data.ndim < 2
                else t for t in ts)
    return out[0] if len(tensors) == 1 and isinstance(tensors[0], Tensor) else out


def atleast_3d(*tensors: Any) -> Any:
    """Return the tensor (or each) with at least 3 dimensions (a vector ``(n,)`` becomes
    ``(1, n, 1)``, a matrix ``(m, n)`` becomes ``(m, n, 1)``, as torch)."""
    ts = _tensors(tensors, "atleast_3d()")

    def lift(t: Tensor) -> Tensor:
        s = t._data.shape
        if len(s) == 0:
            return t.reshape(1, 1, 1)
        if len(s) == 1:
            return t.reshape(1, s[0], 1)
        if len(s) == 2:
            return t.unsqueeze(-1)
        return t

    out = tuple(lift(t) for t in ts)
    return out[0] if len(tensors) == 1 and isinstance(tensors[0], Tensor) else out


def hstack(tensors: Sequence[Tensor]) -> Tensor:
    """Join along dimension 1 (0 for 1-D tensors)."""
    ts = atleast_1d(*_tensors((tensors,), "hstack()"))
    ts = ts if isinstance(ts, tuple) else (ts,)
    return cat(list(ts), 0 if ts[0]._data.ndim == 1 else 1)


def vstack(tensors: Sequence[Tensor]) -> Tensor:
    """Join along dimension 0, 1-D tensors taken as rows."""
    ts = atleast_2d(*_tensors((tensors,), "vstack()"))
    return cat(list(ts if isinstance(ts, tuple) else (ts,)), 0)


row_stack = vstack


def dstack(tensors: Sequence[Tensor]) -> Tensor:
    """Join along dimension 2 (depth), lifting tensors to 3 dimensions first."""
    ts = atleast_3d(*_tensors((tensors,), "dstack()"))
    return cat(list(ts if isinstance(ts, tuple) else (ts,)), 2)


def column_stack(tensors: Sequence[Tensor]) -> Tensor:
    """Join along dimension 1, 0-D and 1-D tensors taken as columns."""
    ts = _tensors((tensors,), "column_stack()")
    cols = [t.reshape(-1, 1) if t._data.ndim <= 1 else t for t in ts]
    return cat(cols, 1)


def meshgrid(*tensors: Any, indexing: Optional[str] = None) -> tuple:
    """Return coordinate grids (broadcast views) of 0-D or 1-D tensors: with ``"ij"``
    (the default) grid ``i`` varies along dimension ``i``; with ``"xy"`` the first two
    dimensions are swapped, as ``numpy.meshgrid``.

    Raises:
        ValueError: an input with more than 1 dimension, or an unknown ``indexing``.
    """
    ts = _tensors(tensors, "meshgrid()")
    indexing = indexing or "ij"
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid(): indexing must be 'ij' or 'xy', got {indexing!r}")
    for t in ts:
        if t._data.ndim > 1:
            raise ValueError("meshgrid(): expects 0-D or 1-D tensors")
    sizes = [t._data.size for t in ts]
    pos = list(range(len(ts)))
    if indexing == "xy" and len(ts) >= 2:
        sizes[0], sizes[1] = sizes[1], sizes[0]
        pos[0], pos[1] = 1, 0
    grids = []
    for t, p in zip(ts, pos):
        shape = [1] * len(ts)
        shape[p] = -1
        grids.append(t.reshape(shape).expand(*sizes))
    return tuple(grids)


def cartesian_prod(*tensors: Any) -> Tensor:
    """Return the rows of every combination of the 1-D tensors' elements (``itertools.
    product`` order); one tensor is returned as it is."""
    ts = _tensors(tensors, "cartesian_prod()")
    if len(ts) == 1:
        return ts[0]
    return stack([g.reshape(-1) for g in meshgrid(*ts, indexing="ij")], 1)


def block_diag(*tensors: Any) -> Tensor:
    """Return the block diagonal matrix of the tensors (0-D and 1-D ones taken as one row)."""
    ts = [t.reshape(1, -1) if t._data.ndim < 2 else t for t in _tensors(tensors,
                                                                          "block_diag()")]
    for t in ts:
        if t._data.ndim != 2:
            raise ValueError("block_diag(): expects tensors of at most 2 dimensions")
    from mpitensor._core.promotion import promote  # noqa: PLC0415 - light

    dt = ts[0]._data.dtype
    for t in ts[1:]:
        dt = promote(dt, t._data.dtype)
    total = sum(t._data.shape[1] for t in ts)
    rows, left = [], 0
    m = xp(ts[0]._data)
    for t in ts:
        r, c = t._data.shape
        parts = []
        if left:
            parts.append(wrap(m.zeros((r, left), dtype=dt)))
        parts.append(t.to(dt) if t._data.dtype != dt else t)
        if total - left - c:
            parts.append(wrap(m.zeros((r, total - left - c), dtype=dt)))
        rows.append(cat(parts, 1) if len(parts) > 1 else parts[0])
        left += c
    return cat(rows, 0)


def combinations(input: Tensor, r: int = 2, with_replacement: bool = False) -> Tensor:  # noqa: A002
    """Return the ``r``-element combinations of a 1-D tensor's elements as rows, in
    ``itertools.combinations`` order (``_with_replacement`` when asked).

    Example:
        >>> import mpitensor as mt
        >>> combinations(mt.tensor([1, 2, 3])).tolist()
        [[1, 2], [1, 3], [2, 3]]
    """
    import itertools  # noqa: PLC0415 - only here

    x = input._data
    if x.ndim != 1:
        raise ValueError(f"combinations(): expects a 1-D tensor, got {x.ndim} dimensions")
    make = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    idx = np.array(list(make(range(x.shape[0]), r)), dtype=_INT64).reshape(-1, r)
    if r == 0 or idx.size == 0:
        return wrap(xp(x).empty((0,) if r == 0 else (0, r), dtype=x.dtype))
    return input[wrap(xp(x).asarray(idx))]


def vander(x: Tensor, N: Optional[int] = None, increasing: bool = False) -> Tensor:  # noqa: N803
    """Return the Vandermonde matrix of a 1-D tensor: columns ``x**(N-1) ... x**0`` (or
    increasing powers)."""
    n = x._data.shape[0] if N is None else operator.index(N)
    powers = xp(x._data).arange(n)
    if not increasing:
        powers = powers[::-1].copy()
    p = wrap(powers)
    base = x.unsqueeze(1)
    if base._data.dtype.kind == "b":
        base = base.long()
    return base ** p.to(base._data.dtype if base._data.dtype.kind in "iu" else _INT64)


def trapezoid(y: Tensor, x: Any = None, *, dx: Any = None, dim: int = -1) -> Tensor:
    """Integrate ``y`` along ``dim`` by the trapezoidal rule, at the points ``x`` (or evenly
    ``dx`` apart, 1 by default)."""
    return _trapezoid(y, x, dx, dim, cumulative=False)


trapz = trapezoid


def cumulative_trapezoid(y: Tensor, x: Any = None, *, dx: Any = None, dim: int = -1) -> Tensor:
    """The running integrals of :func:`trapezoid` along ``dim``."""
    return _trapezoid(y, x, dx, dim, cumulative=True)


def _trapezoid(y: Tensor, x: Any, dx: Any, dim: int, cumulative: bool) -> Tensor:
    d = wrap_dim(dim, y._data.ndim)
    n = y._data.shape[d]
    pre = (slice(None),) * d
    avg = (y[(*pre, slice(1, None))] + y[(*pre, slice(None, n - 1))]) / 2
    if x is not None:
        if isinstance(x, Tensor) and x._data.ndim == 1:
            shape = [1] * y._data.ndim
            shape[d] = -1
            x = x.reshape(shape)
        xd = x._data.ndim
        dd = d - (y._data.ndim - xd)
        xp_ = (slice(None),) * dd
        step = x[(*xp_, slice(1, None))] - x[(*xp_, slice(None, -1))]
        parts = avg * step
    else:
        parts = avg * (1 if dx is None else dx)
    return parts.cumsum(d) if cumulative else parts.sum(d)


def unravel_index(indices: Any, shape: Any) -> tuple:
    """Return, for flat indices into a tensor of ``shape``, one int64 tensor of coordinates
    per dimension."""
    idx = indices._data if isinstance(indices, Tensor) else np.asarray(indices)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    n = math.prod(shape)
    if idx.size and (int(idx.min()) < -n or int(idx.max()) >= n):
        raise IndexError(f"unravel_index(): an index is out of range for shape {list(shape)}")
    m = xp(idx)
    return tuple(wrap(c.astype(_INT64)) for c in m.unravel_index(idx % max(n, 1), shape))


def _tri_indices(row: int, col: int, offset: int, lower: bool, dtype: Any,
                 device: Any) -> Tensor:
    row, col, offset = operator.index(row), operator.index(col), operator.index(offset)
    fn = np.tril_indices if lower else np.triu_indices
    r, c = fn(row, offset, col)
    dt = dtype_or(dtype, _INT64)
    out = np.stack([r, c]).astype(dt)
    dev = parse_device(device)
    if dev is not None and dev.type != "cpu":
        out = create(dev, "asarray", out)
    return wrap(out)


def tril_indices(row: int, col: int, offset: int = 0, *, dtype: Any = None,
                 device: Any = None, layout: Any = None) -> Tensor:
    """Return the ``(2, N)`` coordinates of the lower triangle (on and below diagonal
    ``offset``) of a ``row x col`` matrix, row by row.

    Example:
        >>> tril_indices(2, 2)
        tensor([[0, 1, 1],
                [0, 0, 1]])
    """
    return _tri_indices(row, col, offset, True, dtype, device)


def triu_indices(row: int, col: int, offset: int = 0, *, dtype: Any = None,
                 device: Any = None, layout: Any = None) -> Tensor:
    """Return the ``(2, N)`` coordinates of the upper triangle (on and above diagonal
    ``offset``) of a ``row x col`` matrix, row by row."""
    return _tri_indices(row, col, offset, False, dtype, device)


concatenate = cat

serve({name: globals()[name] for name in (
    "broadcast_tensors", "broadcast_shapes", "atleast_1d", "atleast_2d", "atleast_3d", "hstack",
    "vstack", "row_stack", "dstack", "column_stack", "concatenate", "meshgrid",
    "cartesian_prod", "block_diag", "tril_indices", "triu_indices", "combinations", "vander",
    "trapezoid", "trapz", "cumulative_trapezoid", "unravel_index")})
