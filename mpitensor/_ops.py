"""Differentiable Tensor operations: one :class:`~mpitensor.autograd.Function` per op.

Each op keeps its forward and its backward side by side and works on raw arrays (NumPy or
CuPy; the array module is taken from the inputs). ``Tensor`` methods call ``Op.apply`` only when
an input requires grad and grad mode is on; otherwise they run their plain, unrecorded code.

Two forward styles are used:

- ops whose forward is a single array call compute it here (``Exp``, ``Sum``, ...);
- ops whose forward carries validation and dtype rules that live in ``tensor.py`` (views,
  indexing, binary operators, casts, ``cat``) get the finished output array from the Tensor
  method (``Op.apply(t, out, ...)``), so the forward semantics are exactly those of the
  unrecorded path; their ``forward`` only keeps what ``backward`` needs.

Gradients returned for an input are reduced to its shape (after broadcasting) and cast back to
its dtype, so a float32 leaf used with a float64 operand still gets a float32 ``.grad``.

Example:
    >>> import mpitensor as mt
    >>> x = mt.tensor([1.0, -2.0], requires_grad=True)
    >>> y = (x.relu() * 3).sum()
    >>> y.grad_fn.name()
    'SumBackward'
"""

from __future__ import annotations

import importlib
import math
import operator
import sys
from typing import Any

import numpy as np

from mpitensor import backend as _backend
from mpitensor import tensor as _t
from mpitensor.autograd import Function, _sum_to

_ndarray = np.ndarray
_generic = np.generic


def _xp(x: Any) -> Any:
    if isinstance(x, (_ndarray, _generic)):
        return np
    return _backend.array_module(x)


def _fit(g: Any, shape: tuple, dtype: Any) -> Any:
    """Reduce a (broadcast) gradient to ``shape`` and cast it to ``dtype``."""
    if g.shape != shape:
        g = _sum_to(g, shape)
    if g.dtype != dtype:
        g = g.astype(dtype)
    return g


def _meta(v: Any) -> Any:
    """Shape and dtype of an array operand; None for a Python scalar (it gets no gradient)."""
    return (v.shape, v.dtype) if hasattr(v, "shape") else None


def _quiet() -> Any:
    """Silence NumPy's floating-point warnings (torch computes inf/nan silently)."""
    return np.errstate(all="ignore")


# --------------------------------------------------------------------------------------------
# Binary operators (+ - * / ** % @, maximum/minimum)
#
# forward(ctx, x, y, (op, mode, rev, wrap)): x is the left Tensor's array; y the other operand
# (an array or a Python scalar; wrap says whether it came as a Tensor). The output comes from
# tensor._binary, so promotion, bool rules and device handling are the unrecorded path's. The
# backward of each op works in math order, ``a op b`` with ``(a, b) = (y, x)`` when ``rev``.


class _Binary(Function):
    keep_inputs = True  # backward reads the operands
    keep_output = False  # backward reads the result

    @classmethod
    def forward(cls, ctx: Any, x: Any, y: Any, spec: tuple) -> Any:
        op, mode, rev, wrap = spec
        ty = type(y)
        if mode == _t._ARITH and x.dtype.kind in "fc" and (  # tensor._binary's fast paths
            (ty is type(x) and y.dtype == x.dtype)
            or ((ty is float or ty is int) and type(x) is _ndarray)
        ):
            out = op(y, x) if rev else op(x, y)
            yv = y
        else:
            out = _t._binary(_t._new(x), _t._new(y) if wrap else y, op, mode, rev)
            if out is NotImplemented:
                raise TypeError(f"unsupported operand type for {op}: {ty.__name__}")
            out = out._data
            yv = y if wrap else _t._operand(y)
        ctx.rev = rev
        ctx.metas = ((x.shape, x.dtype), (yv.shape, yv.dtype) if hasattr(yv, "shape") else None)
        ki = cls.keep_inputs
        ctx.save_for_backward(x if ki else None, yv if ki else None,
                              out if cls.keep_output else None)
        return out

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, y, out = ctx.saved_tensors
        need = ctx.needs_input_grad
        grads = ctx.fn._grads
        if ctx.rev:  # math order: y op x
            gy, gx = grads(ctx, g, y, x, out, need[1], need[0])
        else:
            gx, gy = grads(ctx, g, x, y, out, need[0], need[1])
        mx, my = ctx.metas
        gx = _fit(gx, *mx) if need[0] and gx is not None else None
        gy = _fit(gy, *my) if need[1] and gy is not None and my is not None else None
        return gx, gy


class Add(_Binary):
    """``a + b``."""

    keep_inputs = False

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        return g, g


