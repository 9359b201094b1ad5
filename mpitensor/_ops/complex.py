"""Complex tensors: the real and imaginary parts (views), the conjugate, the argument
(``angle``), the conjugate transposes ``mH``, ``H`` and ``adjoint``, with their gradients;
``view_as_real`` / ``view_as_complex`` (views sharing memory with their input, as torch's),
``complex(real, imag)`` and ``polar(abs, angle)``.

Conjugation and negation are never lazy here: ``conj()`` computes (a copy), ``is_conj()`` is
False and ``resolve_conj()`` returns the tensor itself.

Example:
    >>> import mpitensor as mt
    >>> z = mt.tensor([1 + 2j])
    >>> z.conj().imag
    tensor([-2.])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpitensor._core.devices import xp
from mpitensor._core.opkit import (
    Function,
    Tensor,
    run,
    run_inplace,
    run_view,
    serve,
    tensor_methods,
)
from mpitensor._ops.create import BadValueError, UnsupportedDtypeError
from mpitensor._ops.math import UnaryOp

__all__ = ["view_as_real", "view_as_complex", "complex", "polar"]

# the complex dtype whose two halves are each real dtype, and back
_COMPLEX_OF = {np.dtype(np.float32): np.dtype(np.complex64),
               np.dtype(np.float64): np.dtype(np.complex128)}


class Angle(UnaryOp):
    """The argument of complex numbers; for real ones 0, or pi for negative numbers (NaN
    stays NaN): the gradient of a real input is zero, as in torch; of a complex one
    ``i x / |x|^2`` (0 at 0)."""

    ints = "float"
    keeps = "x"
    name_ = "angle"

    @staticmethod
    def compute(m: Any, x: Any) -> Any:
        if x.dtype.kind == "c":
            return m.angle(x)
        out = m.where(x < 0, x.dtype.type(math.pi), x.dtype.type(0))
        return m.where(m.isnan(x), x, out)

    @classmethod
    def backward(cls, ctx: Any, g: Any) -> tuple:
        x, _ = ctx.saved_tensors  # (UnaryOp's would cast a complex input's gradient to g's dtype)
        with np.errstate(all="ignore"):
            return (cls.grad(xp(g), g, x, None),)

    @staticmethod
    def grad(m: Any, g: Any, x: Any, out: Any) -> Any:
        if x.dtype.kind != "c":
            return m.zeros_like(g)
        # angle = atan2(im, re): d/dre = -im / |x|^2, d/dim = re / |x|^2, i.e. i x / |x|^2
        a2 = (x * x.conj()).real
        return m.where(a2 == 0, 0, g * (1j * x) / m.where(a2 == 0, 1, a2)).astype(x.dtype)


class RealPart(Function):
    """``x.real`` (``imag`` False) or ``x.imag`` of a complex tensor: a view; the gradient
    comes back as the real (imaginary) part of a complex gradient."""

    @staticmethod
    def forward(ctx: Any, x: Any, imag: bool) -> Any:
        ctx.meta = (imag, x.dtype)
        return x.imag if imag else x.real

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        imag, dtype = ctx.meta
        return (g * 1j if imag else g).astype(dtype), None


class Conj(Function):
    """The complex conjugate (a copy): the gradient is conjugated back."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return xp(x).conj(x)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return (xp(g).conj(g),)


@tensor_methods
class _ComplexMethods:
    def conj(self) -> Tensor:
        """Return the complex conjugate (self itself for real tensors, as torch)."""
        return run(Conj, self) if self._data.dtype.kind == "c" else self

    def conj_physical_(self) -> Tensor:
        """Conjugate in place (nothing to do for real tensors); returns self."""
        if self._data.dtype.kind == "c":
            return run_inplace(self, Conj, "conj_physical_()")
        return self

    def angle(self) -> Tensor:
        """Return the argument of each element (0 or pi for real tensors)."""
        return run(Angle, self)

    @property
    def real(self) -> Tensor:
        """The real part: self for real tensors, a view for complex ones."""
        if self._data.dtype.kind != "c":
            return self
        return run_view(RealPart, self, False)

    @property
    def imag(self) -> Tensor:
        """The imaginary part of a complex tensor, as a view.

        Raises:
            TypeError: a real tensor (it has none).
        """
        if self._data.dtype.kind != "c":
            raise TypeError("imag is not implemented for tensors with non-complex dtypes")
        return run_view(RealPart, self, True)

    def conj_physical(self) -> Tensor:
        """Return the complex conjugate as a new tensor (a copy for real ones too)."""
        return run(Conj, self) if self._data.dtype.kind == "c" else self.clone()

    def resolve_conj(self) -> Tensor:
        """Return self (conjugation is never lazy here)."""
        return self

    def resolve_neg(self) -> Tensor:
        """Return self (negation is never lazy here)."""
        return self

    def is_conj(self) -> bool:
        """False: conjugation is never lazy here."""
        return False

    def is_neg(self) -> bool:
        """False: negation is never lazy here."""
        return False

    @property
    def mH(self) -> Tensor:  # noqa: N802 - torch's name
        """The conjugate transpose of the last two dimensions."""
        return self.mT.conj()

    @property
    def H(self) -> Tensor:  # noqa: N802 - torch's name
        """The conjugate transpose of a matrix (at most 2 dimensions)."""
        return self.t().conj()

    def adjoint(self) -> Tensor:
        """Return the conjugate transpose of the last two dimensions (``mH``)."""
        return self.mT.conj()


