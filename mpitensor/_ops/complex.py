"""Complex tensors: the real and imaginary parts (views), the conjugate, the argument
(``angle``), the conjugate transposes ``mH``, ``H`` and ``adjoint``, with their gradients.

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

from mpitensor._core.devices import xp
from mpitensor._core.opkit import Function, Tensor, run, run_inplace, run_view, tensor_methods
from mpitensor._ops.math import UnaryOp, zero_gradient


class Angle(UnaryOp):
    """The argument of complex numbers; for real ones 0, or pi for negative numbers (NaN
    stays NaN): the gradient of a real input is zero, as in torch."""

    ints = "float"
    name_ = "angle"

    @staticmethod
    def compute(m: Any, x: Any) -> Any:
        if x.dtype.kind == "c":
            return m.angle(x)
        out = m.where(x < 0, x.dtype.type(math.pi), x.dtype.type(0))
        return m.where(m.isnan(x), x, out)

    grad = staticmethod(zero_gradient)


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
