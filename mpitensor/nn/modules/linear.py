"""The bilinear layer with ``torch.nn``'s name: :class:`Bilinear` (``Linear`` and
``Identity`` live in :mod:`.layers`).

Example:
    >>> import mpitensor as mt
    >>> Bilinear(2, 3, 4)(mt.ones(5, 2), mt.ones(5, 3)).shape
    mpitensor.Size([5, 4])
"""

from __future__ import annotations

import math
from typing import Any

from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor, empty

from .. import functional as F  # noqa: N812 - torch's spelling
from .. import init
from .._functional.checks import is_int
from .module import Module
from ..parameter import Parameter

__all__ = ["Bilinear"]


class Bilinear(Module):
    """``y = x1ᵀ A x2 + b`` with ``A`` of shape (out_features, in1_features, in2_features).

    Parameters start uniform in ``±1/sqrt(in1_features)``, as in torch.

    Raises:
        ValueError: a non-positive or non-integer feature count.

    Example:
        >>> Bilinear(2, 3, 4)
        Bilinear(in1_features=2, in2_features=3, out_features=4, bias=True)
    """

    def __init__(self, in1_features: int, in2_features: int, out_features: int,
                 bias: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        for name, v in (("in1_features", in1_features), ("in2_features", in2_features),
                        ("out_features", out_features)):
            if not is_int(v) or v <= 0:
                raise ValueError(f"Bilinear: {name} must be a positive integer, got {v!r}")
        self.in1_features, self.in2_features = int(in1_features), int(in2_features)
        self.out_features = int(out_features)
        dt = _dt.get_default_dtype() if dtype is None else _dt.to_dtype(dtype)
        self.weight = Parameter(empty(self.out_features, self.in1_features, self.in2_features,
                                      dtype=dt, device=device))
        if bias:
            self.bias = Parameter(empty(self.out_features, dtype=dt, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw weight and bias uniformly in ``±1/sqrt(in1_features)``."""
        bound = 1 / math.sqrt(self.weight.shape[1])
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1: Tensor, input2: Tensor) -> Tensor:
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")