class Sub(_Binary):
    """``a - b``."""

    keep_inputs = False

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        return g, (-g if need_b else None)


class Mul(_Binary):
    """``a * b``."""

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        return (g * b if need_a else None), (g * a if need_b else None)


class Div(_Binary):
    """``a / b``: d/da = 1/b, d/db = -a/b**2 = -out/b."""

    keep_output = True

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        return (g / b if need_a else None), (-(g * out) / b if need_b else None)


def _log(v: Any) -> Any:
    if isinstance(v, (int, float)):
        return math.log(v) if v > 0 else (-math.inf if v == 0 else math.nan)
    return _xp(v).log(v)


class Pow(_Binary):
    """``a ** b``: d/da = b * a**(b-1) (0 where b == 0), d/db = out * log(a) (0 where a == 0 and
    b >= 0), as torch defines them."""

    keep_output = True

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        ga = gb = None
        if need_a:
            if isinstance(b, (int, float)):
                if b == 0:
                    ga = g * 0
                elif b == 2:
                    ga = g * (2 * a)
                else:
                    ga = g * (b * a ** (b - 1))
            else:
                xp = _xp(b)
                ga = g * xp.where(b == 0, 0, b * a ** (b - 1))
        if need_b:
            d = out * _log(a)
            if not isinstance(a, (int, float)):
                d = _xp(a).where((a == 0) & (b >= 0), 0, d)
            gb = g * d
        return ga, gb


class Remainder(_Binary):
    """``a % b`` (Python/floor remainder): d/da = 1, d/db = -floor(a / b)."""

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        gb = None
        if need_b:
            gb = -g * _xp(b).floor_divide(a, b)
        return g, gb


class _MaxMin(_Binary):
    is_max = True

    @classmethod
    def _grads(cls, ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool,
               need_b: bool) -> tuple:
        # torch: ties share the gradient half and half
        xp = _xp(a) if hasattr(a, "shape") else _xp(b)
        wins = (a > b) if cls.is_max else (a < b)
        tie = a == b
        wa = xp.where(wins, 1.0, xp.where(tie, 0.5, 0.0))
        return (g * wa if need_a else None), (g * (1.0 - wa) if need_b else None)


class Maximum(_MaxMin):
    """``maximum(a, b)`` (``t.max(other)``)."""

    is_max = True


class Minimum(_MaxMin):
    """``minimum(a, b)`` (``t.min(other)``)."""

    is_max = False


class MatMul(_Binary):
    """``a @ b`` for 1-D and n-D operands with batch broadcasting, as ``torch.matmul``."""

    @staticmethod
    def _grads(ctx: Any, g: Any, a: Any, b: Any, out: Any, need_a: bool, need_b: bool) -> tuple:
        if a.ndim == 1 and b.ndim == 1:  # dot product: g is 0-d
            return (g * b if need_a else None), (g * a if need_b else None)
        a1 = a[None, :] if a.ndim == 1 else a
        b1 = b[:, None] if b.ndim == 1 else b
        g1 = g
        if a.ndim == 1:
            g1 = g1[..., None, :]
        if b.ndim == 1:
            g1 = g1[..., None]
        xp = _xp(g1)
        ga = gb = None
        if need_a:
            ga = xp.matmul(g1, b1.swapaxes(-1, -2))
            if ga.shape != a1.shape:
                ga = _sum_to(ga, a1.shape)
            ga = ga.reshape(a.shape)
        if need_b:
            gb = xp.matmul(a1.swapaxes(-1, -2), g1)
            if gb.shape != b1.shape:
                gb = _sum_to(gb, b1.shape)
            gb = gb.reshape(b.shape)
        return ga, gb


class _NotDifferentiable(_Binary):
    name_ = "operation"

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        raise RuntimeError(
            f"derivative for {ctx.fn.name_} is not implemented; compute it under "
            f"mpitensor.no_grad() or on detached tensors (t.detach())"
        )


class FloorDivide(_NotDifferentiable):
    """``a // b`` (recorded so that backward through it fails as in torch)."""

    name_ = "floor_divide"


class TruncDivide(_NotDifferentiable):
    """``div(a, b, rounding_mode='trunc')``."""

    name_ = "div with rounding_mode='trunc'"


class NotImplementedOp(_NotDifferentiable):
    """A binary operator that has no derivative (bitwise operators and the like)."""

    name_ = "this operator"


