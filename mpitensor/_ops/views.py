"""Changes of shape and layout (views where possible) and their gradients.

``view``, ``reshape``, ``flatten``, ``squeeze``, ``unsqueeze``, ``permute``, ``transpose``,
``t``/``T``/``mT``, ``expand``, ``repeat``, ``split``/``chunk``/``unbind`` and the copies
``clone``/``contiguous``. Views share the tensor's storage (a write through one shows in the
other), as in torch, and one version counter (see ``mpitensor.autograd``); ``expand`` gives a
read-only broadcast view.

Each differentiable one is a :class:`~mpitensor.autograd.Function`: its forward checks the
arguments and makes the new array, its backward maps the gradient back to the input's shape.
``split``, ``chunk`` and ``unbind`` are made of indexing (``mpitensor._ops.indexing``).

Example:
    >>> import mpitensor as mt
    >>> x = mt.arange(6.0).reshape(2, 3)
    >>> x.T.shape
    mpitensor.Size([3, 2])
"""

from __future__ import annotations

import math
import operator
from typing import Any, Optional

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core.devices import xp
from mpitensor._core.dims import infer_shape, keyword_form, need_dims, size_from, wrap_dim
from mpitensor._core.opkit import run, run_view, sum_to, tensor_methods, wrap
from mpitensor.autograd import ArrayFunction as Function, version_cell
from mpitensor.tensor import Tensor

_ndarray = np.ndarray
_grad_mode = _autograd._mode


