"""The RMS normalisation layer with ``torch.nn``'s name: :class:`RMSNorm`.

Example:
    >>> import mpitensor as mt
    >>> RMSNorm(3)(mt.ones(2, 3)).shape
    mpitensor.Size([2, 3])
"""

from __future__ import annotations

from typing import Any, Optional

from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor, empty

from .. import functional as F  # noqa: N812 - torch's spelling
from .. import init
from .._functional.checks import is_int
from .module import Module
from ..parameter import Parameter

__all__ = ["RMSNorm"]


class RMSNorm(Module):
    """Root-mean-square normalisation over the trailing ``normalized_shape``, with a learned
    scale (``elementwise_affine``, starting at ones).

    Raises:
        TypeError: a malformed ``normalized_shape``.

    Example:
        >>> RMSNorm(8)
        RMSNorm((8,), eps=None, elementwise_affine=True)
    """

    def __init__(self, normalized_shape: Any, eps: Optional[float] = None,
                 elementwise_affine: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        shape = (normalized_shape,) if is_int(normalized_shape) else tuple(normalized_shape)
        if not all(is_int(s) and s >= 0 for s in shape):
            raise TypeError(f"RMSNorm: normalized_shape must be an int or ints, got "
                            f"{normalized_shape!r}")
        self.normalized_shape = tuple(int(s) for s in shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            dt = _dt.get_default_dtype() if dtype is None else _dt.to_dtype(dtype)
            self.weight = Parameter(empty(*self.normalized_shape, dtype=dt, device=device))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Set the scale to ones."""
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")