_BINARY = {
    operator.add: Add,
    operator.sub: Sub,
    operator.mul: Mul,
    operator.truediv: Div,
    operator.pow: Pow,
    operator.mod: Remainder,
    operator.floordiv: FloorDivide,
    operator.matmul: MatMul,
}
_BINARY_BY_NAME = {
    "maximum": Maximum,
    "minimum": Minimum,
    "_trunc_divide": TruncDivide,
}


def binary(a: Any, other: Any, op: Any, mode: int, rev: bool) -> Any:
    """The recorded form of ``tensor._binary`` (``a op other``, or ``other op a`` if ``rev``)."""
    wrap = isinstance(other, _t.Tensor)
    if not wrap and _t._operand(other) is _t._NOPE:
        return NotImplemented
    cls = _BINARY.get(op)
    if cls is None:  # ufuncs (NumPy's or CuPy's, whose names may read "cupy_maximum")
        name = str(getattr(op, "__name__", None) or getattr(op, "name", ""))
        cls = _BINARY_BY_NAME.get(name.removeprefix("cupy_"), NotImplementedOp)
    return cls.apply(a, other, (op, mode, rev, wrap))


# --------------------------------------------------------------------------------------------
# Element-wise unary functions


class Neg(Function):
    """``-x``."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return -x

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return (-g,)


class Abs(Function):
    """``|x|``: d/dx = sign(x) (0 at 0, as torch)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        ctx.save_for_backward(x)
        return abs(x)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (x,) = ctx.saved_tensors
        return (g * _xp(x).sign(x),)


class Exp(Function):
    """``exp(x)``: d/dx = exp(x)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        xp = _xp(x)
        if xp is np:
            with _quiet():
                out = np.exp(x)
        else:
            out = xp.exp(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (out,) = ctx.saved_tensors
        return (g * out,)


class Log(Function):
    """``log(x)``: d/dx = 1/x."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        ctx.save_for_backward(x)
        xp = _xp(x)
        if xp is np:
            with _quiet():
                return np.log(x)
        return xp.log(x)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (x,) = ctx.saved_tensors
        return (g / x,)


class Sqrt(Function):
    """``sqrt(x)``: d/dx = 1 / (2 sqrt(x))."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        xp = _xp(x)
        if xp is np:
            with _quiet():
                out = np.sqrt(x)
        else:
            out = xp.sqrt(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (out,) = ctx.saved_tensors
        return (g / (2 * out),)


class Relu(Function):
    """``max(x, 0)``: d/dx = 1 where the output is positive, else 0."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        out = relu_forward(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (out,) = ctx.saved_tensors
        return (g * (out > 0),)


def relu_forward(x: Any) -> Any:
    """``max(x, 0)`` in ``x``'s dtype."""
    return _xp(x).maximum(x, x.dtype.type(0))


class Sigmoid(Function):
    """``1 / (1 + exp(-x))``: d/dx = out * (1 - out)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        out = sigmoid_forward(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (out,) = ctx.saved_tensors
        return (g * (out * (1 - out)),)


def sigmoid_forward(x: Any) -> Any:
    """The logistic function, computed as ``0.5 * tanh(x / 2) + 0.5`` (no overflow)."""
    xp = _xp(x)
    out = xp.tanh(x * x.dtype.type(0.5))
    out *= x.dtype.type(0.5)
    out += x.dtype.type(0.5)
    return out


class Tanh(Function):
    """``tanh(x)``: d/dx = 1 - out**2."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        out = _xp(x).tanh(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (out,) = ctx.saved_tensors
        return (g * (1 - out * out),)


class Clamp(Function):
    """``clamp(x, lo, hi)`` (output precomputed): the gradient passes where lo <= x <= hi."""

    @staticmethod
    def forward(ctx: Any, x: Any, out: Any, lo: Any, hi: Any) -> Any:
        ctx.meta = (x.shape, x.dtype)
        ctx.save_for_backward(x, lo, hi)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, lo, hi = ctx.saved_tensors
        keep = None
        if lo is not None:
            keep = x >= lo
        if hi is not None:
            keep = (x <= hi) if keep is None else keep & (x <= hi)
        return (_fit(g * keep, *ctx.meta),)


# --------------------------------------------------------------------------------------------
# Reductions


def _unreduce(g: Any, shape: tuple, axis: Any, keepdim: bool) -> Any:
    """Broadcast the gradient of a reduction back over the reduced axes (a read-only view)."""
    xp = _xp(g)
    if not keepdim and axis is not None and len(shape):
        g = xp.expand_dims(g, axis)
    return xp.broadcast_to(g, shape)