class Alias(Function):
    """The same array under a new tensor (``+x``): the gradient passes unchanged."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return x

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return (g,)


class _Reshaped(Function):
    """Base of the ops that keep the elements in order: the gradient is reshaped back."""

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return (g.reshape(ctx.shape),)


class Reshape(_Reshaped):
    """``x.reshape(shape)``: a view when the layout allows one, else a copy."""

    @staticmethod
    def forward(ctx: Any, x: Any, shape: tuple) -> Any:
        ctx.shape = x.shape
        return x.reshape(infer_shape(shape, x.size, "reshape"))


def _view_or_none(x: Any, shape: tuple) -> Any:
    """``x`` viewed in ``shape`` without copying, or None where its layout does not allow it."""
    if not isinstance(x, _ndarray):
        r = x.reshape(shape)  # CuPy: a copy has a new data pointer
        return r if not r.size or int(r.data.ptr) == int(x.data.ptr) else None
    try:
        return x.reshape(shape, copy=False)
    except ValueError:
        return None
    except TypeError:  # NumPy < 2.1 has no reshape(copy=): setting .shape never copies
        r = x.view()
        try:
            r.shape = shape
        except AttributeError:
            return None
        return r


class View(_Reshaped):
    """``x.view(shape)``: never a copy.

    Raises:
        RuntimeError: the memory layout cannot be viewed in that shape.
    """

    @staticmethod
    def forward(ctx: Any, x: Any, shape: tuple) -> Any:
        ctx.shape = x.shape
        r = _view_or_none(x, infer_shape(shape, x.size, "view"))
        if r is None:
            raise RuntimeError(
                "view size is not compatible with input tensor's size and stride (at least one "
                "dimension spans across two contiguous subspaces). Use .reshape(...) instead."
            )
        return r


class Squeeze(_Reshaped):
    """``x.squeeze(dim)``: size-1 dimensions removed (only those in ``dim`` when given)."""

    @staticmethod
    def forward(ctx: Any, x: Any, dim: Any) -> Any:
        ctx.shape = x.shape
        if dim is None:
            return x.squeeze()
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        wrapped = [wrap_dim(d, x.ndim) for d in dims]
        if x.ndim == 0:
            return x[...]
        # torch leaves a named dimension whose size is not 1 alone, where NumPy would raise
        axes = tuple(d for d in wrapped if x.shape[d] == 1)
        return x.squeeze(axis=axes) if axes else x[...]


class Unsqueeze(_Reshaped):
    """``x.unsqueeze(dim)``: a size-1 dimension inserted at ``dim``."""

    @staticmethod
    def forward(ctx: Any, x: Any, dim: int) -> Any:
        ctx.shape = x.shape
        return xp(x).expand_dims(x, wrap_dim(dim, x.ndim + 1))


def _flat_shape(shape: tuple, start_dim: int, end_dim: int) -> Optional[tuple]:
    """The shape after merging ``start_dim..end_dim``; None when that changes nothing.

    Raises:
        ValueError: ``start_dim`` comes after ``end_dim``.
    """
    if not shape:
        return (1,)
    s, e = wrap_dim(start_dim, len(shape)), wrap_dim(end_dim, len(shape))
    if s > e:
        raise ValueError(
            f"flatten() has invalid args: start_dim ({start_dim}) cannot come after "
            f"end_dim ({end_dim})"
        )
    if s == e:
        return None
    return shape[:s] + (math.prod(shape[s : e + 1]),) + shape[e + 1 :]


def _permutation(dims: tuple, ndim: int) -> tuple:
    """``dims`` as a permutation of ``range(ndim)`` (negative entries wrapped).

    Raises:
        ValueError: not one index per dimension, or not a permutation.
    """
    if len(dims) != ndim:
        raise ValueError(
            f"permute(): the number of dims ({len(dims)}) does not match the tensor's "
            f"dimensions ({ndim}): pass one index per dimension"
        )
    wrapped = tuple(wrap_dim(d, ndim) for d in dims)
    if sorted(wrapped) != list(range(ndim)):
        raise ValueError(f"permute(): dims {list(dims)} are not a permutation of {ndim} dims")
    return wrapped


class Permute(Function):
    """``x.permute(axes)`` for a checked permutation ``axes``, or with ``axes`` None all
    dimensions reversed (``t``, ``T``): the gradient is permuted back."""

    @staticmethod
    def forward(ctx: Any, x: Any, axes: Optional[tuple]) -> Any:
        ctx.axes = axes
        if axes is None:
            return x.T
        return x.transpose(axes) if axes else x[...]

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        axes = ctx.axes
        if axes is None:
            return g.T, None
        return (g.transpose(tuple(int(i) for i in np.argsort(axes))) if axes else g), None


class Transpose(Function):
    """``x.transpose(dim0, dim1)``: two dimensions swapped; so is the gradient."""

    @staticmethod
    def forward(ctx: Any, x: Any, dim0: int, dim1: int) -> Any:
        if x.ndim == 0:  # torch accepts 0 and -1 here and returns the tensor as it is
            wrap_dim(dim0, 0), wrap_dim(dim1, 0)
            ctx.swap = None
            return x[...]
        d0, d1 = wrap_dim(dim0, x.ndim), wrap_dim(dim1, x.ndim)
        ctx.swap = (d0, d1)
        return x.swapaxes(d0, d1)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return (g if ctx.swap is None else g.swapaxes(*ctx.swap)), None, None


def _expanded_shape(shape: tuple, sizes: tuple) -> tuple:
    """The shape ``expand(*sizes)`` gives a tensor of ``shape`` (-1 keeps a dimension).

    Raises:
        ValueError: too few sizes, -1 for a new leading dimension, or a non-singleton
            dimension that would change.
    """
    if len(sizes) < len(shape):
        raise ValueError(
            f"expand(): the number of sizes provided ({len(sizes)}) must be greater or equal "
            f"to the number of dimensions in the tensor ({len(shape)})"
        )
    lead = len(sizes) - len(shape)
    target = []
    for i, s in enumerate(sizes):
        if i < lead:
            if s < 0:
                raise ValueError(
                    f"expand(): -1 is not allowed in a leading, non-existing dimension ({i})"
                )
            target.append(s)
            continue
        cur = shape[i - lead]
        if s == -1:
            s = cur
        elif cur != 1 and s != cur:
            raise ValueError(
                f"The expanded size of the tensor ({s}) must match the existing size ({cur}) "
                f"at non-singleton dimension {i}.  Target sizes: {list(sizes)}.  "
                f"Tensor sizes: {list(shape)}"
            )
        target.append(s)
    return tuple(target)


class Expand(Function):
    """``x.expand(*sizes)``: the gradient is summed over the broadcast dimensions."""

    @staticmethod
    def forward(ctx: Any, x: Any, sizes: tuple) -> Any:
        ctx.shape = x.shape
        target = _expanded_shape(x.shape, size_from(sizes, "expand", allow_minus_one=True))
        return xp(x).broadcast_to(x, target)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return sum_to(g, ctx.shape), None


class Repeat(Function):
    """``x.repeat(*sizes)`` (tiling): the gradient of every copy is summed."""

    @staticmethod
    def forward(ctx: Any, x: Any, sizes: tuple) -> Any:
        sizes = size_from(sizes, "repeat")
        if len(sizes) < x.ndim:
            raise ValueError(
                "Number of dimensions of repeat dims can not be smaller than number of "
                f"dimensions of tensor ({len(sizes)} < {x.ndim})"
            )
        ctx.meta = (x.shape, sizes)
        return xp(x).tile(x, sizes)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, sizes = ctx.meta
        full = (1,) * (len(sizes) - len(shape)) + tuple(shape)
        inter = []
        for r, s in zip(sizes, full):
            inter += [r, s]
        g = g.reshape(inter).sum(axis=tuple(range(0, 2 * len(sizes), 2)))
        return g.reshape(shape), None


class Clone(Function):
    """``clone`` (keeping the memory layout, as torch does) or ``contiguous`` (C order): a
    copy, through which the gradient passes unchanged."""

    @staticmethod
    def forward(ctx: Any, x: Any, contiguous: bool) -> Any:
        return xp(x).ascontiguousarray(x) if contiguous else x.copy(order="K")

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return g, None


@tensor_methods
class _ViewMethods:
    def clone(self) -> Tensor:
        """Return a copy with its own storage (keeping the memory layout, as torch does)."""
        return run(Clone, self, False)

    def contiguous(self) -> Tensor:
        """Return self when C-contiguous (or on the meta device, where there is nothing to
        lay out), else a C-contiguous copy."""
        if self._data.flags.c_contiguous or _backend.is_meta_array(self._data):
            return self
        return run(Clone, self, True)

    def reshape(self, *shape: Any, **kw: Any) -> Tensor:
        """Return the elements in a new shape: a view when possible, else a copy.

        Args:
            shape: ints or one tuple; one entry may be -1 (inferred).

        Raises:
            ValueError: the shape does not hold ``numel()`` elements.

        Example:
            >>> import mpitensor as mt
            >>> mt.arange(6).reshape(2, -1).shape
            mpitensor.Size([2, 3])
        """
        shape = keyword_form(shape, kw, "shape", "reshape")
        return run_view(Reshape, self, shape, reshape=True)

    def view(self, *shape: Any, **kw: Any) -> Tensor:
        """Return a view with a new shape (or a new dtype), never a copy.

        Args:
            shape: ints or one tuple (one entry may be -1), or a single dtype to reinterpret
                the bytes, like ``torch.Tensor.view(dtype)``.

        Raises:
            ValueError: the shape does not hold ``numel()`` elements.
            RuntimeError: the memory layout cannot be viewed in that shape (use ``reshape``).

        Example:
            >>> import mpitensor as mt
            >>> t = mt.zeros(2, 3); t.view(6)[0] = 1; t[0, 0]
            tensor(1.)
        """
        if kw:
            shape = keyword_form(shape, kw, "dtype" if "dtype" in kw else "size", "view")
        if len(shape) == 1 and not isinstance(shape[0], (tuple, list)):
            s = shape[0]
            if not isinstance(s, (int, np.integer, Tensor)) or isinstance(s, bool):
                if self._requires_grad and _grad_mode.enabled:
                    raise RuntimeError(
                        "view(dtype) of a tensor that requires grad is not differentiable; "
                        "call it on t.detach()"
                    )
                r = wrap(self._data.view(_dt.to_dtype(s)))
                r._vc = version_cell(self)
                return r
        return run_view(View, self, shape, reshape=True)

    def view_as(self, other: Tensor) -> Tensor:
        """Return ``self.view(other.shape)``."""
        return self.view(other.shape)

    def reshape_as(self, other: Tensor) -> Tensor:
        """Return ``self.reshape(other.shape)``."""
        return self.reshape(other.shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Return dimensions ``start_dim..end_dim`` merged into one (a view when possible).

        Raises:
            ValueError: ``start_dim`` comes after ``end_dim``.
        """
        shape = _flat_shape(self._data.shape, start_dim, end_dim)
        return self if shape is None else run_view(Reshape, self, shape, reshape=True)

    def squeeze(self, dim: Any = None) -> Tensor:
        """Return a view without size-1 dimensions (only those in ``dim`` when given).

        Dimensions in ``dim`` whose size is not 1 are left alone, as in torch.
        """
        return run_view(Squeeze, self, dim, reshape=True)

    def unsqueeze(self, dim: int) -> Tensor:
        """Return a view with a size-1 dimension inserted at ``dim``."""
        return run_view(Unsqueeze, self, dim, reshape=True)

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        """Return a view with dimensions ``dim0`` and ``dim1`` swapped."""
        return run_view(Transpose, self, dim0, dim1)

    swapaxes = transpose

    def t(self) -> Tensor:
        """Return the transpose of a tensor with at most 2 dimensions.

        Raises:
            ValueError: the tensor has more than 2 dimensions (use ``transpose`` or ``mT``).
        """
        n = self._data.ndim
        if n > 2:
            raise ValueError(
                f"t() expects a tensor with <= 2 dimensions, but self is {n}D; "
                f"use transpose(dim0, dim1) or .mT"
            )
        return run_view(Permute, self, None)

    @property
    def T(self) -> Tensor:  # noqa: N802 - torch's name
        """A view with the dimensions reversed."""
        return run_view(Permute, self, None)

    @property
    def mT(self) -> Tensor:  # noqa: N802 - torch's name
        """A view with the last two dimensions swapped.

        Raises:
            ValueError: the tensor has fewer than 2 dimensions.
        """
        n = self._data.ndim
        if n < 2:
            raise ValueError(f"tensor.mT is only supported on matrices or batches of matrices. "
                             f"Got {n}-D tensor.")
        return self.transpose(-2, -1)

    def permute(self, *dims: Any, **kw: Any) -> Tensor:
        """Return a view with the dimensions reordered.

        Raises:
            ValueError: ``dims`` is not a permutation of ``range(ndim)``.
        """
        dims = keyword_form(dims, kw, "dims", "permute")
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        return run_view(Permute, self, _permutation(dims, self._data.ndim))

    def expand(self, *sizes: Any, **kw: Any) -> Tensor:
        """Return a read-only broadcast view with size-1 dimensions repeated to ``sizes``.

        -1 keeps a dimension's size; extra leading dimensions may be added.

        Raises:
            ValueError: a non-singleton dimension would change, or too few sizes are given.

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([[1], [2]]).expand(2, 3)
            tensor([[1, 1, 1],
                    [2, 2, 2]])
        """
        return run_view(Expand, self, keyword_form(sizes, kw, "size", "expand"))

    def expand_as(self, other: Tensor) -> Tensor:
        """Return ``self.expand(other.shape)``."""
        return self.expand(other.shape)

    def repeat(self, *sizes: Any, **kw: Any) -> Tensor:
        """Return a copy tiled ``sizes[i]`` times along each dimension (``numpy.tile``).

        Raises:
            ValueError: fewer sizes than dimensions.
        """
        return run(Repeat, self, keyword_form(sizes, kw, "repeats", "repeat"))

    def chunk(self, chunks: int, dim: int = 0) -> tuple:
        """Split into at most ``chunks`` views of equal size along ``dim`` (the last smaller)."""
        x = self._data
        need_dims(x, "chunk")
        if operator.index(chunks) <= 0:
            raise ValueError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
        d = wrap_dim(dim, x.ndim)
        step = max(1, -(-x.shape[d] // chunks))
        return self.split(step, d)

    def split(self, split_size_or_sections: Any, dim: int = 0) -> tuple:
        """Split into views along ``dim``: pieces of one size, or of the listed sizes.

        Raises:
            ValueError: listed sizes do not add up to the dimension's length.
            IndexError: the tensor is 0-d.
        """
        x = self._data
        need_dims(x, "split")
        d = wrap_dim(dim, x.ndim)
        sizes = _split_sizes(split_size_or_sections, x.shape[d], d)
        pre = (slice(None),) * d
        out, start = [], 0
        for s in sizes:
            out.append(self[(*pre, slice(start, start + s))])
            start += s
        return tuple(out)

    def unbind(self, dim: int = 0) -> tuple:
        """Return the views along ``dim``, that dimension removed."""
        x = self._data
        need_dims(x, "unbind")
        d = wrap_dim(dim, x.ndim)
        pre = (slice(None),) * d
        return tuple(self[(*pre, i, Ellipsis)] for i in range(x.shape[d]))


def _split_sizes(split_size_or_sections: Any, n: int, d: int) -> list:
    """The piece lengths of ``split``: the listed ones, or pieces of one size (the last
    smaller) covering ``n``.

    Raises:
        ValueError: listed sizes that do not add up to ``n``, or a size that is not positive.
    """
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = [operator.index(s) for s in split_size_or_sections]
        if sum(sizes) != n:
            raise ValueError(
                f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's "
                f"size at dimension {d}), but got split_sizes={sizes}"
            )
        return sizes
    step = operator.index(split_size_or_sections)
    if step <= 0:
        raise ValueError(f"split_size must be positive, got {step}")
    return [min(step, n - i) for i in range(0, n, step)] or [0]