# --------------------------------------------------------------------------------------------
# Complex numbers as pairs of reals: views both ways


def _byte_offset(a: Any) -> int:
    """How many bytes into its allocation ``a`` starts (its own address where it owns it)."""
    if isinstance(a, np.ndarray):
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        return a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return int(a.data.ptr - a.data.mem.ptr)  # CuPy: the pointer within its memory block


class ViewAsReal(Function):
    """A complex array as reals: a new last dimension of size 2 (real, imaginary), sharing
    memory; the gradient (real pairs) comes back as complex numbers."""

    @staticmethod
    def forward(ctx: Any, z: Any) -> Any:
        # a trailing axis of one complex element, read as two reals: a view for any strides
        return z[..., None].view(z.real.dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        out = xp(g).empty(g.shape[:-1], _COMPLEX_OF[np.dtype(g.dtype)])
        out.real, out.imag = g[..., 0], g[..., 1]
        return (out,)


class ViewAsComplex(Function):
    """Pairs of reals (a last dimension of size 2, stride 1) as complex numbers, sharing
    memory; the gradient comes back as its (real, imaginary) pairs."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return x.view(_COMPLEX_OF[np.dtype(x.dtype)])[..., 0]

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return (xp(g).stack([g.real, g.imag], axis=-1),)


def view_as_real(input: Tensor) -> Tensor:  # noqa: A002 - torch's argument name
    """Return a complex tensor as a real view with a last dimension of size 2 (real part,
    imaginary part): writes through either show in the other.

    Raises:
        TypeError: a tensor that is not complex.

    Example:
        >>> import mpitensor as mt
        >>> mt.view_as_real(mt.tensor([1 + 2j]))
        tensor([[1., 2.]], dtype=torch.float64)
    """
    if input._data.dtype.kind != "c":
        raise TypeError(f"view_as_real takes a complex tensor, got {input.dtype}; for a real "
                        f"tensor use torch.stack([x, torch.zeros_like(x)], -1)")
    return run_view(ViewAsReal, input)


def view_as_complex(input: Tensor) -> Tensor:  # noqa: A002 - torch's argument name
    """Return a float32/float64 tensor whose last dimension holds (real, imaginary) pairs as a
    complex64/complex128 view without that dimension, sharing memory.

    Raises:
        TypeError: a dtype other than float32 or float64.
        ValueError (also a RuntimeError): the last dimension is not of size 2 with stride 1,
            another stride is odd, or the tensor starts at an odd element of its storage.

    Example:
        >>> import mpitensor as mt
        >>> mt.view_as_complex(mt.tensor([[1.0, 2.0]]))
        tensor([1.+2.j])
    """
    a = input._data
    if np.dtype(a.dtype) not in _COMPLEX_OF:
        raise UnsupportedDtypeError(
            f"view_as_complex takes a float32 or float64 tensor, got {input.dtype}; convert "
            f"it first, e.g. x.float()")
    size = a.itemsize
    why = None
    if a.ndim == 0 or a.shape[-1] != 2:
        why = f"its last dimension must be of size 2, but its shape is {list(a.shape)}"
    elif a.strides[-1] != size:
        why = f"its last dimension must have stride 1, not {a.strides[-1] // size}"
    elif any(st % (2 * size) for st in a.strides[:-1]):
        why = f"every other stride must be even, but they are {[st // size for st in a.strides]}"
    elif _byte_offset(a) % (2 * size):
        why = "it must start at an even element of its storage"
    if why is not None:
        raise BadValueError(f"view_as_complex: {why}; pass x.contiguous() (a copy) or "
                            f"reshape the pairs into the last dimension")
    return run_view(ViewAsComplex, input)


def _two_floats(what: str, a: Tensor, b: Tensor) -> None:
    if a.dtype != b.dtype or np.dtype(a._data.dtype) not in _COMPLEX_OF:
        raise UnsupportedDtypeError(
            f"{what} takes two float32 or two float64 tensors, got {a.dtype} and {b.dtype}")


def complex(real: Tensor, imag: Tensor) -> Tensor:  # noqa: A001 - torch's name
    """Return the complex tensor ``real + i imag`` (float32 -> complex64, float64 ->
    complex128; the two broadcast), differentiable in both.

    Raises:
        TypeError: the two differ in dtype, or are neither float32 nor float64.

    Example:
        >>> import mpitensor as mt
        >>> mt.complex(mt.tensor([1.0]), mt.tensor([2.0]))
        tensor([1.+2.j])
    """
    _two_floats("complex", real, imag)
    from mpitensor._ops.combine import stack

    re, im = (real, imag) if real.shape == imag.shape else _broadcast(real, imag)
    return view_as_complex(stack([re, im], -1))


def _broadcast(a: Tensor, b: Tensor) -> tuple:
    shape = tuple(xp(a._data).broadcast_shapes(tuple(a.shape), tuple(b.shape)))
    return a.expand(shape), b.expand(shape)


def polar(abs: Tensor, angle: Tensor) -> Tensor:  # noqa: A002 - torch's argument names
    """Return the complex tensor with absolute value ``abs`` and argument ``angle``:
    ``abs * (cos(angle) + i sin(angle))``, differentiable in both; dtypes, broadcasting and
    the ``TypeError`` as :func:`complex`. Example: ``mt.polar(mt.tensor([2.0]),
    mt.tensor([0.0]))`` is ``tensor([2.+0.j])``.
    """
    _two_floats("polar", abs, angle)
    return complex(abs * angle.cos(), abs * angle.sin())


serve({name: globals()[name] for name in __all__})