class Sum(Function):
    """``x.sum(dim, keepdim)``: the gradient is broadcast back."""

    @staticmethod
    def forward(ctx: Any, x: Any, axis: Any, keepdim: bool, dtype: Any) -> Any:
        ctx.meta = (x.shape, x.dtype, axis, keepdim)
        return x.sum(axis=axis, dtype=dtype, keepdims=keepdim)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, axis, keepdim = ctx.meta
        g = _unreduce(g, shape, axis, keepdim)
        return (g.astype(dtype) if g.dtype != dtype else g,)


class Mean(Function):
    """``x.mean(dim, keepdim)``: the gradient is broadcast back and divided by the count."""

    @staticmethod
    def forward(ctx: Any, x: Any, axis: Any, keepdim: bool, dtype: Any) -> Any:
        out = x.mean(axis=axis, dtype=dtype, keepdims=keepdim)
        ctx.meta = (x.shape, x.dtype, axis, keepdim, x.size // max(1, out.size))
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, axis, keepdim, count = ctx.meta
        g = _unreduce(g / count, shape, axis, keepdim)
        return (g.astype(dtype) if g.dtype != dtype else g,)


class MaxAll(Function):
    """``x.max()`` / ``x.min()`` (output precomputed): ties share the gradient evenly."""

    @staticmethod
    def forward(ctx: Any, x: Any, out: Any) -> Any:
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, out = ctx.saved_tensors
        mask = x == out
        return ((g / mask.sum()) * mask).astype(x.dtype, copy=False),


class MinAll(MaxAll):
    """``x.min()`` (see :class:`MaxAll`)."""


class MaxDim(Function):
    """``x.max(dim)`` values (precomputed with their indices): the gradient goes to the index."""

    @staticmethod
    def forward(ctx: Any, x: Any, values: Any, indices: Any, axis: int, keepdim: bool) -> Any:
        ctx.meta = (x.shape, x.dtype, axis, keepdim)
        ctx.save_for_backward(indices)
        return values

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, axis, keepdim = ctx.meta
        (idx,) = ctx.saved_tensors
        xp = _xp(g)
        if not keepdim:
            g = xp.expand_dims(g, axis)
            idx = xp.expand_dims(idx, axis)
        n = shape[axis]
        pos = xp.arange(n).reshape((n,) + (1,) * (len(shape) - axis - 1))
        onehot = pos == idx  # broadcasts to the input's shape
        gx = g * onehot
        return (gx.astype(dtype, copy=False),)


class MinDim(MaxDim):
    """``x.min(dim)`` values (see :class:`MaxDim`)."""


# --------------------------------------------------------------------------------------------
# Shapes and views (outputs precomputed by the Tensor methods)


class View(Function):
    """``view``/``reshape``/``flatten``/``squeeze``/``unsqueeze``: the gradient is reshaped."""

    @staticmethod
    def forward(ctx: Any, x: Any, out: Any) -> Any:
        ctx.shape = x.shape
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return (g.reshape(ctx.shape),)


class Reshape(View):
    """``reshape`` (see :class:`View`)."""


class Squeeze(View):
    """``squeeze`` (see :class:`View`)."""


class Unsqueeze(View):
    """``unsqueeze`` (see :class:`View`)."""


class Alias(View):
    """``+x``, ``x[...]`` of a 0-d tensor and other identity views."""


class Permute(Function):
    """``permute``/``transpose``/``t``/``T``/``mT``: the gradient is permuted back."""

    @staticmethod
    def forward(ctx: Any, x: Any, out: Any, axes: tuple) -> Any:
        ctx.inverse = tuple(int(i) for i in np.argsort(axes)) if axes else ()
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        inv = ctx.inverse
        return (g.transpose(inv) if inv else g,)


class Transpose(Permute):
    """``transpose(d0, d1)`` (see :class:`Permute`)."""


class Expand(Function):
    """``expand``: the gradient is summed over the broadcast dimensions."""

    @staticmethod
    def forward(ctx: Any, x: Any, out: Any) -> Any:
        ctx.shape = x.shape
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return (_sum_to(g, ctx.shape),)


class Repeat(Function):
    """``repeat`` (tiling): the gradient of each copy is summed."""

    @staticmethod
    def forward(ctx: Any, x: Any, out: Any, sizes: tuple) -> Any:
        ctx.meta = (x.shape, sizes)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, sizes = ctx.meta
        full = (1,) * (len(sizes) - len(shape)) + tuple(shape)
        inter = []
        for r, s in zip(sizes, full):
            inter += [r, s]
        g = g.reshape(inter).sum(axis=tuple(range(0, 2 * len(sizes), 2)))
        return (g.reshape(shape),)


class Clone(Function):
    """``clone``/``contiguous`` (a copy): the gradient passes unchanged."""

    @staticmethod
    def forward(ctx: Any, x: Any, out: Any) -> Any:
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return (g,)


class ToCopy(Function):
    """A dtype cast and/or device move (output precomputed): the gradient goes back."""

    @staticmethod
    def forward(ctx: Any, x: Any, out: Any) -> Any:
        ctx.dtype = x.dtype
        # NumPy to NumPy needs no move; anything else may cross devices (GPU to GPU too)
        both_host = isinstance(x, _ndarray) and isinstance(out, _ndarray)
        ctx.device = None if both_host else _backend.device_of(x)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        if ctx.device is not None:
            g = _t._move(g, ctx.device)
        return (g.astype(ctx.dtype) if g.dtype != ctx.dtype else g,)


# --------------------------------------------------------------------------------------------
# Indexing


def _has_int_index(key: Any) -> bool:
    """True when ``key`` holds an integer array or list (repeated indices must add up)."""
    for k in key if type(key) is tuple else (key,):
        if isinstance(k, list):
            if np.asarray(k).dtype.kind in "iu":
                return True
        elif hasattr(k, "shape") and not isinstance(k, _generic) and k.dtype.kind in "iu":
            return True
    return False


def _scatter_add(gx: Any, key: Any, g: Any) -> None:
    """``gx[key] += g`` with repeated indices adding up (``add.at``; older CuPy: cupyx)."""
    if isinstance(gx, _ndarray):
        np.add.at(gx, key, g)
        return
    add_at = getattr(_xp(gx).add, "at", None)
    if add_at is not None:
        add_at(gx, key, g)
        return
    cupyx = sys.modules.get("cupyx") or importlib.import_module("cupyx")
    cupyx.scatter_add(gx, key, g)


class Index(Function):
    """``x[key]`` (output precomputed): the gradient is written (or, for integer-array
    indices, scatter-added) into zeros shaped like ``x``."""

    @staticmethod
    def forward(ctx: Any, x: Any, out: Any, key: Any) -> Any:
        ctx.meta = (x.shape, x.dtype, key, _has_int_index(key))
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        shape, dtype, key, scatter = ctx.meta
        xp = _xp(g)
        gx = xp.zeros(shape, dtype=dtype)
        if scatter:
            _scatter_add(gx, key, g)
        else:
            gx[key] = g
        return (gx,)


class Select(Index):
    """``x[i]`` with an int (see :class:`Index`)."""


# --------------------------------------------------------------------------------------------
# Several tensors


class Cat(Function):
    """``cat(tensors, dim)`` (output precomputed): the gradient is split along ``dim``."""

    @staticmethod
    def forward(ctx: Any, dim: int, out: Any, *xs: Any) -> Any:
        ctx.meta = (dim, [x.shape[dim] for x in xs], [x.dtype for x in xs])
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        dim, sizes, dtypes = ctx.meta
        need = ctx.needs_input_grad
        pre = (slice(None),) * dim
        grads: list = [None, None]
        start = 0
        for i, (s, dt) in enumerate(zip(sizes, dtypes)):
            if need[i + 2]:
                gi = g[(*pre, slice(start, start + s))]
                grads.append(gi.astype(dt) if gi.dtype != dt else gi)
            else:
                grads.append(None)
            start += s
        return tuple(grads)


class Stack(Function):
    """``stack(tensors, dim)`` (output precomputed): each input gets its slice of the grad."""

    @staticmethod
    def forward(ctx: Any, dim: int, out: Any, *xs: Any) -> Any:
        ctx.meta = (dim, [x.dtype for x in xs])
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        dim, dtypes = ctx.meta
        need = ctx.needs_input_grad
        pre = (slice(None),) * dim
        grads: list = [None, None]
        for i, dt in enumerate(dtypes):
            if need[i + 2]:
                gi = g[(*pre, i)]
                grads.append(gi.astype(dt) if gi.dtype != dt else gi)
            else:
                grads.append(None)
        return tuple(grads)


class Where(Function):
    """``where(cond, a, b)`` (output precomputed): a gets the gradient where cond holds."""

    @staticmethod
    def forward(ctx: Any, cond: Any, a: Any, b: Any, out: Any) -> Any:
        ctx.metas = (_meta(a), _meta(b))
        ctx.save_for_backward(cond)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (cond,) = ctx.saved_tensors
        need = ctx.needs_input_grad
        xp = _xp(g)
        zero = g.dtype.type(0)
        ma, mb = ctx.metas
        ga = _fit(xp.where(cond, g, zero), *ma) if need[1] else None
        gb = _fit(xp.where(cond, zero, g), *mb) if need[2] else None
        return None, ga, gb, None
