"""Functions applied element by element (``exp``, ``log``, ``sqrt``, ``relu``, ``sigmoid``,
``tanh``, ``abs``, ``clamp``, unary ``-``, ``+`` and ``~``) and their gradients.

Each differentiable one is a :class:`~mpitensor.autograd.Function` whose forward holds the
op's rules (integers promoted to the default float dtype where torch promotes them, bools
refused where torch refuses them, NumPy's floating-point warnings silenced as torch computes
inf and nan silently) and whose backward follows it. The Tensor method runs the forward alone
when nothing needs recording (``opkit.run``). The in-place forms ``relu_`` and ``clamp_``
(``clip_``) are recorded through ``mpitensor.autograd.apply_inplace`` where needed.

Example:
    >>> import mpitensor as mt
    >>> x = mt.tensor([-1.0, 2.0], requires_grad=True)
    >>> x.relu().sum().backward()
    >>> x.grad
    tensor([0., 1.])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor import autograd as _autograd
from mpitensor import dtypes as _dt
from mpitensor._base.parallel import SPLIT_ELEMENTS, split_pass
from mpitensor._base.workspace import empty_like, flat_in_order, memory_order, relu_into
from mpitensor._core import autocast as _autocast
from mpitensor._core.devices import xp
from mpitensor._core.half import computes_in_float32
from mpitensor._core.opkit import NO_RECORD, run, run_view, tensor_methods, wrap
from mpitensor._core.promotion import result_type
from mpitensor._ops.operators import fit_grad
from mpitensor._ops.views import Alias
from mpitensor.autograd import ArrayFunction as Function, apply_inplace, bump_version, inplace_recorded, write_into
from mpitensor.tensor import Tensor

_grad_mode = _autograd._mode


def _floating(x: Any) -> Any:
    """``x``, or for integers and bools ``x`` in the default float dtype (as torch's ``exp``)."""
    return x.astype(_dt.get_default_dtype()) if x.dtype.kind in "biu" else x


def _quietly(fn: Any, x: Any) -> Any:
    """``fn(x)`` without NumPy's floating-point warnings (torch gives inf/nan silently)."""
    if isinstance(x, np.ndarray):
        with np.errstate(all="ignore"):
            return fn(x)
    return fn(x)


class Neg(Function):
    """``-x``."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        if x.dtype.kind == "b":
            raise TypeError(
                "Negation, the `-` operator, on a bool tensor is not supported. If you are "
                "trying to invert a mask, use the `~` operator instead."
            )
        return -x

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return (-g,)


class Abs(Function):
    """``|x|``: d/dx = sign(x), 0 at 0 (torch's choice)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        ctx.save_for_backward(x)
        return abs(x)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (x,) = ctx.saved_tensors
        return (g * xp(x).sign(x),)


class _OfOutput(Function):
    """Base of the functions of a float (integers promoted) whose gradient is a function of
    their output: ``array_fn`` names the NumPy/CuPy function, ``grad`` the gradient."""

    array_fn = ""

    @classmethod
    def forward(cls, ctx: Any, x: Any) -> Any:
        out = _quietly(getattr(xp(x), cls.array_fn), _floating(x))
        ctx.save_for_backward(out)
        return out

    @classmethod
    def backward(cls, ctx: Any, g: Any) -> tuple:
        (out,) = ctx.saved_tensors
        if out.dtype.kind == "c":  # holomorphic: g * conj(f'), torch's (conjugate Wirtinger)
            m = xp(g)
            return (m.conj(cls.grad(m.conj(g), out)),)
        return (cls.grad(g, out),)

    @staticmethod
    def grad(g: Any, out: Any) -> Any:
        raise NotImplementedError


class Exp(_OfOutput):
    """``exp(x)``: d/dx = exp(x), the output itself."""

    array_fn = "exp"

    @staticmethod
    def grad(g: Any, out: Any) -> Any:
        return g * out


class Sqrt(_OfOutput):
    """``sqrt(x)``: d/dx = 1 / (2 sqrt(x))."""

    array_fn = "sqrt"

    @staticmethod
    def grad(g: Any, out: Any) -> Any:
        return g / (2 * out)


@computes_in_float32
class Tanh(_OfOutput):
    """``tanh(x)``: d/dx = 1 - tanh(x)**2."""

    array_fn = "tanh"

    @staticmethod
    def grad(g: Any, out: Any) -> Any:
        return g * (1 - out * out)


class Log(Function):
    """``log(x)``: d/dx = 1/x."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        x = _floating(x)
        ctx.save_for_backward(x)
        return _quietly(xp(x).log, x)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (x,) = ctx.saved_tensors
        return (g / (xp(x).conj(x) if x.dtype.kind == "c" else x),)


@computes_in_float32  # half inputs: one rounding, not one per step of the formula, as torch
class Sigmoid(Function):
    """``1 / (1 + exp(-x))``: d/dx = out * (1 - out)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        x = _floating(x)
        # the definition, in place; exp(-x) overflows to inf only where the result is below
        # the smallest normal number (x < -88.7 in float32), and 1 / inf is the 0 it rounds to.
        # (0.5 * tanh(x / 2) + 0.5 lost the lower tail: 0 at x = -40, not 4.2e-18)
        m = xp(x)
        out = m.negative(x, out=m.empty_like(x))  # an array even for 0-d x
        with np.errstate(over="ignore"):
            m.exp(out, out=out)
        out += 1
        m.reciprocal(out, out=out)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (out,) = ctx.saved_tensors
        d = out * (1 - out)
        return (g * (xp(d).conj(d) if d.dtype.kind == "c" else d),)


_SMALL = 1 << 12  # elements: below, NumPy's scalar maximum beats preparing a zero array


def _no_bool_relu(x: Any) -> None:
    if x.dtype.kind == "b":
        raise TypeError("relu() is not implemented for bool tensors; convert first, "
                        "e.g. t.float()")


class Relu(Function):
    """``max(x, 0)`` (in ``x``'s memory layout): the gradient passes where the output is
    positive. ``forward_`` is ``relu_``: it rectifies ``x`` itself."""

    @staticmethod
    def forward_(ctx: Any, x: Any) -> Any:
        _no_bool_relu(x)
        relu_into(x, x)
        ctx.save_for_backward(x)  # the output: its sign is all backward needs
        return x

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        _no_bool_relu(x)
        if x.size < _SMALL:
            out = xp(x).maximum(x, x.dtype.type(0))
        else:
            out = relu_into(x, empty_like(x))  # x's memory layout, in a recycled buffer
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (out,) = ctx.saved_tensors
        m = xp(out)
        res = empty_like(out)  # out's memory layout (batch-innermost after nn's conv2d)
        if g.strides != out.strides:  # mixed layouts iterate slowly: bring g over first
            m.copyto(res, g)
            g = res
        flat = (flat_in_order(memory_order(out), g, out, res)
                if m is np and out.size >= SPLIT_ELEMENTS else None)
        if flat is not None:
            gf, of, rf = flat
            split_pass(lambda s: np.multiply(gf[s[0]:s[1]], of[s[0]:s[1]] > 0,
                                             out=rf[s[0]:s[1]]), out.size, out.size)
            return (res,)
        m.multiply(g, out > 0, out=res)
        return (res,)


class Clamp(Function):
    """``x`` limited to ``[lo, hi]`` (either may be None; arrays broadcast): the gradient
    passes where ``lo <= x <= hi``. The bounds get none."""

    @staticmethod
    def forward(ctx: Any, x: Any, lo: Any, hi: Any) -> Any:
        if lo is None and hi is None:
            raise ValueError("clamp() needs at least one of min or max")
        m = xp(x)
        out = x
        if lo is not None:
            out = m.maximum(out, lo)
        if hi is not None:
            out = m.minimum(out, hi)
        rt = result_type(*(v for v in (x, lo, hi) if v is not None))
        ctx.meta = (x.shape, x.dtype)
        ctx.save_for_backward(x, lo, hi)
        return out if out.dtype == rt else out.astype(rt)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, lo, hi = ctx.saved_tensors
        keep = None
        if lo is not None:
            keep = x >= lo
        if hi is not None:
            keep = (x <= hi) if keep is None else keep & (x <= hi)
        return fit_grad(g * keep, *ctx.meta), None, None


@tensor_methods
class _ElementwiseMethods:
    def __neg__(self) -> Tensor:
        return run(Neg, self)

    neg = __neg__
    negative = __neg__

    def __pos__(self) -> Tensor:
        return run_view(Alias, self)

    def __abs__(self) -> Tensor:
        return run(Abs, self)

    def __invert__(self) -> Tensor:
        x = self._data
        if x.dtype.kind not in "biu":
            raise TypeError(
                f"~ (bitwise not) needs an integer or bool tensor, got {_dt.dt_repr(x.dtype)}"
            )
        return wrap(~x)

    def abs(self) -> Tensor:
        """Return the element-wise absolute value."""
        return run(Abs, self)

    def sqrt(self) -> Tensor:
        """Return the element-wise square root (integers are promoted to the default dtype)."""
        return run(Sqrt, self)

    def exp(self) -> Tensor:
        """Return the element-wise exponential."""
        if _autocast.ON and _autocast.active():
            return _autocast.run("exp", Tensor.exp, self)
        return run(Exp, self)

    def log(self) -> Tensor:
        """Return the element-wise natural logarithm."""
        if _autocast.ON and _autocast.active():
            return _autocast.run("log", Tensor.log, self)
        return run(Log, self)

    def relu(self) -> Tensor:
        """Return ``max(self, 0)`` element-wise.

        Example:
            >>> import mpitensor as mt
            >>> mt.tensor([-1.0, 2.0]).relu()
            tensor([0., 2.])
        """
        return run(Relu, self)

    def relu_(self) -> Tensor:
        """Replace every element by ``max(element, 0)``; returns self.

        Raises:
            RuntimeError: self is a leaf that requires grad (outside ``no_grad()``).

        Example:
            >>> import mpitensor as mt
            >>> t = mt.tensor([-1.0, 2.0]); _ = t.relu_(); t
            tensor([0., 2.])
        """
        if _grad_mode.enabled and inplace_recorded(self, "relu_()"):
            return apply_inplace(Relu, "relu_()", self)
        Relu.forward_(NO_RECORD, self._data)
        bump_version(self)
        return self

    def sigmoid(self) -> Tensor:
        """Return the logistic function ``1 / (1 + exp(-self))`` element-wise."""
        return run(Sigmoid, self)

    def tanh(self) -> Tensor:
        """Return the hyperbolic tangent element-wise."""
        return run(Tanh, self)

    def clamp(self, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 - torch names
        """Return the elements limited to ``[min, max]`` (either bound may be None).

        Raises:
            ValueError: both bounds are None.
        """
        lo = min._data if isinstance(min, Tensor) else min
        hi = max._data if isinstance(max, Tensor) else max
        return run(Clamp, self, lo, hi)

    clip = clamp

    def clamp_(self, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 - torch names
        """Limit the elements to ``[min, max]`` in place (either bound may be None); returns self.

        Raises:
            ValueError: both bounds are None.
            TypeError: the result's dtype cannot be written into self (a float bound on an
                integer tensor).
            RuntimeError: self is a leaf that requires grad (outside ``no_grad()``).
        """
        lo = min._data if isinstance(min, Tensor) else min
        hi = max._data if isinstance(max, Tensor) else max
        if _grad_mode.enabled and inplace_recorded(self, "clamp_()"):
            return apply_inplace(Clamp, "clamp_()", self, lo, hi)
        x = self._data
        write_into(x, Clamp.forward(NO_RECORD, x, lo, hi), "clamp_()")
        bump_version(self)
        return self

    clip_ = clamp_
